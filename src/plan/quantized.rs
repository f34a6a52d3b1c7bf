//! A forward plan over an 8-bit KV cache (module [`kv_format`](crate::kv_format)):
//! the plan of the same call over an f32/f16/bf16 cache, its K/V-reading steps switched to the
//! cache's loads, and the quantizing appends in front of them.

use super::{decode, BufRef, Plan, PlanEnv, Step};
use crate::config::AttentionConfig;
use crate::dtype::{DType, ElemFormat};
use crate::error::{Error, Result};
use crate::kernels::wgsl::{cache_column_vec4s, ELEMENTWISE_WORKGROUP};
use crate::kernels::{Kernel, KernelKey, Params};
use crate::kv_format::CacheFormat;

/// Switches every step of `plan` (a forward plan of `cfg`, inputs q, k, v) that reads K or V
/// to the cache format `f` (caches of `cfg.kv_shape()` and `cfg.v_shape()`: records of
/// head_dim and of head_dim_v elements, `KV_RW` and `KV_RW_V` words). The decode kernel reads a
/// 16-byte word a column, or half of one on the GPUs whose decode takes one-word columns of
/// halves (`GpuClass::decode_max_words`: the same 2 vec4s of sums a row) where values of 256
/// dims or fewer leave every column an invocation; its subgroup is chosen again for that width.
/// A plan that binds the caches in windows (a cache past one binding) is a typed `DeviceLimit`.
pub fn read_cache(
    plan: &mut Plan,
    f: CacheFormat,
    cfg: &AttentionConfig,
    env: &PlanEnv,
) -> Result<()> {
    // each by its own name: a latent cache's values are head_dim_v wide in its key records
    f.check_dim("head_dim", cfg.head_dim)?;
    f.check_dim("head_dim_v", cfg.dv())?;
    let cache_bytes = f
        .cache_words(cfg.kv_shape())?
        .max(f.cache_words(cfg.v_shape())?) as u64
        * 4;
    if cache_bytes > env.max_binding_bytes || plan.steps.iter().any(|s| !s.windows.is_empty()) {
        return Err(Error::DeviceLimit {
            what: format!("a {f} KV cache's call in one binding per tensor"),
            needed: cache_bytes,
            limit: env.max_binding_bytes,
            hint: "split the batch over calls (8-bit caches are bound whole)".into(),
        });
    }
    for s in &mut plan.steps {
        let k = &mut s.key;
        if !k.kernel.reads_kv_cache() {
            continue;
        }
        k.kv = Some(f);
        if k.kernel.is_decode() {
            k.wide = if decode::max_words(cfg, env) == 1 {
                1
            } else {
                0
            };
            k.subgroup = decode::decode_subgroup(cfg, k.tiles, env, cache_column_vec4s(k.wide));
        }
    }
    Ok(())
}

/// Puts in front of `plan`'s steps the quantizing appends of each `(src, cache, dim)` triple of
/// plan inputs and record dims (k_new into the k cache, v_new into the v cache: `[batch, new,
/// heads_kv, dim]` row-major in `dtype`; dim head_dim, head_dim_v), in that order: new row r (batch-major) goes to cache row `rows[r]`,
/// a table the steps read from the plan's pair data (after whatever the call's own kernels
/// read there), stored once for all of them.
pub fn append(
    plan: &mut Plan,
    f: CacheFormat,
    (cfg, dtype, env): (&AttentionConfig, DType, &PlanEnv),
    pairs: &[(usize, usize, usize)],
    rows: &[u32],
) -> Result<()> {
    let items = rows.len() * cfg.heads_kv;
    let total = u32::try_from(items)
        .map_err(|_| Error::invalid(format!("an append of {items} cache records")))?;
    if total == 0 {
        return Ok(());
    }
    let base = plan.pairs.len() as u32;
    plan.pairs.extend_from_slice(rows);
    // the kernel's HEAD_DIM (and KV_RW) is the appended tensor's
    let key = |dim: usize| KernelKey {
        elem: ElemFormat::new(dtype, env.tuning.half_storage),
        head_dim: dim as u32,
        kv: Some(f),
        ..KernelKey::plain(Kernel::KvQuantize)
    };
    let params = |dim: usize| Params {
        total_items: total,
        heads_kv: cfg.heads_kv as u32,
        head_dim: dim as u32,
        pairs_base: base,
        ..Default::default()
    };
    let steps = pairs.iter().map(|&(src, cache, dim)| Step {
        key: key(dim),
        params: params(dim),
        buffers: vec![BufRef::Input(src), BufRef::Pairs, BufRef::Input(cache)],
        windows: Vec::new(),
        workgroups: total.div_ceil(ELEMENTWISE_WORKGROUP),
    });
    plan.steps.splice(0..0, steps);
    Ok(())
}
