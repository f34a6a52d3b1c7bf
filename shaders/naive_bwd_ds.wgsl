// Standard attention backward, step 3: dS = P * (dP - delta), written over dP (times
// d(score)/dx where a score transform such as the softcap is on, at the raw score x, which
// this recomputes: the naive path keeps P alone); P * (dP - delta) itself is kept for d_bias
// or d_table where the call asks for them (with, for d_table, the score score_mod took).
// One thread per element.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items; the generated entry point calls it once per item (64 per workgroup).
fn item(e: u32) {
    let row = e / params.seq_kv;
    let at = slice_row(row);
    begin_head(at.b, at.h);
    let pair = lse_delta[pair_index(at.b, at.h, at.i)];
    let p = probs[e];
    let j = e % params.seq_kv;
    let g = finished_grad(p, ds[e] * dropout_scale(at.i, j), pair.y);
    var slope = 1.0;
    var pre = 0.0;
    if (SCORE_TRANSFORMED() && p != 0.0) {
        let qb = q_at(at.b, at.i, at.h, 0u);
        let kb = k_at(at.b, j, at.h / params.group, 0u);
        // as naive_bwd_probs, so that x is the score it finished
        var x = 0.0;
        for (var d = 0u; d < HEAD_DIM; d++) {
            x = fma(load_q(qb + d), load_k(kb + d), x);
        }
        let f = score_chain_slope(x * params.scale_log2, at.i, j);
        slope = f.slope;
        pre = f.pre;
    }
    keep_grad(at.i, j, g, pre);
    ds[e] = through_score(g, p, slope);
}
