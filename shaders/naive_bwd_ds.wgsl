// Standard attention backward, step 3: dS = P * (dP - delta), written over dP (times the
// softcap's slope, at the score P gives back: s = log2(P) + lse2, less ALiBi's term and the
// bias); P * (dP - delta) itself is kept for d_bias where the call asks for it.
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
    keep_bias_grad(at.i, j, g);
    ds[e] = through_softcap(g, p, log2(p) + pair.x, at.i, j);
}
