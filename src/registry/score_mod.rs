//! A user score modifier's rules over a call ([`ScoreMod`](crate::ScoreMod)): its captured
//! tensors live in the extras; the f64 reference applies the host functions it was given.

use super::modifier::{Modifier, Pair, Reference};
use crate::kernels::hooks;
use crate::AttentionConfig;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::SCORE_MOD,
    active: |cfg| cfg.score_mod.is_some(),
    check: super::modifier::no_check,
    encode: super::modifier::no_params,
    reference: Reference::Transform {
        value: |cfg, at, s| host(cfg, at, s, 0),
        slope: |cfg, at, s| host(cfg, at, s, 1),
    },
};

/// The host function (`which` 0) or its slope (1) at raw score s; NaN without them.
fn host(cfg: &AttentionConfig, (b, h, i, j): Pair, s: f64, which: usize) -> f64 {
    if s == f64::NEG_INFINITY {
        // hidden stays hidden (its probability is 0: no gradient flows through the slope)
        return [s, 0.0][which];
    }
    match cfg.score_mod.as_ref().and_then(|m| m.host()) {
        Some((f, df)) => [f, df][which](s, b, h, i, j),
        None => f64::NAN,
    }
}
