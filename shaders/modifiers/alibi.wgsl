// ALIBI: linear biases by distance (AttentionConfig::alibi_slopes; src/modifiers/alibi.rs).
// The head's slope is read by `begin_head` (head_slope2).

// ALiBi's term for query i and key j (exp2 domain): -slope * |i' - j|, i' = i + causal_offset
// (bottom-right aligned, as the mask); 0 without ALiBi.
fn alibi_term(i: u32, j: u32) -> f32 {
    if (!ALIBI()) {
        return 0.0;
    }
    var shift = select(0, head_shift, SEQLENS());
    if (VARLEN()) {
        shift = row_context(i).shift;
    }
    return -head_slope2 * abs(f32(i32(i) + params.causal_offset + shift - i32(j)));
}
