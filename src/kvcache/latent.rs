//! MLA's latent cache, as FlashMLA serves it: one cache of `[batch, capacity, heads_kv,
//! head_dim]` rows (DeepSeek's 576: 512 latent dims and 64 rotary ones), whose values are the
//! first `head_dim_v` dims of each row (`AttentionConfig::values_in_keys`). Each row is stored
//! once, not again as a separate v (1,088 dims a row for MLA's shapes); the kernels bind the
//! cache as k and as v and read the values from the key rows (`v_index`, an 8-bit cache's key
//! records). An append writes each new row once. Dense or paged (`cfg.paged`), the decode
//! kernel or the tiled forward (a chunked prefill over the cache), f16/bf16/f32 or 8-bit.
//!
//! ```no_run
//! use flash_attn_wgpu::{AttentionConfig, Context};
//! let ctx = Context::new()?;
//! // 16 query heads over one latent head: keys 576 wide, values its first 512 dims
//! let mut cfg = AttentionConfig::new(1, 1, 4096, 16, 1, 576); // seq_kv: the capacity
//! cfg.head_dim_v = Some(512);
//! let mut cache = ctx.zeros(&cfg.kv_shape())?;
//! let q = ctx.zeros(&cfg.q_shape())?;
//! let new = ctx.zeros(&[1, 1, 1, 576])?;
//! let f = ctx.forward_with_latent_cache(&cfg, &q, &mut cache, &[0], Some(&new))?;
//! assert_eq!(f.out.shape(), &[1, 1, 16, 512]);
//! # Ok::<(), flash_attn_wgpu::Error>(())
//! ```

use super::QuantizedCache;
use crate::config::AttentionConfig;
use crate::device::Context;
use crate::error::Result;
use crate::outputs::Forward;
use crate::tensor::Tensor;

impl Context {
    /// Attention of q over an MLA latent cache (module docs): `cache` is `cfg.kv_shape()`,
    /// `[batch, seq_kv, heads_kv, head_dim]` with `seq_kv` the capacity, and the values are
    /// the first `cfg.dv()` dims of each row (`cfg.values_in_keys` is set for the call;
    /// `head_dim_v` at most `head_dim`). `k_new` (`[batch, new, heads_kv, head_dim]`, q's
    /// dtype) is appended at each batch's length first, each row written once; the caller
    /// advances its lengths by `new`. As
    /// [`forward_with_kvcache`](Context::forward_with_kvcache) in everything else (paged
    /// caches, left padding, modifiers, one submission). `cache` must be row-major.
    pub fn forward_with_latent_cache(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        cache: &mut Tensor,
        cache_seqlens: &[usize],
        k_new: Option<&Tensor>,
    ) -> Result<Forward> {
        self.latent_impl(cfg, q, cache, cache_seqlens, k_new, None)
    }

    /// [`forward_with_latent_cache`](Context::forward_with_latent_cache) writing into `dst`
    /// (an earlier step's result), as
    /// [`forward_with_kvcache_into`](Context::forward_with_kvcache_into).
    pub fn forward_with_latent_cache_into(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        cache: &mut Tensor,
        cache_seqlens: &[usize],
        k_new: Option<&Tensor>,
        dst: &Forward,
    ) -> Result<()> {
        self.latent_impl(cfg, q, cache, cache_seqlens, k_new, Some(dst))
            .map(drop)
    }

    /// The dense or paged latent-cache call: the KV-cache call with no v (its values bound
    /// from the cache) and keys alone appended.
    fn latent_impl(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        cache: &Tensor,
        cache_seqlens: &[usize],
        k_new: Option<&Tensor>,
        dst: Option<&Forward>,
    ) -> Result<Forward> {
        let append = k_new.map(|k| (k, None));
        self.kvcache_impl(cfg, q, (cache, None), cache_seqlens, append, dst, None)
    }

    /// [`forward_with_latent_cache`](Context::forward_with_latent_cache) over an 8-bit latent
    /// cache (`cfg.kv_shape()` in a [`CacheFormat`](crate::CacheFormat)): the values are read
    /// from the key records' bytes and scales (q8_0's first `head_dim_v / 32` blocks of each
    /// row; E4M3's bytes under the row's kv-head scale), and `k_new` is quantized into the
    /// cache once, on the GPU, in the same submission.
    pub fn forward_with_quantized_latent_cache(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        cache: &mut QuantizedCache,
        cache_seqlens: &[usize],
        k_new: Option<&Tensor>,
    ) -> Result<Forward> {
        let append = k_new.map(|k| (k, None));
        self.quantized_kvcache_impl(cfg, q, (&*cache, None), cache_seqlens, append, (None, None))
    }
}
