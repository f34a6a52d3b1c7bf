// BIAS: an additive bias over pairs (src/modifiers/bias.rs); its entries come from the
// prelude's `bias_entry`, its gradient goes to the prelude's `keep_grad`.

// With BIAS, the bias's entry for pair (i, j) of the current head (`begin_head`) in the exp2
// domain, indexed as the boolean mask; 0 without.
fn pair_bias(i: u32, j: u32) -> f32 {
    if (!BIAS()) {
        return 0.0;
    }
    let row = params.q_base + min(i, params.seq_q - 1u);
    let col = params.kv_base + min(j, params.seq_kv - 1u);
    return bias_entry(head_bias + row * params.mask_cols + col) * LOG2E;
}
