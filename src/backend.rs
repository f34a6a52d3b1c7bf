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

/// The calls every backend offers, with the same semantics, layouts and errors. Each device
/// call is documented once, on the wgpu [`Context`](crate::Context)'s method of its name
/// (linked below), and each backend defines it as an inherent method that this trait
/// delegates to in one generated line; the host-slice calls are defined and documented once
/// here, and every backend has them as inherent methods too.
pub trait AttentionBackend {
    /// A device-resident tensor of this backend.
    type Tensor;

    /// Which backend this is.
    fn backend(&self) -> Backend;

    /// The device's name, as its driver reports it.
    fn device_name(&self) -> String;

    /// Copies host data to a new device tensor ([`Context::upload`](crate::Context::upload)).
    fn upload<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Self::Tensor>;

    /// Copies a device tensor back to the host
    /// ([`Context::download`](crate::Context::download)).
    fn download<T: Element>(&self, t: &Self::Tensor) -> Result<Vec<T>>;

    /// The forward pass on device tensors ([`Context::forward`](crate::Context::forward)).
    fn forward(
        &self,
        cfg: &AttentionConfig,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
    ) -> Result<Forward<Self::Tensor>>;

    /// The backward pass on device tensors
    /// ([`Context::backward`](crate::Context::backward)).
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

    /// Merges partial results over disjoint key shards ([`Context::merge`](crate::Context::merge)).
    fn merge(&self, shards: &[Forward<Self::Tensor>]) -> Result<Forward<Self::Tensor>>;

    /// Attention over a KV cache after an optional append
    /// ([`Context::forward_with_kvcache`](crate::Context::forward_with_kvcache)).
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

    /// The same with a rotary embedding fused in
    /// ([`Context::forward_with_kvcache_rotary`](crate::Context::forward_with_kvcache_rotary)).
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

    /// An 8-bit KV cache (module [`kv_format`](crate::kv_format)) holding `data` (f32,
    /// `shape`'s values row-major; zeros for an empty cache), quantized on the host by the
    /// kernels' rules ([`CacheFormat::quantize`]) and uploaded. `head_scales`: E4M3's
    /// per-kv-head scales (e.g. [`CacheFormat::e4m3_head_scales`] of a prefill), `None` for
    /// Q8_0. Typed errors for a head_dim that is not a multiple of 32, a wrong length or bad
    /// scales.
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
    /// read them (each byte times its scale in f32). Waits for the device.
    fn dequantize_cache(&self, cache: &QuantizedCache<Self::Tensor>) -> Result<Vec<f32>> {
        let words: Vec<f32> = self.download(&cache.words)?;
        cache
            .format
            .dequantize(bytemuck::cast_slice(&words), cache.shape)
    }

    /// Attention over 8-bit caches after an optional append
    /// ([`Context::forward_with_quantized_kvcache`](crate::Context::forward_with_quantized_kvcache)).
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

    /// The same with a rotary embedding fused in
    /// ([`Context::forward_with_quantized_kvcache_rotary`](crate::Context::forward_with_quantized_kvcache_rotary)).
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

    /// Attention over an MLA latent cache (values the first head_dim_v dims of each key row)
    /// after an optional append of keys
    /// ([`Context::forward_with_latent_cache`](crate::Context::forward_with_latent_cache)).
    fn forward_with_latent_cache(
        &self,
        cfg: &AttentionConfig,
        q: &Self::Tensor,
        cache: &mut Self::Tensor,
        cache_seqlens: &[usize],
        k_new: Option<&Self::Tensor>,
    ) -> Result<Forward<Self::Tensor>>;

    /// The same over an 8-bit latent cache
    /// ([`Context::forward_with_quantized_latent_cache`](crate::Context::forward_with_quantized_latent_cache)).
    fn forward_with_quantized_latent_cache(
        &self,
        cfg: &AttentionConfig,
        q: &Self::Tensor,
        cache: &mut QuantizedCache<Self::Tensor>,
        cache_seqlens: &[usize],
        k_new: Option<&Self::Tensor>,
    ) -> Result<Forward<Self::Tensor>>;

    /// GPU time of the most recent call, where the backend measures it
    /// ([`Context::last_gpu_timing`](crate::Context::last_gpu_timing)).
    fn last_gpu_timing(&self) -> Option<GpuTiming>;

    /// [`merge`](AttentionBackend::merge) on host slices: each shard's out shaped `out_shape`
    /// (`[batch, seq_q, heads_q, head_dim]`) in `T`, its lse f32 `[batch, heads_q, seq_q]`
    /// (finite, -inf or NaN; +inf is refused). Checks, uploads, merges, downloads (waits).
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

    /// The forward pass on host slices of f32, `half::f16` or `half::bf16`: checks, uploads,
    /// runs, downloads (waits). `out` comes back in the inputs' type, `lse` in f32.
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

    /// The backward pass on host slices of f32, `half::f16` or `half::bf16` (lse in f32):
    /// checks, uploads, runs, downloads (waits).
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
            d_table: g.d_table.as_ref().map(|t| self.download(t)).transpose()?,
        })
    }
}

/// Implements [`AttentionBackend`] for a backend whose inherent methods define the device
/// calls (each delegated here in one line), and gives that backend the trait's host-slice
/// calls as inherent methods too, so that its users need not import the trait. Each call
/// thus has one body and one doc: a device call's on the backend (the wgpu `Context`'s
/// states what every backend shares), a host call's on the trait. `$name` gives the
/// device's name; `$extra` holds the trait items a backend overrides beyond these.
macro_rules! attention_backend {
    ($ctx:ty, $tensor:ty, $backend:expr, |$c:ident| $name:expr $(, { $($extra:tt)* })?) => {
        impl crate::backend::AttentionBackend for $ctx {
            type Tensor = $tensor;
            fn backend(&self) -> crate::backend::Backend { $backend }
            fn device_name(&self) -> String { let $c = self; $name }
            fn upload<T: crate::dtype::Element>(
                &self,
                data: &[T],
                shape: &[usize],
            ) -> crate::error::Result<$tensor> {
                <$ctx>::upload(self, data, shape)
            }
            fn download<T: crate::dtype::Element>(
                &self,
                t: &$tensor,
            ) -> crate::error::Result<Vec<T>> {
                <$ctx>::download(self, t)
            }
            fn forward(
                &self,
                cfg: &crate::config::AttentionConfig,
                q: &$tensor,
                k: &$tensor,
                v: &$tensor,
            ) -> crate::error::Result<crate::outputs::Forward<$tensor>> {
                <$ctx>::forward(self, cfg, q, k, v)
            }
            fn backward(
                &self,
                cfg: &crate::config::AttentionConfig,
                q: &$tensor,
                k: &$tensor,
                v: &$tensor,
                out: &$tensor,
                lse: &$tensor,
                d_out: &$tensor,
            ) -> crate::error::Result<crate::outputs::Gradients<$tensor>> {
                <$ctx>::backward(self, cfg, q, k, v, out, lse, d_out)
            }
            fn merge(
                &self,
                shards: &[crate::outputs::Forward<$tensor>],
            ) -> crate::error::Result<crate::outputs::Forward<$tensor>> {
                <$ctx>::merge(self, shards)
            }
            fn forward_with_kvcache(
                &self,
                cfg: &crate::config::AttentionConfig,
                q: &$tensor,
                k_cache: &mut $tensor,
                v_cache: &mut $tensor,
                cache_seqlens: &[usize],
                append: Option<(&$tensor, &$tensor)>,
            ) -> crate::error::Result<crate::outputs::Forward<$tensor>> {
                <$ctx>::forward_with_kvcache(self, cfg, q, k_cache, v_cache, cache_seqlens, append)
            }
            fn forward_with_kvcache_rotary(
                &self,
                cfg: &crate::config::AttentionConfig,
                q: &$tensor,
                k_cache: &mut $tensor,
                v_cache: &mut $tensor,
                cache_seqlens: &[usize],
                append: Option<(&$tensor, &$tensor)>,
                rotary: crate::rotary::Rotary<'_, $tensor>,
            ) -> crate::error::Result<crate::outputs::Forward<$tensor>> {
                <$ctx>::forward_with_kvcache_rotary(
                    self, cfg, q, k_cache, v_cache, cache_seqlens, append, rotary,
                )
            }
            fn forward_with_quantized_kvcache(
                &self,
                cfg: &crate::config::AttentionConfig,
                q: &$tensor,
                caches: (&mut crate::kvcache::QuantizedCache<$tensor>,
                &mut crate::kvcache::QuantizedCache<$tensor>),
                cache_seqlens: &[usize],
                append: Option<(&$tensor, &$tensor)>,
            ) -> crate::error::Result<crate::outputs::Forward<$tensor>> {
                <$ctx>::forward_with_quantized_kvcache(self, cfg, q, caches, cache_seqlens, append)
            }
            fn forward_with_quantized_kvcache_rotary(
                &self,
                cfg: &crate::config::AttentionConfig,
                q: &$tensor,
                caches: (&mut crate::kvcache::QuantizedCache<$tensor>,
                &mut crate::kvcache::QuantizedCache<$tensor>),
                cache_seqlens: &[usize],
                append: Option<(&$tensor, &$tensor)>,
                rotary: crate::rotary::Rotary<'_, $tensor>,
            ) -> crate::error::Result<crate::outputs::Forward<$tensor>> {
                <$ctx>::forward_with_quantized_kvcache_rotary(
                    self, cfg, q, caches, cache_seqlens, append, rotary,
                )
            }
            fn forward_with_latent_cache(
                &self,
                cfg: &crate::config::AttentionConfig,
                q: &$tensor,
                cache: &mut $tensor,
                cache_seqlens: &[usize],
                k_new: Option<&$tensor>,
            ) -> crate::error::Result<crate::outputs::Forward<$tensor>> {
                <$ctx>::forward_with_latent_cache(self, cfg, q, cache, cache_seqlens, k_new)
            }
            fn forward_with_quantized_latent_cache(
                &self,
                cfg: &crate::config::AttentionConfig,
                q: &$tensor,
                cache: &mut crate::kvcache::QuantizedCache<$tensor>,
                cache_seqlens: &[usize],
                k_new: Option<&$tensor>,
            ) -> crate::error::Result<crate::outputs::Forward<$tensor>> {
                <$ctx>::forward_with_quantized_latent_cache(self, cfg, q, cache, cache_seqlens, k_new)
            }
            fn last_gpu_timing(
                &self,
            ) -> Option<crate::device::GpuTiming> {
                <$ctx>::last_gpu_timing(self)
            }
            $($($extra)*)?
        }

        /// The host-slice calls, defined once on [`AttentionBackend`](crate::AttentionBackend)
        /// and callable here without importing it.
        impl $ctx {
            /// [`AttentionBackend::forward_host`](crate::AttentionBackend::forward_host).
            pub fn forward_host<T: crate::dtype::Element>(
                &self,
                cfg: &crate::config::AttentionConfig,
                q: &[T],
                k: &[T],
                v: &[T],
            ) -> crate::error::Result<crate::outputs::HostForward<T>> {
                crate::backend::AttentionBackend::forward_host(self, cfg, q, k, v)
            }
            /// [`AttentionBackend::backward_host`](crate::AttentionBackend::backward_host).
            #[allow(clippy::too_many_arguments)]
            pub fn backward_host<T: crate::dtype::Element>(
                &self,
                cfg: &crate::config::AttentionConfig,
                q: &[T],
                k: &[T],
                v: &[T],
                out: &[T],
                lse: &[f32],
                d_out: &[T],
            ) -> crate::error::Result<crate::outputs::HostGradients<T>> {
                crate::backend::AttentionBackend::backward_host(self, cfg, q, k, v, out, lse, d_out)
            }
            /// [`AttentionBackend::merge_host`](crate::AttentionBackend::merge_host).
            pub fn merge_host<T: crate::dtype::Element>(
                &self,
                out_shape: &[usize],
                shards: &[crate::outputs::HostForward<T>],
            ) -> crate::error::Result<crate::outputs::HostForward<T>> {
                crate::backend::AttentionBackend::merge_host(self, out_shape, shards)
            }
            /// [`AttentionBackend::quantized_cache`](crate::AttentionBackend::quantized_cache).
            pub fn quantized_cache(
                &self,
                format: crate::kv_format::CacheFormat,
                data: &[f32],
                shape: [usize; 4],
                head_scales: Option<&[f32]>,
            ) -> crate::error::Result<crate::kvcache::QuantizedCache<$tensor>> {
                use crate::backend::AttentionBackend as B;
                B::quantized_cache(self, format, data, shape, head_scales)
            }
            /// [`AttentionBackend::dequantize_cache`](crate::AttentionBackend::dequantize_cache).
            pub fn dequantize_cache(
                &self,
                cache: &crate::kvcache::QuantizedCache<$tensor>,
            ) -> crate::error::Result<Vec<f32>> {
                crate::backend::AttentionBackend::dequantize_cache(self, cache)
            }
        }
    };
}
#[cfg_attr(not(feature = "cuda"), allow(unused_imports))]
pub(crate) use attention_backend;

attention_backend!(
    crate::Context,
    crate::Tensor,
    Backend::Wgpu,
    |c| c.adapter_info().name.clone(),
    {
        /// lse was checked on the host: not read back again.
        #[allow(clippy::too_many_arguments)]
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
);
