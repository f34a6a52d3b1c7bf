// Standard attention backward, step 1: P = exp(scale * Q K^T - lse), masked, materialized in
// global memory for the chunk's slices. One thread per element.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items; the generated entry point calls it once per item (64 per workgroup).
fn item(e: u32) {
    let jcol = e % params.seq_kv;
    let row = e / params.seq_kv;
    let at = slice_row(row);
    begin_head(at.b, at.h);
    var p = 0.0;
    // the naive baseline skips the dot product of hidden pairs, as an unfused pipeline would
    if (visible(at.i, jcol)) {
        let qb = q_at(at.b, at.i, at.h, 0u);
        let kb = k_at(at.b, jcol, at.h / params.group, 0u);
        var s = 0.0;
        for (var d = 0u; d < HEAD_DIM; d++) {
            s = fma(load_q(qb + d), load_k(kb + d), s);
        }
        let sc = finish_score(s * params.scale_log2, at.i, jcol, false);
        p = recompute_p(sc, lse_to_log2(lse[row_index(at.b, at.h, at.i)]));
    }
    probs[e] = p;
}
