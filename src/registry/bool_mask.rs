//! The boolean mask's rules over a call ([`BoolMask`](crate::bool_mask::BoolMask)).

use super::modifier::{Modifier, Reference};
use crate::kernels::hooks;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::MASK,
    active: |cfg| cfg.mask.is_some(),
    check: |cfg| match &cfg.mask {
        Some(m) => m.validate(cfg.batch, cfg.heads_q, cfg.seq_q, cfg.seq_kv),
        None => Ok(()),
    },
    encode: |cfg, p| {
        p.mask_b_stride = cfg.mask.as_ref().map_or(0, |m| m.strides().0 as u32);
        p.mask_h_stride = cfg.mask.as_ref().map_or(0, |m| m.strides().1 as u32);
    },
    reference: Reference::None,
};
