// Standard attention backward, step 2: dP = dO V^T, materialized. One thread per element.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items; the generated entry point calls it once per item (64 per workgroup).
fn item(e: u32) {
    let jcol = e % params.seq_kv;
    let row = e / params.seq_kv;
    let at = slice_row(row);
    let ob = dout_at(at.b, at.i, at.h, 0u);
    let vb = v_at(at.b, jcol, at.h / params.group, 0u);
    var acc = 0.0;
    for (var d = 0u; d < HEAD_DIM_V; d++) {
        acc = fma(load_d_out(ob + d), load_v(vb + d), acc);
    }
    dp[e] = acc;
}
