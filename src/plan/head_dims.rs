//! Head dims past what every kernel family takes: values narrower or wider than queries and
//! keys ([`AttentionConfig::head_dim_v`], DeepSeek's 192/128, MLA's 576/512) and query/key
//! heads past [`MAX_HEAD_DIM`] (to 576, values to 512). The naive path (forward and
//! backward), the decode kernel (forward, dense and paged caches) and the blocks variant's
//! kernels (forward, dQ, dK/dV: `plan::route::pass_kernel` picks them on every adapter for such
//! calls; every such dim has tiles within WebGPU's default limits, small ones past 256) run
//! them; the paths named at each call of [`refuse`] (calls cut into binding windows, CUDA)
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

/// [`refuse`] for a wgpu `call` cut into binding windows (forward, backward, decode): the
/// windows place q's and k's rows, and v's and out's differ where the head dims do.
pub(crate) fn refuse_windows(cfg: &AttentionConfig, call: &str) -> Result<()> {
    refuse(
        cfg,
        &format!("{call} cut into binding windows"),
        Backend::Wgpu,
        "split the call into calls that each fit one binding, or run Algorithm::Naive",
    )
}

/// What the tiled route asks: whether the call needs the blocks family ([`beyond_families`]),
/// after [`refuse_windows`] for `windows`, the call cut into binding windows, if it is.
pub(crate) fn blocks_only(cfg: &AttentionConfig, windows: Option<&str>) -> Result<bool> {
    if let Some(call) = windows {
        refuse_windows(cfg, call)?;
    }
    Ok(beyond_families(cfg))
}

#[cfg(test)]
mod tests {
    use crate::config::MAX_HEAD_DIM_QK;
    use crate::kernels::{choose_tiles, workgroup_words, DeviceCaps, Kernel, Pass, Variant};

    #[test]
    fn the_blocks_kernels_take_every_head_dim_to_576_within_webgpu_default_limits() {
        let caps = DeviceCaps::WEBGPU_DEFAULT;
        for pass in [Pass::Forward, Pass::Dq, Pass::DkDv] {
            let kernel = Kernel::Flash(Variant::Blocks, pass);
            for d in 1..=MAX_HEAD_DIM_QK as u32 {
                let t = choose_tiles(kernel, d, caps)
                    .unwrap_or_else(|e| panic!("{kernel:?} at {d}: {e}"));
                assert!(workgroup_words(kernel, d, t) * 4 <= caps.max_workgroup_storage_bytes);
                assert!(t.threads(kernel) <= caps.max_invocations_per_workgroup);
            }
        }
    }
}
