//! Dropout's rules over a call ([`Dropout`](crate::Dropout)): its probability, seed and
//! offset in the parameter block.

use super::modifier::{Modifier, Reference};
use crate::error::Error;
use crate::kernels::hooks;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::DROPOUT,
    active: |cfg| cfg.dropout.is_some(),
    check: |cfg| match &cfg.dropout {
        Some(d) if !(d.p >= 0.0 && d.p < 1.0) => Err(Error::invalid(format!(
            "dropout.p must be in [0, 1) (or dropout None: off), got {}",
            d.p
        ))),
        _ => Ok(()),
    },
    encode: |cfg, p| {
        let d = cfg.dropout;
        p.drop_threshold = d.map_or(0, |d| d.threshold());
        p.drop_scale = d.map_or(1.0, |d| d.keep_scale());
        p.seed_lo = d.map_or(0, |d| d.seed as u32);
        p.seed_hi = d.map_or(0, |d| (d.seed >> 32) as u32);
        p.offset_lo = d.map_or(0, |d| d.offset as u32);
        p.offset_hi = d.map_or(0, |d| (d.offset >> 32) as u32);
    },
    reference: Reference::None,
};
