//! The softcap (Gemma 2, Grok): each scaled score s becomes `c tanh(s / c)` before masking and
//! softmax (`AttentionConfig::softcap`). Kernels: shaders/modifiers/softcap.wgsl and
//! cuda/modifiers/softcap.cuh, in the exp2 domain (`Params::softcap2` = c log2(e)).

use super::modifier::{Modifier, Reference};
use crate::error::{Error, Result};
use crate::kernels::hooks;
use crate::kernels::params::Params;
use crate::AttentionConfig;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::SOFTCAP,
    active: |cfg| cfg.softcap.is_some(),
    check,
    encode: |cfg, p: &mut Params| {
        p.softcap2 = cfg.softcap.map_or(0.0, |c| c * std::f32::consts::LOG2_E);
    },
    reference: Reference::Transform {
        value: |cfg, _, s| reference(cfg, s),
        slope: |cfg, _, s| reference_slope(cfg, s),
    },
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
