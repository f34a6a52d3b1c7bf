// SCORE_MOD: the user's score modifier (AttentionConfig::score_mod, src/modifiers/score_mod.rs),
// whose `score_mod` and `score_mod_ds` the generated source appends. It takes natural-log
// scores and the whole call's (batch, query head, row, key); the chain's scores are in the
// exp2 domain (x = s log2(e)), so x goes in as x ln 2 and the result comes back times
// log2(e), and d(result)/dx = score_mod_ds at s. An -inf score passes through unchanged. `begin_head` keeps the head's batch and
// query head.
var<private> head_b: u32;
var<private> head_h: u32;

fn score_mod_apply(x: f32, i: u32, j: u32) -> f32 {
    // a pair hidden by an -inf score (a bias entry) stays hidden
    if (x == neg_inf()) {
        return x;
    }
    return score_mod(x * LN2, head_b, head_h, params.q_base + i, params.kv_base + j) * LOG2E;
}

fn score_mod_slope(x: f32, t: f32, i: u32, j: u32) -> f32 {
    return score_mod_ds(x * LN2, head_b, head_h, params.q_base + i, params.kv_base + j);
}
