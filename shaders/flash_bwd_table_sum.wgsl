// Backward, a trainable captured tensor's gradient, finished: entry e of d_table is the sum of
// its params.splits parts in order, from word params.slice_base of `parts` (the parts of
// flash_bwd_table.wgsl, or those the dQ kernels' table_flush left after the kept pairs' words).
// One invocation per entry.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

fn item(e: u32) {
    var acc = 0.0;
    for (var part = 0u; part < params.splits; part++) {
        acc += parts[params.slice_base + part * params.total_items + e];
    }
    d_table[e] = acc;
}
