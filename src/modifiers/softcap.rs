//! The softcap (Gemma 2, Grok): each scaled score s becomes `c tanh(s / c)` before masking and
//! softmax (`AttentionConfig::softcap`). Kernels: shaders/modifiers/softcap.wgsl and
//! cuda/modifiers/softcap.cuh, in the exp2 domain (`Params::softcap2` = c log2(e)).

use super::{Data, Modifier, Score};
use crate::error::{Error, Result};
use crate::kernels::params::Params;
use crate::AttentionConfig;

/// A tanh per score: compiled in, so that calls without a softcap pay nothing for it.
pub(crate) const MODIFIER: Modifier = Modifier {
    name: "SOFTCAP",
    bit: 1 << 2,
    compiled: true,
    data: Data::Params,
    active: |cfg| cfg.softcap.is_some(),
    check,
    encode: |cfg, p: &mut Params| {
        p.softcap2 = cfg.softcap.map_or(0.0, |c| c * std::f32::consts::LOG2_E);
    },
    score: Score::Transform {
        apply: "softcap_score",
        slope: "softcap_slope",
        reference: |cfg, _, s| reference(cfg, s),
        reference_slope: |cfg, _, s| reference_slope(cfg, s),
    },
    wgsl: include_str!("../../shaders/modifiers/softcap.wgsl"),
    cuda: include_str!("../../cuda/modifiers/softcap.cuh"),
};

fn check(cfg: &AttentionConfig) -> Result<()> {
    match cfg.softcap {
        Some(c) if !(c.is_finite() && c > 0.0) => Err(Error::invalid(format!(
            "softcap must be a finite number above 0 (or None: off), got {c}"
        ))),
        _ => Ok(()),
    }
}

/// The f64 reference: the capped score, or `s` without a softcap.
fn reference(cfg: &AttentionConfig, s: f64) -> f64 {
    match cfg.softcap {
        Some(c) => c as f64 * (s / c as f64).tanh(),
        None => s,
    }
}

/// The f64 reference: d reference(s) / ds = 1 - tanh^2(s / c) at the raw score s; 1 without.
fn reference_slope(cfg: &AttentionConfig, s: f64) -> f64 {
    let Some(c) = cfg.softcap else { return 1.0 };
    let t = (s / c as f64).tanh();
    1.0 - t * t
}
