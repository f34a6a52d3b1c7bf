//! Head dims past what every kernel family takes: values narrower or wider than queries and
//! keys ([`AttentionConfig::head_dim_v`], DeepSeek's 192/128, MLA's 576/512) and query/key
//! heads past [`MAX_HEAD_DIM`]. The naive path (forward and backward) and the decode kernel
//! (forward, dense and paged caches) run them; the blocks variant's kernels (forward, dQ,
//! dK/dV) run values of their own head dim where both dims are at most [`MAX_HEAD_DIM`]
//! ([`tiled_runs`]; `plan::pass_kernel` picks them on every adapter for such calls); the
//! paths named at each call of [`refuse`] (calls cut into binding windows, CUDA)
//! answer `Error::Unsupported` before any tile is chosen. docs/SEMANTICS.md ("Head dims")
//! lists which path runs what.

use crate::config::{AttentionConfig, MAX_HEAD_DIM};
use crate::error::{Error, Result};
use crate::Backend;

/// True when the call's head dims are past what every kernel family takes: `head_dim_v`
/// differs from `head_dim`, or `head_dim` is past [`MAX_HEAD_DIM`].
pub(crate) fn beyond_families(cfg: &AttentionConfig) -> bool {
    !cfg.same_head_dims() || cfg.head_dim > MAX_HEAD_DIM
}

/// True when the tiled kernels run the call: the blocks variant's read values of their own
/// head dim, both dims at most [`MAX_HEAD_DIM`].
pub(crate) fn tiled_runs(cfg: &AttentionConfig) -> bool {
    cfg.head_dim <= MAX_HEAD_DIM && cfg.dv() <= MAX_HEAD_DIM
}

/// `Error::Unsupported` for `path` on `backend` where the call's head dims are past what
/// every family takes ([`beyond_families`]), saying what runs them instead (`instead`).
pub(crate) fn refuse(
    cfg: &AttentionConfig,
    path: &str,
    backend: Backend,
    instead: &str,
) -> Result<()> {
    if !beyond_families(cfg) {
        return Ok(());
    }
    Err(Error::Unsupported {
        feature: format!(
            "head_dim {} with head_dim_v {} in {path}",
            cfg.head_dim,
            cfg.dv()
        ),
        backend,
        reason: format!(
            "it runs where q, k and v share one head dim of at most {MAX_HEAD_DIM}; {instead}"
        ),
    })
}

/// What runs a call of such head dims on wgpu, for the refusals' messages.
pub(crate) const WGPU_INSTEAD: &str = "on wgpu the naive path (Algorithm::Naive, forward and \
     backward), the decode kernel (a tiled forward of at most 4 query rows, \
     plan::decode::MAX_DECODE_QUERIES) and, for head dims up to 256, the tiled kernels (the \
     blocks variant's) run them";
