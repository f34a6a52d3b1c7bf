//! The causal mask and the sliding window: the band of keys each query row sees (query i sees
//! key j iff `i + lo <= j <= i + hi`, bottom-right aligned). Their public form is
//! `AttentionConfig::causal` and [`crate::Window`]; the kernels read the band from
//! `Params::band_lo` / `band_hi` and the tile bounds in shaders/common.wgsl.

use super::modifier::{Modifier, Reference};
use crate::config::Window;
use crate::error::{Error, Result};
use crate::kernels::hooks;
use crate::kernels::params::{band_offset, Params};
use crate::AttentionConfig;

/// The causal mask (bottom-right aligned).
pub(crate) const CAUSAL: Modifier = Modifier {
    hooks: &hooks::CAUSAL,
    active: |cfg| cfg.causal,
    check: super::modifier::no_check,
    encode: super::modifier::no_params,
    reference: Reference::None,
};

/// A sliding window, causal folded in.
pub(crate) const WINDOW: Modifier = Modifier {
    hooks: &hooks::WINDOW,
    active: |cfg| cfg.window.is_active(),
    check,
    encode,
    reference: Reference::None,
};

fn check(cfg: &AttentionConfig) -> Result<()> {
    for (side, v) in [("left", cfg.window.left), ("right", cfg.window.right)] {
        if let Some(v) = v {
            if v > Window::MAX_SIDE {
                return Err(Error::invalid(format!(
                    "window.{side} must be at most {} (or None: unbounded), got {v}",
                    Window::MAX_SIDE
                )));
            }
        }
    }
    Ok(())
}

fn encode(cfg: &AttentionConfig, p: &mut Params) {
    p.band_lo = band_offset(cfg.causal_offset(), cfg.band().0, -1);
    p.band_hi = band_offset(cfg.causal_offset(), cfg.band().1, 1);
}
