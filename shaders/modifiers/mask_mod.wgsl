// MASK_MOD: the user's mask (AttentionConfig::mask_mod, src/modifiers/mask_mod.rs), whose
// `mask_mod` the generated source appends, at the whole call's (batch, query head, row, key);
// `visible` takes it with the other masks.
fn mask_mod_on(i: u32, j: u32) -> bool {
    if (!MASK_MOD()) {
        return true;
    }
    return mask_mod(head_b, head_h, params.q_base + i, params.kv_base + j);
}
