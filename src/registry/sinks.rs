//! Attention sinks (gpt-oss): one logit per query head that joins every row's softmax
//! denominator and takes no value (`AttentionConfig::sinks`), with a gradient
//! (`Gradients::d_sinks`). Sinks live in the extras; kernels: shaders/modifiers/sinks.wgsl and
//! the lse/merge functions of shaders/common.wgsl, whose rows they join.

use super::modifier::{Modifier, Reference};
use crate::config::check_values;
use crate::error::Result;
use crate::kernels::hooks;
use crate::AttentionConfig;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::SINKS,
    active: |cfg| cfg.sinks.is_some(),
    check,
    encode: super::modifier::no_params,
    reference: Reference::None,
};

fn check(cfg: &AttentionConfig) -> Result<()> {
    check_values(
        "sinks",
        &cfg.sinks,
        &[cfg.heads_q],
        &format!("one logit per query head ([heads_q] = [{}])", cfg.heads_q),
    )
}
