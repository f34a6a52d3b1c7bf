//! A call's route, decided once as a value before any step is built: which path it takes
//! (the decode kernel, one tiled dispatch per pass, the tiled passes over binding windows,
//! or the naive kernels), which kernel family and tiles each tiled pass runs, how a split or
//! a batch-windowed decode call is cut, and how many slices a naive dispatch takes.
//! `plan::forward` and `plan::backward` compute it first and then turn it into steps; the
//! helpers it asks (split, decode, naive, head_dims) answer below it and never call back.

pub use super::step::TiledPass;
use super::{decode, head_dims, naive, split, PlanEnv};
use crate::config::{Algorithm, AttentionConfig};
use crate::dtype::{DType, ElemFormat};
use crate::error::{Result, TensorRole};
use crate::kernels::{Kernel, Pass, Tiles, Variant};

/// How a call runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// The decode kernel (a forward of a few query rows) over windows of whole batches (one
    /// window of every batch when the call fits one binding), with its geometry.
    Decode {
        batches: decode::BatchWindows,
        shape: decode::DecodeShape,
    },
    /// One dispatch per tiled pass: the forward's, or the backward's dK/dV then dQ.
    Tiled(Vec<TiledPass>),
    /// The same passes over binding windows that each fit one binding.
    Split(split::Split, Vec<TiledPass>),
    /// The naive kernels, `chunk` (batch, query head) slices a dispatch.
    Naive { chunk: usize },
}

/// The forward's route. Typed errors for a bias in another dtype, a call no path can bind
/// (`DeviceLimit`), and head dims the windows cannot place.
pub fn forward(cfg: &AttentionConfig, dtype: DType, env: &PlanEnv) -> Result<Route> {
    check_bias_dtype(cfg, dtype)?;
    if cfg.algorithm == Algorithm::Naive {
        let chunk = naive::chunk_slices(cfg, 1, env.max_binding_bytes)?;
        return Ok(Route::Naive {
            chunk: chunk.min(cfg.batch * cfg.heads_q),
        });
    }
    let split = split::choose(cfg, dtype, env)?;
    // a block (of a larger call) runs tiled: its positions are the tiled kernels' bases
    if cfg.block.is_none() {
        if let Some((batches, shape)) = decode::route(cfg, split.as_ref(), env)? {
            return Ok(Route::Decode { batches, shape });
        }
    }
    tiled(cfg, dtype, env, split, &[Pass::Forward], "a tiled forward")
}

/// The backward's route. Typed errors for a paged call, a bias in another dtype, a call no
/// path can bind, and head dims the windows cannot place.
pub fn backward(cfg: &AttentionConfig, dtype: DType, env: &PlanEnv) -> Result<Route> {
    if cfg.paged.is_some() {
        return Err(crate::Error::Unsupported {
            feature: "the backward of a paged KV cache call".into(),
            backend: crate::Backend::Wgpu,
            reason: "paged K/V are an inference layout (pages may be shared between \
                     sequences, whose dK and dV would collide); run the backward on dense \
                     tensors"
                .into(),
        });
    }
    check_bias_dtype(cfg, dtype)?;
    if cfg.algorithm == Algorithm::Naive {
        // chunks hold whole GQA groups: dK and dV sum over a group's query heads
        let chunk = naive::chunk_slices(cfg, cfg.group(), env.max_binding_bytes)?;
        return Ok(Route::Naive {
            chunk: chunk.min(cfg.batch * cfg.heads_q),
        });
    }
    let split = split::choose(cfg, dtype, env)?;
    tiled(
        cfg,
        dtype,
        env,
        split,
        &[Pass::DkDv, Pass::Dq],
        "a tiled backward",
    )
}

/// The tiled passes, whole or over the binding windows of `split`.
fn tiled(
    cfg: &AttentionConfig,
    dtype: DType,
    env: &PlanEnv,
    split: Option<split::Split>,
    passes: &[Pass],
    call: &str,
) -> Result<Route> {
    if split.is_some() && cfg.block.is_some() {
        return Err(crate::Error::Unsupported {
            feature: format!("{call} of a block of a call past one storage binding"),
            backend: crate::Backend::Wgpu,
            reason: "a block runs in one dispatch a pass; cut it into smaller blocks (context \
                     parallelism does: more ranks, or a block per chunk)"
                .into(),
        });
    }
    let blocks_only = head_dims::blocks_only(cfg, split.is_some().then_some(call))?;
    let passes = passes
        .iter()
        .map(|&pass| {
            let kernel = pass_kernel(pass, blocks_only, cfg, dtype, env);
            Ok(TiledPass {
                kernel,
                tiles: tiles_for(kernel, cfg, env)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(match split {
        None => Route::Tiled(passes),
        Some(s) => Route::Split(s, passes),
    })
}

/// The bias is in the call's dtype (`Error::DType` naming it otherwise): the kernels read its
/// entries in the inputs' storage format.
pub(crate) fn check_bias_dtype(cfg: &AttentionConfig, dtype: DType) -> Result<()> {
    match &cfg.bias {
        Some(b) if b.dtype() != dtype => Err(crate::Error::DType {
            tensor: TensorRole::Bias.to_string(),
            expected: dtype,
            got: b.dtype(),
        }),
        _ => Ok(()),
    }
}

/// The kernel the tuning's variant runs for one pass on this call: `Variant::kernel_for`
/// with the call's element format; the blocks variant's where `blocks_only`, for a call whose
/// values have a head dim of their own or whose head_dim is past 256 (of the tiled kernels,
/// its alone read values apart and keep no row of q in private arrays: [`head_dims`]).
pub(crate) fn pass_kernel(
    pass: Pass,
    blocks_only: bool,
    cfg: &AttentionConfig,
    dtype: DType,
    env: &PlanEnv,
) -> Kernel {
    let variant = if blocks_only {
        Variant::Blocks
    } else {
        env.tuning.variant
    };
    variant.kernel_for(
        pass,
        ElemFormat::new(dtype, env.tuning.half_storage),
        cfg.head_dim as u32,
        env.caps,
    )
}

/// The tiles `kernel` runs with on this call: the chooser's, or with a block mask whose blocks
/// are smaller than them, tiles halved to fit in a block ([`fit_to_blocks`]) where that cuts
/// the work of the tiles the mask leaves visited (tiles x their pairs, counted on the mask) by
/// at least a third. The margin pays for what smaller tiles cost per pair: more workgroups,
/// each loading its rows and writing its outputs, over fewer pairs.
///
/// [`fit_to_blocks`]: crate::kernels::fit_to_blocks
pub(crate) fn tiles_for(
    kernel: Kernel,
    cfg: &AttentionConfig,
    env: &PlanEnv,
) -> crate::Result<Tiles> {
    // sized for the wider of q/k's and v's rows (head_dim_v)
    let dense = crate::kernels::choose_tiles(kernel, cfg.head_dim.max(cfg.dv()) as u32, env.caps)?;
    // (a block of a call keeps the chooser's tiles: the mask's grid is the whole call's)
    let Some(mask) = cfg.block_mask.as_ref().filter(|_| cfg.block.is_none()) else {
        return Ok(dense);
    };
    let blocks = (
        mask.block_q.min(u32::MAX as usize) as u32,
        mask.block_kv.min(u32::MAX as usize) as u32,
    );
    let fitted = crate::kernels::fit_to_blocks(kernel, dense, blocks, env.tuning.rows_subgroup);
    let work = |t: Tiles| {
        mask.visited_tiles(cfg.seq_q, cfg.seq_kv, t.br as usize, t.bc as usize) as u128
            * (t.br * t.bc) as u128
    };
    Ok(if fitted != dense && 3 * work(fitted) <= 2 * work(dense) {
        fitted
    } else {
        dense
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::HalfStorage;

    fn env(binding: u64) -> PlanEnv {
        PlanEnv {
            max_binding_bytes: binding,
            ..crate::plan::test_env(Variant::Rows, HalfStorage::Packed)
        }
    }

    #[test]
    fn each_path_is_one_route_decided_before_any_step() {
        let e = env(128 << 20);
        let c = AttentionConfig::new(2, 128, 128, 4, 2, 64);
        let Route::Tiled(p) = forward(&c, DType::F32, &e).unwrap() else {
            panic!("a plain call is one tiled dispatch")
        };
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].kernel,
            pass_kernel(Pass::Forward, false, &c, DType::F32, &e)
        );
        let Route::Tiled(p) = backward(&c, DType::F32, &e).unwrap() else {
            panic!("its backward too")
        };
        assert_eq!(p.len(), 2);
        // a decode step's rows: the decode kernel, every batch in one window
        let d = AttentionConfig::new(2, 1, 4096, 8, 2, 64);
        let Route::Decode { batches, shape } = forward(&d, DType::F32, &e).unwrap() else {
            panic!("one query row is a decode call")
        };
        assert_eq!((batches, shape.splits > 1), (vec![(0, 2)], true));
        // past a binding: windows; values of their own head dim: only the blocks family
        let mut w = AttentionConfig::new(1, 600, 600, 4, 4, 64);
        let Route::Split(s, p) = forward(&w, DType::F32, &env(64 << 10)).unwrap() else {
            panic!("a call past one binding is split")
        };
        assert!(s.accumulate && matches!(p[0].kernel, Kernel::Flash(Variant::Rows, Pass::Forward)));
        w.head_dim_v = Some(32);
        assert!(matches!(
            forward(&w, DType::F32, &env(64 << 10)),
            Err(crate::Error::Unsupported { .. })
        ));
        let Route::Tiled(p) = forward(&w, DType::F32, &e).unwrap() else {
            panic!("it fits one binding")
        };
        assert!(matches!(
            p[0].kernel,
            Kernel::Flash(Variant::Blocks, Pass::Forward)
        ));
        // the naive kernels in chunks of whole GQA groups
        let mut n = c.clone();
        n.algorithm = Algorithm::Naive;
        assert_eq!(
            forward(&n, DType::F32, &e).unwrap(),
            Route::Naive { chunk: 8 }
        );
        // a paged backward is refused before anything is chosen
        n.paged = Some(crate::PagedKv::cache_rows(2, 128, vec![0, 1]));
        assert!(matches!(
            backward(&n, DType::F32, &e),
            Err(crate::Error::Unsupported { .. })
        ));
    }
}
