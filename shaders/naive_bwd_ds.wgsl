// Standard attention backward, step 3: dS = P * (dP - delta), written over dP.
// One thread per element.

@group(0) @binding(1) var<storage, read> probs: array<f32>;
@group(0) @binding(2) var<storage, read> delta: array<f32>;
@group(0) @binding(3) var<storage, read_write> ds: array<f32>;

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
    let row = e / params.seq_kv;
    let at = slice_row(row);
    ds[e] = probs[e] * (ds[e] - delta[row_index(at.b, at.h, at.i)]);
}
