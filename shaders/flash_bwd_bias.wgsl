// Backward, the bias's gradient: entry e of d_bias (the bias's own shape) is the sum, over the
// (batch, query head) slices the entry reaches (one, or every batch and/or head it broadcasts
// over, in a fixed order), of the gradient at pair (i, j)'s finished score:
// P * (Z dP - delta), P recomputed from the row's lse, dP = dO . v, Z the dropout factor.
// One invocation per bias entry: deterministic, no atomics, nothing of seq_q x seq_kv beyond
// d_bias itself; each invocation recomputes its pairs' two dot products (4 head_dim FLOPs a
// pair, as the dQ pass does).
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items (the bias's entries); the generated entry point calls it once per item.
fn item(e: u32) {
    let j = e % params.seq_kv;
    let i = (e / params.seq_kv) % params.seq_q;
    let grid = e / (params.seq_q * params.seq_kv);
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
            begin_head(b, h);
            // a hidden pair's gradient is 0: its dot products are skipped
            if (!visible(i, j)) {
                continue;
            }
            let qb = q_index(b, i, h, 0u);
            let kb = kv_index(b, j, h / params.group, 0u);
            var s = 0.0;
            var dp = 0.0;
            for (var d = 0u; d < HEAD_DIM; d++) {
                s = fma(load_q(qb + d), load_k(kb + d), s);
                dp = fma(load_d_out(qb + d), load_v(kb + d), dp);
            }
            let pair = lse_delta[pair_index(b, h, i)];
            let p = recompute_p(finish_score(s * params.scale_log2, i, j, false), pair.x);
            acc += finished_grad(p, dp * dropout_scale(i, j), pair.y);
        }
    }
    store_d_bias(e, acc);
}
