// Standard attention backward, step 1: P = exp(scale * Q K^T - lse), masked, materialized in
// global memory for the chunk's slices. One thread per element.

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> lse: array<f32>;
@group(0) @binding(4) var<storage, read_write> probs: array<f32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let e = linear_workgroup(wid, nwg) * 64u + t;
    if (e >= params.total_items) {
        return;
    }
    let jcol = e % params.seq_kv;
    let row = e / params.seq_kv;
    let at = slice_row(row);
    var p = 0.0;
    if (visible(at.i, jcol)) {
        let qb = q_index(at.b, at.i, at.h, 0u);
        let kb = kv_index(at.b, jcol, at.h / params.group, 0u);
        var s = 0.0;
        for (var d = 0u; d < HEAD_DIM; d++) {
            s = fma(q[qb + d], k[kb + d], s);
        }
        p = exp2(s * params.scale_log2 - lse_to_log2(lse[row_index(at.b, at.h, at.i)]));
    }
    probs[e] = p;
}
