// Standard attention, step 3: O = P V. One thread per output element.
// Grid: ceil(slice_count * seq_q * head_dim_v / 64) workgroups, folded.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items; the generated entry point calls it once per item (64 per workgroup).
fn item(e: u32) {
    let d = e % HEAD_DIM_V;
    let row = e / HEAD_DIM_V;
    let at = slice_row(row);
    let hk = at.h / params.group;
    let pb = row * params.seq_kv;
    var acc = 0.0;
    for (var j = 0u; j < params.seq_kv; j++) {
        acc = add_weighted(acc, probs[pb + j], load_v(v_at(at.b, j, hk, d)), true);
    }
    store_out(o_index(at.b, at.i, at.h, d), acc);
}
