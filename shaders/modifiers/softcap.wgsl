// SOFTCAP: each scaled score s becomes c tanh(s / c) (AttentionConfig::softcap;
// src/modifiers/softcap.rs). Scores live in the exp2 domain, where the cap is
// C tanh(x / C) with C = c log2(e) (params.softcap2).

fn softcap_score(x: f32, i: u32, j: u32) -> f32 {
    return params.softcap2 * tanh(x / params.softcap2);
}

// d softcap_score / dx, from the capped score t = softcap_score(x): 1 - (t / C)^2, so the
// backward needs no second tanh.
fn softcap_slope(x: f32, t: f32, i: u32, j: u32) -> f32 {
    let u = t / params.softcap2;
    return 1.0 - u * u;
}
