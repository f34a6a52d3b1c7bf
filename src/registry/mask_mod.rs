//! A user mask's rules over a call ([`MaskMod`](crate::MaskMod)): its captured names must
//! differ from the score modifier's; the f64 reference applies its host predicate.

use super::modifier::{Modifier, Reference};
use crate::kernels::hooks;
use crate::AttentionConfig;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::MASK_MOD,
    active: |cfg| cfg.mask_mod.is_some(),
    check: super::user_code::check_names,
    encode: super::modifier::no_params,
    reference: Reference::None,
};

/// The f64 reference: pair (b, h, i, j) takes part by the call's mask_mod (true without one).
pub(crate) fn reference(cfg: &AttentionConfig, b: usize, h: usize, i: usize, j: usize) -> bool {
    cfg.mask_mod.as_ref().is_none_or(|m| m.host(b, h, i, j))
}
