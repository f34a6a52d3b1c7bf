// Decode, the splits merged: element e of out (and, once per row, its lse) from the splits'
// partial results (flash_decode.wgsl), folded in split order by merge_fold, exactly; then the
// sink joins as one more part (lse = sink, out 0). A row no split lets see a key gets out 0 and
// lse -inf (or the sink's lse).
// Grid: ceil(total_items / 64) workgroups, folded; one invocation per element of out (of this
// dispatch's batches: a window of whole batches binds out and lse from their shifts). Its
// HEAD_DIM is out's row (the values' head dim: src/plan/decode.rs).
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

fn item(e: u32) {
    let d = e % HEAD_DIM;
    let row = e / HEAD_DIM;
    let h = row % params.heads_q;
    let bi = row / params.heads_q;
    let b = bi / params.seq_q;
    let i = bi % params.seq_q;
    let r = row_index(b, h, i);
    let rows = params.batch * params.heads_q * params.seq_q;
    var m = Merged(neg_inf(), 0.0);
    for (var s = 0u; s < params.splits; s++) {
        let ps = part_lse[s * rows + r - params.row_shift];
        m = merge_fold(m.lse, m.x, ps, part_out[s * params.total_items + e]);
    }
    if (SINKS()) {
        begin_head(b, h);
        m = merge_fold(m.lse, m.x, head_sink2 * LN2, 0.0);
    }
    store_out(e + params.q_shift, m.x);
    if (d == 0u) {
        lse[r] = m.lse;
    }
}
