//! ALiBi (Press et al.): a linear bias by distance, `-slope * |i' - j|` added to each scaled
//! score after the softcap, with a slope per query head or per (batch, head)
//! (`AttentionConfig::alibi_slopes`). Slopes live in the extras; kernels:
//! shaders/modifiers/alibi.wgsl and cuda/modifiers/alibi.cuh.

use super::modifier::{Modifier, Pair, Reference};
use crate::config::check_values;
use crate::error::Result;
use crate::kernels::hooks;
use crate::AttentionConfig;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::ALIBI,
    active: |cfg| cfg.alibi_slopes.is_some(),
    check,
    encode: super::modifier::no_params,
    reference: Reference::Term(reference),
};

fn check(cfg: &AttentionConfig) -> Result<()> {
    let (per_head, per_batch) = (cfg.heads_q, cfg.batch.saturating_mul(cfg.heads_q));
    check_values(
        "alibi_slopes",
        &cfg.alibi_slopes,
        &[per_head, per_batch],
        &format!(
            "heads_q = {per_head} slopes ([heads_q]) or batch x heads_q = {per_batch} \
             ([batch, heads_q])"
        ),
    )
}

/// The f64 reference: -slope * |i' - j| for pair (i, j) of (batch b, head h), i' = i + seq_kv -
/// seq_q (per sequence with varlen); 0 for a pair of two sequences (hidden anyway).
fn reference(cfg: &AttentionConfig, (b, h, i, j): Pair) -> f64 {
    let (Some(slope), Some((ip, j))) = (
        cfg.alibi_slope(b, h),
        super::positions::aligned(cfg, b, i, j),
    ) else {
        return 0.0;
    };
    -(slope as f64) * (ip - j).abs() as f64
}
