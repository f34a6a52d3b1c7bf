//! KV caches stored in 8 bits ([`CacheFormat`]: q8_0 blocks or fp8 E4M3 with per-head
//! scales): a decode step reads the whole cache, so its time is the cache's bytes, and these
//! take about half of f16's. The kernels read the bytes and scale them as they load (the math
//! stays f32); an append quantizes the new rows on the GPU, in the call's submission.
//!
//! ```no_run
//! use flash_attn_wgpu::{AttentionConfig, CacheFormat, Context};
//! let ctx = Context::new()?;
//! let cfg = AttentionConfig::new(1, 1, 4096, 32, 8, 128); // seq_kv: the capacity
//! let zeros = vec![0f32; cfg.kv_shape().iter().product()];
//! let mut k = ctx.quantized_cache(CacheFormat::Q8_0, &zeros, cfg.kv_shape(), None)?;
//! let mut v = ctx.quantized_cache(CacheFormat::Q8_0, &zeros, cfg.kv_shape(), None)?;
//! let q = ctx.zeros(&cfg.q_shape())?;
//! let new = ctx.zeros(&[1, 1, 8, 128])?;
//! let f = ctx.forward_with_quantized_kvcache(&cfg, &q, (&mut k, &mut v), &[0], Some((&new, &new)))?;
//! # Ok::<(), flash_attn_wgpu::Error>(())
//! ```

use super::append_runs;
use crate::config::AttentionConfig;
use crate::device::Context;
use crate::error::{Error, Result, TensorRole};
use crate::outputs::Forward;
use crate::rotary::Rotary;
use crate::tensor::Tensor;

pub use super::cache::QuantizedCache;

impl Context {
    /// [`forward_with_kvcache`](Context::forward_with_kvcache) over 8-bit caches: appends
    /// `append = Some((k_new, v_new))` (`[batch, new, heads_kv, head_dim]`, v_new `head_dim_v`
    /// wide, in q's dtype, row-major) quantized on the GPU at each batch's length, then attends
    /// q over each batch's keys, every kernel reading the caches' bytes and scales. Both caches
    /// take one format, the k cache `cfg.kv_shape()` and the v cache `cfg.v_shape()`; dense or paged (`cfg.paged`), left padding, every modifier as
    /// the unquantized call. One submission, no wait. A cache past one binding is a typed
    /// `DeviceLimit`.
    pub fn forward_with_quantized_kvcache(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        (k_cache, v_cache): (&mut QuantizedCache, &mut QuantizedCache),
        cache_seqlens: &[usize],
        append: Option<(&Tensor, &Tensor)>,
    ) -> Result<Forward> {
        self.quantized_kvcache_impl(
            cfg,
            q,
            (&*k_cache, Some(&*v_cache)),
            cache_seqlens,
            append.map(|(k, v)| (k, Some(v))),
            (None, None),
        )
    }

    /// [`forward_with_quantized_kvcache`](Context::forward_with_quantized_kvcache) with a
    /// rotary embedding fused in, as
    /// [`forward_with_kvcache_rotary`](Context::forward_with_kvcache_rotary): q rotated at its
    /// positions and the new keys before they are quantized into the cache, in the same
    /// submission.
    pub fn forward_with_quantized_kvcache_rotary(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        (k_cache, v_cache): (&mut QuantizedCache, &mut QuantizedCache),
        cache_seqlens: &[usize],
        append: Option<(&Tensor, &Tensor)>,
        rotary: Rotary<'_, Tensor>,
    ) -> Result<Forward> {
        self.quantized_kvcache_impl(
            cfg,
            q,
            (&*k_cache, Some(&*v_cache)),
            cache_seqlens,
            append.map(|(k, v)| (k, Some(v))),
            (None, Some(rotary)),
        )
    }

    /// [`forward_with_quantized_kvcache`](Context::forward_with_quantized_kvcache) writing into
    /// `dst` (an earlier step's result) as
    /// [`forward_with_kvcache_into`](Context::forward_with_kvcache_into).
    pub fn forward_with_quantized_kvcache_into(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        (k_cache, v_cache): (&mut QuantizedCache, &mut QuantizedCache),
        cache_seqlens: &[usize],
        append: Option<(&Tensor, &Tensor)>,
        dst: &Forward,
    ) -> Result<()> {
        self.quantized_kvcache_impl(
            cfg,
            q,
            (&*k_cache, Some(&*v_cache)),
            cache_seqlens,
            append.map(|(k, v)| (k, Some(v))),
            (Some(dst), None),
        )
        .map(drop)
    }

    /// Separate 8-bit k and v caches, or a latent one (`v_cache` None: the values are read
    /// from the keys' records, and an append brings keys alone).
    pub(crate) fn quantized_kvcache_impl(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        (k_cache, v_cache): (&QuantizedCache, Option<&QuantizedCache>),
        cache_seqlens: &[usize],
        append: Option<(&Tensor, Option<&Tensor>)>,
        (dst, rotary): (Option<&Forward>, Option<Rotary<'_, Tensor>>),
    ) -> Result<Forward> {
        let dtype = q.dtype();
        let latent = v_cache.is_none();
        let (c, new_rows) = self.kvcache_step(cfg, q, cache_seqlens, append, latent)?;
        // the quantizing kernel reads row-major new rows
        for (name, t) in append.into_iter().flat_map(|(k, v)| {
            [("k_new", Some(k)), ("v_new", v)]
                .into_iter()
                .filter_map(|(n, t)| Some((n, t?)))
        }) {
            if t.needs_view() {
                return Err(crate::tensor::strided_unsupported(
                    &format!("a quantizing append ({name})"),
                    t,
                ));
            }
        }
        let format = k_cache.format;
        let caches = [
            Some((TensorRole::K, k_cache, c.kv_shape(), "cfg.kv_shape()")),
            v_cache.map(|v| (TensorRole::V, v, c.v_shape(), "cfg.v_shape()")),
        ];
        for (role, cache, shape, name) in caches.into_iter().flatten() {
            self.check_owned(&cache.words, || format!("{role} cache"))?;
            if cache.shape != shape {
                return Err(Error::Shape {
                    tensor: role,
                    expected: shape.to_vec(),
                    got: cache.shape.to_vec(),
                });
            }
            if cache.format != format {
                return Err(Error::invalid(format!(
                    "the {role} cache must be {format} (the k cache's format; its shape is \
                     {name}), got {}",
                    cache.format
                )));
            }
        }
        // with a rotary embedding, q and the new keys turn first, in the same encoder
        let mut enc = rotary.map(|_| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("rotary + quantized kvcache"),
                })
        });
        let turned = match (rotary, enc.as_mut()) {
            (Some(r), Some(e)) => {
                Some(self.rotate_for_kvcache(e, cfg, cache_seqlens, q, append.map(|a| a.0), r)?)
            }
            _ => None,
        };
        let (q, append) = match &turned {
            Some((q_rot, k_rot)) => (q_rot, append.zip(k_rot.as_ref()).map(|((_, v), k)| (k, v))),
            None => (q, append),
        };
        let v_words = &v_cache.unwrap_or(k_cache).words;
        let env = self.plan_env();
        let mut plan = crate::plan::forward(&c, dtype, &env)?;
        crate::plan::quantized::read_cache(&mut plan, format, &c, &env)?;
        let mut inputs: Vec<&Tensor> = vec![q, &k_cache.words, v_words];
        if let Some((k_new, v_new)) = append {
            // new row r (batch-major) goes to cache row rows[r]
            let mut rows = vec![0u32; c.batch * new_rows];
            for (b, &len) in cache_seqlens.iter().enumerate() {
                for (from, to, n) in append_runs(&c, b, len, new_rows) {
                    for k in 0..n {
                        rows[from + k] = u32::try_from(to + k).map_err(|_| {
                            Error::invalid("a cache of 2^32 rows or more".to_string())
                        })?;
                    }
                }
            }
            // each cache's records are its own head dim wide (head_dim_v for the values); a
            // latent cache's new rows are quantized once, as keys
            let first = plan.inputs.len();
            let mut pairs = vec![(first, 1, c.head_dim)];
            plan.inputs.push(TensorRole::KNew);
            inputs.push(k_new);
            if let Some(v_new) = v_new {
                pairs.push((first + 1, 2, c.dv()));
                plan.inputs.push(TensorRole::VNew);
                inputs.push(v_new);
            }
            crate::plan::quantized::append(&mut plan, format, (&c, dtype, &env), &pairs, &rows)?;
        }
        let given = dst.map(|d| [&d.out, &d.lse]);
        let outputs =
            self.execute_into(&plan, &inputs, enc.as_mut(), given.as_ref().map(|g| &g[..]))?;
        if let Some(e) = enc {
            self.scoped(|| self.queue.submit([e.finish()]))?;
        }
        Forward::from_outputs(outputs, "forward")
    }
}
