//! Attention sinks (gpt-oss): one logit per query head that joins every row's softmax
//! denominator and takes no value (`AttentionConfig::sinks`), with a gradient
//! (`Gradients::d_sinks`). Sinks live in the extras; kernels: shaders/modifiers/sinks.wgsl and
//! the lse/merge functions of shaders/common.wgsl, whose rows they join.

use super::{Data, Modifier};
use crate::config::check_values;
use crate::error::Result;
use crate::AttentionConfig;

/// A run-time bit: a zero-cost test when off (docs/PERFORMANCE.md).
pub(crate) const MODIFIER: Modifier = Modifier {
    name: "SINKS",
    bit: 1 << 4,
    compiled: false,
    data: Data::Extras,
    active: |cfg| cfg.sinks.is_some(),
    check,
    encode: super::no_params,
    score: super::Score::None,
    wgsl: include_str!("../../shaders/modifiers/sinks.wgsl"),
    cuda: "",
};

fn check(cfg: &AttentionConfig) -> Result<()> {
    check_values(
        "sinks",
        &cfg.sinks,
        &[cfg.heads_q],
        &format!("one logit per query head ([heads_q] = [{}])", cfg.heads_q),
    )
}
