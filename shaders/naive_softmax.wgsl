// Standard attention, step 2: P = softmax(scale * S) per row, with the mask, into a second
// global buffer; also writes the row's lse. One workgroup of 64 threads per row: the threads
// stride over the row and reduce max and sum in workgroup memory.
// Grid: slice_count * seq_q workgroups, folded.

@group(0) @binding(1) var<storage, read> scores: array<f32>;
@group(0) @binding(2) var<storage, read_write> probs: array<f32>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;

var<workgroup> red: array<f32, 64>;

fn reduce(t: u32, x: f32, is_max: bool) -> f32 {
    red[t] = x;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w >>= 1u) {
        if (t < w) {
            red[t] = select(red[t] + red[t + w], max(red[t], red[t + w]), is_max);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let row = linear_workgroup(wid, nwg);
    if (row >= params.total_wg) {
        return;
    }
    let at = slice_row(row);
    let base = row * params.seq_kv;

    var m = NEG_SENTINEL;
    for (var j = t; j < params.seq_kv; j += 64u) {
        if (visible(at.i, j)) {
            m = max(m, scores[base + j] * params.scale_log2);
        }
    }
    m = reduce(t, m, true);
    var l = 0.0;
    for (var j = t; j < params.seq_kv; j += 64u) {
        if (visible(at.i, j)) {
            l += exp2(scores[base + j] * params.scale_log2 - m);
        }
    }
    l = reduce(t, l, false);
    let inv_l = select(0.0, 1.0 / l, l > 0.0);
    for (var j = t; j < params.seq_kv; j += 64u) {
        var p = 0.0;
        if (visible(at.i, j)) {
            p = exp2(scores[base + j] * params.scale_log2 - m) * inv_l;
        }
        probs[base + j] = p;
    }
    if (t == 0u) {
        lse[row_index(at.b, at.h, at.i)] = finish_lse(m, l);
    }
}
