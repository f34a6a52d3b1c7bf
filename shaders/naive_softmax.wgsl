// Standard attention, step 2: P = softmax(scale * S) per row, with the mask, into a second
// global buffer; also writes the row's lse. One workgroup of 64 threads per row: the threads
// stride over the row and reduce max and sum in workgroup memory.
// Grid: slice_count * seq_q workgroups, folded.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

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
    begin_head(at.b, at.h);
    let base = row * params.seq_kv;

    var m = running_max_start();
    for (var j = t; j < params.seq_kv; j += 64u) {
        m = max(m, finish_score(scores[base + j] * params.scale_log2, at.i, j, true));
    }
    m = reduce(t, m, true);
    var l = 0.0;
    for (var j = t; j < params.seq_kv; j += 64u) {
        l += softmax_weight(finish_score(scores[base + j] * params.scale_log2, at.i, j, true), m);
    }
    l = reduce(t, l, false);
    let inv_l = row_normalizer(m, l);
    for (var j = t; j < params.seq_kv; j += 64u) {
        let s = finish_score(scores[base + j] * params.scale_log2, at.i, j, true);
        probs[base + j] = softmax_weight(s, m) * inv_l * dropout_scale(at.i, j);
    }
    if (t == 0u) {
        lse[row_index(at.b, at.h, at.i)] = finish_lse(m, l);
    }
}
