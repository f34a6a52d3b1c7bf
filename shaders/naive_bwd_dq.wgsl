// Standard attention backward, step 6: dQ = scale * dS K. One thread per dQ element.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items; the generated entry point calls it once per item (64 per workgroup).
fn item(e: u32) {
    let d = e % HEAD_DIM;
    let row = e / HEAD_DIM;
    let at = slice_row(row);
    let hk = at.h / params.group;
    let sb = row * params.seq_kv;
    var acc = 0.0;
    for (var j = 0u; j < params.seq_kv; j++) {
        acc = add_weighted(acc, ds[sb + j], load_k(k_at(at.b, j, hk, d)), true);
    }
    store_dq(q_index(at.b, at.i, at.h, d), acc * params.scale);
}
