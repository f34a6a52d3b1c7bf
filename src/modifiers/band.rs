//! The causal mask and the sliding window: the band of keys each query row sees (query i sees
//! key j iff `i + lo <= j <= i + hi`, bottom-right aligned). Their public form is
//! `AttentionConfig::causal` and [`crate::Window`]; the kernels read the band from
//! `Params::band_lo` / `band_hi` and the tile bounds in shaders/common.wgsl.

use super::{Data, Modifier};
use crate::config::Window;
use crate::error::{Error, Result};
use crate::kernels::params::{band_offset, Params};
use crate::AttentionConfig;

/// The causal mask (bottom-right aligned).
pub(crate) const CAUSAL: Modifier = Modifier {
    name: "CAUSAL",
    bit: 1 << 0,
    compiled: false,
    data: Data::Params,
    active: |cfg| cfg.causal,
    check: super::no_check,
    encode: super::no_params,
    score: super::Score::None,
    wgsl: "",
    cuda: "",
};

/// A sliding window, causal folded in.
pub(crate) const WINDOW: Modifier = Modifier {
    name: "WINDOW",
    bit: 1 << 1,
    compiled: false,
    data: Data::Params,
    active: |cfg| cfg.window.is_active(),
    check,
    encode,
    score: super::Score::None,
    wgsl: "",
    cuda: "",
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
