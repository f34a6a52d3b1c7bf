//! One step of a plan: the pipeline key of a kernel for a call, and a tiled pass's dispatch
//! over a call or a part of it. Pure helpers below the route and the step builders.

use super::{BufRef, PlanEnv, Step};
use crate::config::AttentionConfig;
use crate::dtype::{DType, ElemFormat};
use crate::kernels::{Kernel, KernelKey, Params, Tiles};

/// A tiled pass as the route runs it: the kernel of the tuning's family (or the blocks
/// family, `route::pass_kernel`) and its tiles for the whole call (`route::tiles_for`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TiledPass {
    pub kernel: Kernel,
    pub tiles: Tiles,
}

/// The step of a tiled pass over `cfg` (the whole call, or a part of `whole` when a call is
/// split): its tiles (the route's, for the whole call), the tile counts in `Params`, and one workgroup per (batch, head, tile of
/// rows), where rows are queries (query heads) or, for dK/dV, keys (kv heads).
pub(crate) fn tiled_step(
    TiledPass { kernel, tiles }: TiledPass,
    (cfg, whole): (&AttentionConfig, &AttentionConfig),
    dtype: DType,
    env: &PlanEnv,
    buffers: Vec<BufRef>,
) -> Step {
    let mut params = Params::from_part(cfg, whole);
    params.n_q_tiles = cfg.seq_q.div_ceil(tiles.br as usize) as u32;
    params.n_kv_tiles = cfg.seq_kv.div_ceil(tiles.bc as usize) as u32;
    params.total_wg = if kernel.rows_are_keys() {
        params.n_kv_tiles * (cfg.heads_kv * cfg.batch) as u32
    } else {
        params.n_q_tiles * (cfg.heads_q * cfg.batch) as u32
    };
    Step {
        key: key(kernel, cfg, tiles, dtype, env),
        params,
        buffers,
        windows: Vec::new(),
        workgroups: params.total_wg,
    }
}

/// The pipeline key of `kernel` for this call. Kernels with no element-typed binding share
/// one pipeline across dtypes.
pub(crate) fn key(
    kernel: Kernel,
    cfg: &AttentionConfig,
    tiles: Tiles,
    dtype: DType,
    env: &PlanEnv,
) -> KernelKey {
    // a call whose bits are all compiled or specialized gets the lean pipeline, which reads
    // only the specialized bits at run time (kernels::flags::SPECIALIZED); any other, the one
    // that reads them all
    let reads = kernel.reads_flags();
    let call = reads & crate::registry::bits(cfg);
    let specialized = call & !(env.compiled_flags | crate::kernels::flags::SPECIALIZED) == 0;
    let user_code = if kernel.takes_user_code() {
        crate::registry::user_code::kernel_wgsl(cfg)
    } else {
        None
    };
    // a user's snippet is its own pipelines anyway: they compile the call's every bit in (no
    // run-time tests; views stay the record's to set), as a specialized built-in call is
    let (runtime, compiled) = if user_code.is_some() {
        (0, call)
    } else if specialized {
        (
            reads & crate::kernels::flags::SPECIALIZED & !env.compiled_flags,
            call & env.compiled_flags,
        )
    } else {
        (reads & !env.compiled_flags, call & env.compiled_flags)
    };
    KernelKey {
        kernel,
        // the bias is read in the call's dtype, also by kernels without element tensors
        elem: if kernel.has_elem_bindings() || (kernel.finishes_scores() && cfg.bias.is_some()) {
            ElemFormat::new(dtype, env.tuning.half_storage)
        } else {
            ElemFormat::F32
        },
        head_dim: if kernel.reads_head_dim() {
            cfg.head_dim as u32
        } else {
            1
        },
        head_dim_v: if kernel.reads_value_dim() && !cfg.same_head_dims() {
            cfg.dv() as u32
        } else {
            0
        },
        tiles,
        runtime,
        flags: compiled,
        // set by the decode plan where K/V rows start on whole words
        wide: 0,
        // set by the backward plan where d_bias is asked for
        keeps_grads: false,
        keeps_scores: false,
        sums_table: false,
        subgroup: if kernel.is_rows_variant() {
            env.tuning.rows_subgroup
        } else {
            0
        },
        accumulate: false,
        user_code,
        // set for the calls over an 8-bit KV cache (`quantized::read_cache`)
        kv: None,
    }
}
