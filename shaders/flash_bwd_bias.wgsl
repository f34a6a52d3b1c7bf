// Backward, the bias's gradient: entry e of d_bias (the bias's own shape) is the sum, over the
// (batch, query head) slices the entry reaches (its own, or every batch and/or head it
// broadcasts over, in a fixed order), of the gradients at pair (i, j)'s finished score,
// P * (Z dP - delta), that the dQ kernels (or the naive dS kernel) kept in the f32 scratch
// `kept_grads` [batch, heads_q, seq_q, seq_kv] (`keep_grad`; 0 where a tile was skipped;
// KEPT_WORDS words a pair, the first the gradient).
// One invocation per bias entry: deterministic, no atomics.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items (the bias's entries); the generated entry point calls it once per item.
fn item(e: u32) {
    let grid_len = params.seq_q * params.seq_kv;
    let pair = e % grid_len;
    let grid = e / grid_len;
    let bias_heads = select(1u, params.heads_q, params.bias_h_stride != 0u);
    // the slices this entry reaches: its own batch and head, or all along a broadcast one
    var b_lo = grid / bias_heads;
    var b_hi = b_lo + 1u;
    if (params.bias_b_stride == 0u) {
        b_lo = 0u;
        b_hi = params.batch;
    }
    var h_lo = grid % bias_heads;
    var h_hi = h_lo + 1u;
    if (params.bias_h_stride == 0u) {
        h_lo = 0u;
        h_hi = params.heads_q;
    }
    var acc = 0.0;
    for (var b = b_lo; b < b_hi; b++) {
        for (var h = h_lo; h < h_hi; h++) {
            acc += kept_grads[((b * params.heads_q + h) * grid_len + pair) * KEPT_WORDS];
        }
    }
    store_d_bias(e, acc);
}
