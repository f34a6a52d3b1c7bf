// Backward, a trainable captured tensor's gradient, finished: entry e of d_table is the sum of
// its params.splits parts (flash_bwd_table.wgsl) in order. One invocation per entry.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

fn item(e: u32) {
    var acc = 0.0;
    for (var part = 0u; part < params.splits; part++) {
        acc += parts[part * params.total_items + e];
    }
    d_table[e] = acc;
}
