//! One interface over every backend: [`AttentionBackend`], implemented by the wgpu
//! [`Context`](crate::Context) and, with the `cuda` feature, by
#![cfg_attr(feature = "cuda", doc = "[`CudaContext`](crate::cuda::CudaContext).")]
// plain text where the type does not exist: a link to it would be broken
#![cfg_attr(not(feature = "cuda"), doc = "`cuda::CudaContext`.")]
//! Code written against it (the crate's own test suite included) runs unchanged on whichever
//! backend is chosen at run time.
//!
//! ```no_run
//! use flash_attn_wgpu::{AttentionBackend, AttentionConfig, Context};
//! fn run<B: AttentionBackend>(b: &B) -> flash_attn_wgpu::Result<Vec<half::bf16>> {
//!     let cfg = AttentionConfig::new(1, 64, 64, 2, 2, 64);
//!     let x = vec![half::bf16::from_f32(0.25); 64 * 2 * 64];
//!     let q = b.upload(&x, &cfg.q_shape())?;
//!     let k = b.upload(&x, &cfg.kv_shape())?;
//!     let f = b.forward(&cfg, &q, &k, &k)?; // stays on the device
//!     b.download(&f.out)
//! }
//! run(&Context::new()?)?;
//! # Ok::<(), flash_attn_wgpu::Error>(())
//! ```

use crate::checks::check_backward_host;
use crate::config::AttentionConfig;
use crate::device::GpuTiming;
use crate::dtype::Element;
use crate::error::Result;
use crate::kv_format::CacheFormat;
use crate::kvcache::QuantizedCache;
use crate::outputs::{Forward, Gradients, HostForward, HostGradients};
use crate::rotary::Rotary;

pub use crate::error::Backend;

/// The calls every backend offers, with the same semantics, layouts and errors (see
/// [`Context::forward`](crate::Context::forward) and
/// [`Context::backward`](crate::Context::backward) for both).
pub trait AttentionBackend {
    /// A device-resident tensor of this backend.
    type Tensor;

    /// Which backend this is.
    fn backend(&self) -> Backend;

    /// The device's name, as its driver reports it.
    fn device_name(&self) -> String;

    /// Copies host data to a new device tensor of `shape`, in `T`'s dtype.
    fn upload<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Self::Tensor>;

    /// Copies a device tensor back to the host; `T` must be the tensor's dtype.
    fn download<T: Element>(&self, t: &Self::Tensor) -> Result<Vec<T>>;

    /// Forward pass on device tensors: out (q's dtype) and lse (f32, natural log).
    fn forward(
        &self,
        cfg: &AttentionConfig,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
    ) -> Result<Forward<Self::Tensor>>;

    /// Backward pass on device tensors, from the forward's out and lse.
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        cfg: &AttentionConfig,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        out: &Self::Tensor,
        lse: &Self::Tensor,
        d_out: &Self::Tensor,
    ) -> Result<Gradients<Self::Tensor>>;

    /// [`backward`](AttentionBackend::backward) for [`backward_host`](AttentionBackend::backward_host),
    /// whose lse values were checked on the host already: a backend that reads lse back to
    /// check it on the device skips that read here. The default is `backward`.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn backward_lse_checked(
        &self,
        cfg: &AttentionConfig,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        out: &Self::Tensor,
        lse: &Self::Tensor,
        d_out: &Self::Tensor,
    ) -> Result<Gradients<Self::Tensor>> {
        self.backward(cfg, q, k, v, out, lse, d_out)
    }

    /// Merges partial results over disjoint key shards, `(out_i, lse_i)`, into the exact
    /// result over all their keys (module [`merge`](crate::merge)).
    fn merge(&self, shards: &[Forward<Self::Tensor>]) -> Result<Forward<Self::Tensor>>;

    /// Attention of q over a KV cache (`[batch, cfg.seq_kv, heads_kv, head_dim]` each, batch b
    /// holding `cache_seqlens[b]` rows), after appending `append` (`[batch, new, heads_kv,
    /// head_dim]` each) at each batch's length; aligned per batch (module
    /// [`kvcache`](crate::kvcache)).
    #[allow(clippy::too_many_arguments)]
    fn forward_with_kvcache(
        &self,
        cfg: &AttentionConfig,
        q: &Self::Tensor,
        k_cache: &mut Self::Tensor,
        v_cache: &mut Self::Tensor,
        cache_seqlens: &[usize],
        append: Option<(&Self::Tensor, &Self::Tensor)>,
    ) -> Result<Forward<Self::Tensor>>;

    /// [`forward_with_kvcache`](AttentionBackend::forward_with_kvcache) with a rotary
    /// embedding fused in (module [`rotary`](crate::rotary)): q rotated at its positions, the
    /// new keys before they are appended.
    #[allow(clippy::too_many_arguments)]
    fn forward_with_kvcache_rotary(
        &self,
        cfg: &AttentionConfig,
        q: &Self::Tensor,
        k_cache: &mut Self::Tensor,
        v_cache: &mut Self::Tensor,
        cache_seqlens: &[usize],
        append: Option<(&Self::Tensor, &Self::Tensor)>,
        rotary: Rotary<'_, Self::Tensor>,
    ) -> Result<Forward<Self::Tensor>>;

    /// An 8-bit KV cache (module [`kv_format`](crate::kv_format)) holding `data`
    /// (f32, `shape`'s values row-major), quantized on the host and uploaded; `head_scales`
    /// are E4M3's per-kv-head scales, `None` for Q8_0.
    fn quantized_cache(
        &self,
        format: CacheFormat,
        data: &[f32],
        shape: [usize; 4],
        head_scales: Option<&[f32]>,
    ) -> Result<QuantizedCache<Self::Tensor>> {
        let words = format.quantize(data, shape, head_scales)?;
        Ok(QuantizedCache {
            words: self.upload::<f32>(bytemuck::cast_slice(&words), &[words.len()])?,
            format,
            shape,
        })
    }

    /// The values an 8-bit cache holds, downloaded and dequantized on the host as the kernels
    /// read them.
    fn dequantize_cache(&self, cache: &QuantizedCache<Self::Tensor>) -> Result<Vec<f32>> {
        let words: Vec<f32> = self.download(&cache.words)?;
        cache
            .format
            .dequantize(bytemuck::cast_slice(&words), cache.shape)
    }

    /// [`forward_with_kvcache`](AttentionBackend::forward_with_kvcache) over 8-bit caches
    /// (module [`kv_format`](crate::kv_format)): the append quantized on the
    /// device, the kernels reading bytes and scales. wgpu only: `Unsupported` on CUDA.
    fn forward_with_quantized_kvcache(
        &self,
        cfg: &AttentionConfig,
        q: &Self::Tensor,
        caches: (
            &mut QuantizedCache<Self::Tensor>,
            &mut QuantizedCache<Self::Tensor>,
        ),
        cache_seqlens: &[usize],
        append: Option<(&Self::Tensor, &Self::Tensor)>,
    ) -> Result<Forward<Self::Tensor>>;

    /// [`forward_with_quantized_kvcache`](AttentionBackend::forward_with_quantized_kvcache)
    /// with a rotary embedding fused in: q rotated at its positions, the new keys before they
    /// are quantized into the cache. wgpu only: `Unsupported` on CUDA.
    #[allow(clippy::too_many_arguments)]
    fn forward_with_quantized_kvcache_rotary(
        &self,
        cfg: &AttentionConfig,
        q: &Self::Tensor,
        caches: (
            &mut QuantizedCache<Self::Tensor>,
            &mut QuantizedCache<Self::Tensor>,
        ),
        cache_seqlens: &[usize],
        append: Option<(&Self::Tensor, &Self::Tensor)>,
        rotary: Rotary<'_, Self::Tensor>,
    ) -> Result<Forward<Self::Tensor>>;

    /// GPU time of the most recent forward or backward call, where the backend measures it.
    fn last_gpu_timing(&self) -> Option<GpuTiming>;

    /// [`merge`](AttentionBackend::merge) on host slices: each shard's out shaped `out_shape`
    /// (`[batch, seq_q, heads_q, head_dim]`) in `T`, its lse f32 `[batch, heads_q, seq_q]`
    /// (finite, -inf or NaN; +inf is refused). Checks, uploads, merges, downloads.
    fn merge_host<T: Element>(
        &self,
        out_shape: &[usize],
        shards: &[HostForward<T>],
    ) -> Result<HostForward<T>> {
        let lse_shape = match *out_shape {
            [b, s, h, _] => vec![b, h, s],
            _ => Vec::new(),
        };
        let metas: Vec<crate::checks::ShardMeta<'_>> = shards
            .iter()
            .map(|_| crate::checks::ShardMeta {
                out: (out_shape, T::DTYPE),
                lse: (&lse_shape, crate::DType::F32),
            })
            .collect();
        crate::checks::check_shards(&metas)?;
        for s in shards {
            crate::checks::check_slice(crate::TensorRole::Out, s.out.len(), out_shape)?;
            crate::checks::check_slice(crate::TensorRole::Lse, s.lse.len(), &lse_shape)?;
            crate::checks::check_lse_values(&s.lse)?;
        }
        let on_device = shards
            .iter()
            .map(|s| {
                Ok(Forward {
                    out: self.upload(&s.out, out_shape)?,
                    lse: self.upload(&s.lse, &lse_shape)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let m = self.merge(&on_device)?;
        Ok(HostForward {
            out: self.download(&m.out)?,
            lse: self.download(&m.lse)?,
        })
    }

    /// Forward pass on host slices: checks, uploads, runs, downloads.
    fn forward_host<T: Element>(
        &self,
        cfg: &AttentionConfig,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<HostForward<T>> {
        crate::checks::check_forward_host(cfg, q, k, v)?;
        let f = self.forward(
            cfg,
            &self.upload(q, &cfg.q_shape())?,
            &self.upload(k, &cfg.kv_shape())?,
            &self.upload(v, &cfg.v_shape())?,
        )?;
        Ok(HostForward {
            out: self.download(&f.out)?,
            lse: self.download(&f.lse)?,
        })
    }

    /// Backward pass on host slices (lse in f32): checks, uploads, runs, downloads.
    #[allow(clippy::too_many_arguments)]
    fn backward_host<T: Element>(
        &self,
        cfg: &AttentionConfig,
        q: &[T],
        k: &[T],
        v: &[T],
        out: &[T],
        lse: &[f32],
        d_out: &[T],
    ) -> Result<HostGradients<T>> {
        check_backward_host(cfg, (q, k, v), out, lse, d_out)?;
        let (qs, kvs, os) = (cfg.q_shape(), cfg.kv_shape(), cfg.out_shape());
        let g = self.backward_lse_checked(
            cfg,
            &self.upload(q, &qs)?,
            &self.upload(k, &kvs)?,
            &self.upload(v, &cfg.v_shape())?,
            &self.upload(out, &os)?,
            &self.upload(lse, &cfg.lse_shape())?,
            &self.upload(d_out, &os)?,
        )?;
        Ok(HostGradients {
            dq: self.download(&g.dq)?,
            dk: self.download(&g.dk)?,
            dv: self.download(&g.dv)?,
            d_sinks: g.d_sinks.as_ref().map(|t| self.download(t)).transpose()?,
            d_bias: g.d_bias.as_ref().map(|t| self.download(t)).transpose()?,
        })
    }
}

impl AttentionBackend for crate::Context {
    type Tensor = crate::Tensor;

    fn backend(&self) -> Backend {
        Backend::Wgpu
    }

    fn device_name(&self) -> String {
        self.adapter_info().name.clone()
    }

    fn upload<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<crate::Tensor> {
        crate::Context::upload(self, data, shape)
    }

    fn download<T: Element>(&self, t: &crate::Tensor) -> Result<Vec<T>> {
        crate::Context::download(self, t)
    }

    fn forward(
        &self,
        cfg: &AttentionConfig,
        q: &crate::Tensor,
        k: &crate::Tensor,
        v: &crate::Tensor,
    ) -> Result<Forward> {
        crate::Context::forward(self, cfg, q, k, v)
    }

    fn backward(
        &self,
        cfg: &AttentionConfig,
        q: &crate::Tensor,
        k: &crate::Tensor,
        v: &crate::Tensor,
        out: &crate::Tensor,
        lse: &crate::Tensor,
        d_out: &crate::Tensor,
    ) -> Result<Gradients> {
        crate::Context::backward(self, cfg, q, k, v, out, lse, d_out)
    }

    fn merge(&self, shards: &[Forward]) -> Result<Forward> {
        crate::Context::merge(self, shards)
    }

    fn forward_with_kvcache(
        &self,
        cfg: &AttentionConfig,
        q: &crate::Tensor,
        k_cache: &mut crate::Tensor,
        v_cache: &mut crate::Tensor,
        cache_seqlens: &[usize],
        append: Option<(&crate::Tensor, &crate::Tensor)>,
    ) -> Result<Forward> {
        crate::Context::forward_with_kvcache(self, cfg, q, k_cache, v_cache, cache_seqlens, append)
    }

    fn forward_with_quantized_kvcache(
        &self,
        cfg: &AttentionConfig,
        q: &crate::Tensor,
        caches: (&mut QuantizedCache, &mut QuantizedCache),
        cache_seqlens: &[usize],
        append: Option<(&crate::Tensor, &crate::Tensor)>,
    ) -> Result<Forward> {
        crate::Context::forward_with_quantized_kvcache(self, cfg, q, caches, cache_seqlens, append)
    }

    fn forward_with_quantized_kvcache_rotary(
        &self,
        cfg: &AttentionConfig,
        q: &crate::Tensor,
        caches: (&mut QuantizedCache, &mut QuantizedCache),
        cache_seqlens: &[usize],
        append: Option<(&crate::Tensor, &crate::Tensor)>,
        rotary: Rotary<'_, crate::Tensor>,
    ) -> Result<Forward> {
        crate::Context::forward_with_quantized_kvcache_rotary(
            self,
            cfg,
            q,
            caches,
            cache_seqlens,
            append,
            rotary,
        )
    }

    fn forward_with_kvcache_rotary(
        &self,
        cfg: &AttentionConfig,
        q: &crate::Tensor,
        k_cache: &mut crate::Tensor,
        v_cache: &mut crate::Tensor,
        cache_seqlens: &[usize],
        append: Option<(&crate::Tensor, &crate::Tensor)>,
        rotary: Rotary<'_, crate::Tensor>,
    ) -> Result<Forward> {
        crate::Context::forward_with_kvcache_rotary(
            self,
            cfg,
            q,
            k_cache,
            v_cache,
            cache_seqlens,
            append,
            rotary,
        )
    }

    fn last_gpu_timing(&self) -> Option<GpuTiming> {
        crate::Context::last_gpu_timing(self)
    }

    /// lse was checked on the host: not read back again.
    fn backward_lse_checked(
        &self,
        cfg: &AttentionConfig,
        q: &crate::Tensor,
        k: &crate::Tensor,
        v: &crate::Tensor,
        out: &crate::Tensor,
        lse: &crate::Tensor,
        d_out: &crate::Tensor,
    ) -> Result<Gradients> {
        self.backward_lse_checked_on_host(cfg, (q, k, v), (out, lse, d_out))
    }
}
