// Standard attention, step 1: S = Q K^T for the (batch, head) slices of one chunk, written to
// global memory. One thread per score; no workgroup-memory tiling (that is the point of the
// baseline). Scale and mask are applied by the softmax step, as an unfused pipeline does.
// Grid: ceil(slice_count * seq_q * seq_kv / 64) workgroups, folded.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items; the generated entry point calls it once per item (64 per workgroup).
fn item(e: u32) {
    let jcol = e % params.seq_kv;
    let row = e / params.seq_kv;
    let at = slice_row(row);
    let qb = q_at(at.b, at.i, at.h, 0u);
    let kb = k_at(at.b, jcol, at.h / params.group, 0u);
    var acc = 0.0;
    for (var d = 0u; d < HEAD_DIM; d++) {
        acc = fma(load_q(qb + d), load_k(kb + d), acc);
    }
    scores[e] = acc;
}
