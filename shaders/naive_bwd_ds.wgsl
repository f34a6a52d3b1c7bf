// Standard attention backward, step 3: dS = P * (dP - delta), written over dP.
// One thread per element.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items; the generated entry point calls it once per item (64 per workgroup).
fn item(e: u32) {
    let row = e / params.seq_kv;
    let at = slice_row(row);
    ds[e] = score_grad(probs[e], ds[e], delta[row_index(at.b, at.h, at.i)]);
}
