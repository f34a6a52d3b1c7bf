// MASK: the boolean mask over pairs (src/modifiers/bool_mask.rs); its bits come from the
// prelude's `mask_bit`.

// With MASK, the boolean mask's entry for pair (i, j) of the current head (`begin_head`),
// indexed by the whole call's rows and keys; true without. Out-of-range pairs read their
// row's and key's last entry (`visible` hides them anyway).
fn pair_on(i: u32, j: u32) -> bool {
    if (!MASK()) {
        return true;
    }
    let row = params.q_base + min(i, params.seq_q - 1u);
    let col = params.kv_base + min(j, params.seq_kv - 1u);
    return mask_bit(head_mask + row * params.mask_cols + col);
}
