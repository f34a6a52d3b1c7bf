//! The plan of `Context::create_block_mask`: one element-parallel step evaluating a user mask
//! (`MaskMod`) over each block of pairs into `[batch, heads, rows, cols]` f32 flags.

use super::{BufRef, OutputSpec, Plan, Step};
use crate::dtype::DType;
use crate::error::{Error, Result, TensorRole};
use crate::kernels::wgsl::ELEMENTWISE_WORKGROUP;
use crate::kernels::{flags, Kernel, KernelKey, Params};
use crate::{AttentionConfig, MaskMod};

/// Plans the block mask of `mask` for `batch x heads` grids (each 1: the mask is evaluated at
/// batch or head 0, for a block mask that broadcasts) over `seq_q x seq_kv`, in blocks of
/// `block_q x block_kv`.
pub fn mask_blocks(
    mask: &MaskMod,
    (batch, heads, seq_q, seq_kv): (usize, usize, usize, usize),
    (block_q, block_kv): (usize, usize),
) -> Result<Plan> {
    let (rows, cols, n) = block_grid((batch, heads, seq_q, seq_kv), (block_q, block_kv))?;
    // a config that carries the mask (its captured tensors are the extras), one head dim
    let mut cfg = AttentionConfig::new(1, seq_q, seq_kv, heads, heads, 1);
    cfg.mask_mod = Some(mask.clone());
    let key = KernelKey {
        flags: flags::MASK_MOD,
        user_code: crate::registry::user_code::kernel_wgsl(&cfg),
        ..KernelKey::plain(Kernel::MaskBlocks)
    };
    let mut params = Params {
        batch: batch as u32,
        total_items: n as u32,
        blocks_cols: cols as u32,
        ..Params::from_config(&cfg)
    };
    params.set_block_size(block_q, block_kv);
    let mut plan = Plan {
        inputs: Vec::new(),
        outputs: vec![OutputSpec {
            role: TensorRole::Out,
            shape: vec![batch, heads, rows, cols],
            dtype: DType::F32,
        }],
        scratch: Vec::new(),
        extras: Vec::new(),
        pairs: Vec::new(),
        kept_grads: None,
        copies: Vec::new(),
        steps: vec![Step {
            key,
            params,
            buffers: vec![BufRef::Output(0)],
            windows: Vec::new(),
            workgroups: (n as usize).div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
        }],
    };
    plan.attach_extras(&cfg)?;
    Ok(plan)
}

/// The block grid of `create_block_mask` on every backend: (rows, cols, blocks of all grids),
/// or a typed error for a zero size or more blocks than 32-bit indices reach.
pub(crate) fn block_grid(
    (batch, heads, seq_q, seq_kv): (usize, usize, usize, usize),
    (block_q, block_kv): (usize, usize),
) -> Result<(usize, usize, u64)> {
    for (name, v) in [
        ("batch", batch),
        ("heads", heads),
        ("seq_q", seq_q),
        ("seq_kv", seq_kv),
        ("block_q", block_q),
        ("block_kv", block_kv),
    ] {
        if v == 0 {
            return Err(Error::invalid(format!(
                "create_block_mask: {name} must be at least 1, got 0"
            )));
        }
    }
    let (rows, cols) = (seq_q.div_ceil(block_q), seq_kv.div_ceil(block_kv));
    let n = [batch, heads, rows, cols]
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .filter(|&n| n < u32::MAX as u64)
        .ok_or_else(|| {
            Error::invalid(format!(
                "create_block_mask: {batch} x {heads} grids of {rows} x {cols} blocks do not fit \
                 32-bit indices; take larger blocks"
            ))
        })?;
    Ok((rows, cols, n))
}

/// The block mask of `mask` from the kernels' flags (0 off, 1 partly on, 2 full), on every
/// backend.
pub(crate) fn block_mask(
    mask: &crate::MaskMod,
    flags: &[f32],
    (batch, heads): (usize, usize),
    (block_q, block_kv): (usize, usize),
) -> crate::BlockMask {
    crate::BlockMask {
        block_q,
        block_kv,
        batch,
        heads,
        blocks: flags.iter().map(|&x| x != 0.0).collect(),
        full: Some(flags.iter().map(|&x| x == 2.0).collect()),
        mask_mod: Some(mask.clone()),
    }
}
