//! The bias's rules over a call ([`ScoreBias`](crate::bias::ScoreBias)): a term per pair,
//! its entries after the boolean mask's words in the pair data.

use super::modifier::{Modifier, Reference};
use crate::kernels::hooks;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::BIAS,
    active: |cfg| cfg.bias.is_some(),
    check: |cfg| match &cfg.bias {
        Some(b) => b.validate(cfg.batch, cfg.heads_q, cfg.seq_q, cfg.seq_kv),
        None => Ok(()),
    },
    encode: |cfg, p| {
        p.bias_base = cfg.mask.as_ref().map_or(0, |m| m.words().len() as u32);
        p.bias_b_stride = cfg.bias.as_ref().map_or(0, |b| b.strides().0 as u32);
        p.bias_h_stride = cfg.bias.as_ref().map_or(0, |b| b.strides().1 as u32);
    },
    reference: Reference::Term(|cfg, at| cfg.bias.as_ref().map_or(0.0, |b| b.value(at) as f64)),
};
