//! Flash attention for [burn](https://burn.dev) on its wgpu backend: the fused forward of
//! `flash-attn-wgpu`, and under autodiff its fused backward (which saves out and the
//! logsumexp, never the probabilities) as the operation's gradient.
//!
//! ```no_run
//! use burn::tensor::{Distribution, Tensor};
//! use flash_attn_burn::{flash_attention, Options};
//! // burn and flash attention on one wgpu device and queue; `.autodiff()` to train
//! let device = flash_attn_burn::init()?.autodiff();
//! let q = Tensor::<4>::random([2, 8, 100, 64], Distribution::Default, &device).require_grad();
//! let k = Tensor::<4>::random([2, 2, 100, 64], Distribution::Default, &device).require_grad();
//! let v = Tensor::<4>::random([2, 2, 100, 64], Distribution::Default, &device).require_grad();
//! let out = flash_attention(q.clone(), k, v, &Options { causal: true, ..Options::default() })?;
//! let grads = out.sum().backward(); // dq, dk, dv from the fused backward
//! let dq = q.grad(&grads);
//! # Ok::<(), flash_attn_wgpu::Error>(())
//! ```
//!
//! Layout is burn's: `[batch, heads, seq, head_dim]` (k and v may have fewer heads: GQA).
//! Inputs are read where burn keeps them (any strides with a contiguous last dimension), and
//! results land in tensors burn allocated; nothing crosses to the host. How the work is
//! ordered with burn's own: before recording, burn's pending work is flushed to the shared
//! queue; ours is submitted to that queue next; burn's later work is submitted after it.
//!
//! Requirements and limits: the device comes from [`init`] (or [`register`]), which shares
//! one wgpu device and queue between burn and the attention kernels. The operation is
//! implemented for burn's cubecl backend, for autodiff over it and (feature `fusion`, on by
//! default as in burn) for burn's Fusion backend, whose default wgpu backend it is: there the
//! call is a lazy operation in burn's stream, run in order with burn's own work. A burn built
//! without fusion takes this crate with `default-features = false`. Errors in the forward are
//! returned as [`Error`]; the backward runs inside burn's `backward()`, which has no error
//! channel: a device failure there panics with the library's message (every input was checked
//! by the forward that recorded it).

mod ops;
mod registry;

use burn::tensor::{Device, Tensor};
pub use flash_attn_wgpu::{Dropout, Error, Result, Window};
pub use registry::{init, init_with, register};

/// What the call computes beside plain softmax attention: flash-attn's options, in burn's
/// layout. `Default` is plain attention with the scale `1 / sqrt(head_dim)`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options {
    /// Bottom-right aligned causal mask: query i sees key j iff `j <= i + seq_kv - seq_q`.
    pub causal: bool,
    /// Sliding window (local attention), composes with `causal`.
    pub window: Window,
    /// `None`: `1 / sqrt(head_dim)`.
    pub softmax_scale: Option<f32>,
    /// Softcap c > 0: each scaled score s becomes `c * tanh(s / c)` (Gemma 2).
    pub softcap: Option<f32>,
    /// ALiBi slopes, one per query head (`[heads]`) or per batch and head (`[batch * heads]`).
    pub alibi_slopes: Option<Vec<f32>>,
    /// Key padding: batch b sees its first `key_lengths[b]` keys only (`[batch]`). A query
    /// row that sees no key gets out 0.
    pub key_lengths: Option<Vec<usize>>,
    /// Left padding: batch b's keys before `key_starts[b]` are hidden too (`[batch]`, each at
    /// most the batch's key length; left-padded batches, flash-attn's `cache_leftpad`).
    /// Positions are not renumbered: the causal diagonal, window and ALiBi stay aligned to
    /// the end of the keys.
    pub key_starts: Option<Vec<usize>>,
    /// Dropout on the attention probabilities (probability, Philox seed and offset), drawn
    /// in the forward and drawn again, identically, by the fused backward: nothing is saved
    /// for it. One seed and offset give one mask: advance the offset (or change the seed)
    /// every step. Not in the KV-cache call (inference).
    pub dropout: Option<Dropout>,
}

impl Options {
    /// The library's config for q `[batch, heads_q, seq_q, head_dim]` and k
    /// `[batch, heads_kv, seq_kv, head_dim]`, checked.
    fn config(&self, q: [usize; 4], k: [usize; 4]) -> Result<flash_attn_wgpu::AttentionConfig> {
        let mut cfg = flash_attn_wgpu::AttentionConfig::from_shape(flash_attn_wgpu::Shape {
            batch: q[0],
            seq_q: q[2],
            seq_kv: k[2],
            heads_q: q[1],
            heads_kv: k[1],
            head_dim: q[3],
        });
        cfg.causal = self.causal;
        cfg.window = self.window;
        cfg.softmax_scale = self.softmax_scale;
        cfg.softcap = self.softcap;
        cfg.alibi_slopes = self.alibi_slopes.clone();
        cfg.seqlens_kv = self.key_lengths.clone();
        cfg.leftpad_kv = self.key_starts.clone();
        cfg.dropout = self.dropout;
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Softmax attention of `q` over `k` and `v` (`[batch, heads, seq, head_dim]`), fused; under
/// autodiff its gradient is the fused backward. Returns `[batch, heads_q, seq_q, head_dim]`
/// in q's dtype (f32, f16 or bf16).
pub fn flash_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    options: &Options,
) -> Result<Tensor<4>> {
    flash_attention_with_lse(q, k, v, options).map(|(out, _)| out)
}

/// [`flash_attention`] and the logsumexp of each row's scaled scores, `[batch, heads_q,
/// seq_q]` in f32 (natural log; -inf for a row that sees no key). The lse takes no gradient.
pub fn flash_attention_with_lse(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    options: &Options,
) -> Result<(Tensor<4>, Tensor<3>)> {
    let cfg = ops::check(&q, &k, &v, options)?;
    let (out, lse) = <burn::backend::Dispatch as ops::FlashAttentionOps>::flash_attention(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        cfg,
    );
    Ok((Tensor::from_dispatch(out), Tensor::from_dispatch(lse)))
}

/// [`flash_attention`] with an additive bias on the scaled scores (after the softcap and
/// ALiBi, before masking and softmax; a -inf entry hides its pair): `[batch or 1, heads_q or
/// 1, seq_q, seq_kv]` in q's dtype, broadcast over a dimension of 1 (relative-position
/// biases, PyTorch's float `attn_mask`). Under autodiff the bias gets its gradient, summed
/// over the dimensions it broadcasts. The kernels take the bias as pair data, so its values
/// are read to the host once per call: the one host copy of this crate's API.
pub fn flash_attention_with_bias(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
    options: &Options,
) -> Result<(Tensor<4>, Tensor<3>)> {
    let cfg = ops::check_biased(&q, &k, &v, &bias, options)?;
    let (out, lse) = <burn::backend::Dispatch as ops::FlashAttentionOps>::flash_attention_biased(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        bias.into_dispatch(),
        cfg,
    );
    Ok((Tensor::from_dispatch(out), Tensor::from_dispatch(lse)))
}

/// Attention of `q` (`[batch, heads_q, new, head_dim]`, a few rows: decode) over a KV cache
/// kept as burn tensors `[batch, heads_kv, capacity, head_dim]`, after appending `append`
/// (`[batch, heads_kv, new, head_dim]` each) at each batch's length `cache_seqlens[b]` (the
/// rows it holds before the call; the caller advances them): flash-attn's
/// `flash_attn_with_kvcache`. The appends are burn's `slice_assign` on the caches (in place
/// where burn holds the only reference); the attention reads the caches where they lie, each
/// batch over its first `cache_seqlens[b] + new` keys, with the causal mask and the window
/// aligned to that length (query row i sits at key `i + cache_seqlens[b]`). Forward only
/// (inference); `options.key_lengths` must be `None` (the lengths come from
/// `cache_seqlens`); `options.key_starts` is flash-attn's `cache_leftpad`.
pub fn flash_attention_with_kvcache(
    q: Tensor<4>,
    k_cache: &mut Tensor<4>,
    v_cache: &mut Tensor<4>,
    cache_seqlens: &[usize],
    append: Option<(Tensor<4>, Tensor<4>)>,
    options: &Options,
) -> Result<Tensor<4>> {
    let [b, hkv, cap, d] = k_cache.dims();
    let new = append.as_ref().map_or(0, |(k, _)| k.dims()[2]);
    if let Some((k, v)) = &append {
        for (role, t) in [
            (flash_attn_wgpu::TensorRole::K, k),
            (flash_attn_wgpu::TensorRole::V, v),
        ] {
            if t.dims() != [b, hkv, new, d] {
                return Err(Error::Shape {
                    tensor: role,
                    expected: vec![b, hkv, new, d],
                    got: t.dims().to_vec(),
                });
            }
        }
    }
    if cache_seqlens.len() != b {
        return Err(Error::InvalidConfig(format!(
            "cache_seqlens: one length per batch, {b} expected, {} given",
            cache_seqlens.len()
        )));
    }
    if let Some((i, &l)) = cache_seqlens
        .iter()
        .enumerate()
        .find(|(_, &l)| l + new > cap)
    {
        return Err(Error::InvalidConfig(format!(
            "KV cache: batch {i} holds {l} rows and appends {new}, past the capacity {cap}"
        )));
    }
    if options.key_lengths.is_some() {
        return Err(Error::InvalidConfig(
            "flash_attention_with_kvcache: key_lengths must be None (cache_seqlens gives them)"
                .into(),
        ));
    }
    if options.dropout.is_some() {
        return Err(Error::InvalidConfig(
            "flash_attention_with_kvcache: dropout must be None (a KV-cache call is inference)"
                .into(),
        ));
    }
    let mut cfg = ops::check(&q, k_cache, v_cache, options)?;
    cfg.seqlens_kv = Some(cache_seqlens.iter().map(|l| l + new).collect());
    cfg.align_to_seqlens = true;
    cfg.validate()?;
    if let Some((k, v)) = append {
        for (bi, &l) in cache_seqlens.iter().enumerate() {
            let at = [bi..bi + 1, 0..hkv, l..l + new, 0..d];
            let row = [bi..bi + 1, 0..hkv, 0..new, 0..d];
            *k_cache = k_cache
                .clone()
                .slice_assign(at.clone(), k.clone().slice(row.clone()));
            *v_cache = v_cache.clone().slice_assign(at, v.clone().slice(row));
        }
    }
    let (out, _) = <burn::backend::Dispatch as ops::FlashAttentionOps>::flash_attention(
        q.into_dispatch(),
        k_cache.clone().into_dispatch(),
        v_cache.clone().into_dispatch(),
        cfg,
    );
    Ok(Tensor::from_dispatch(out))
}

/// The flash-attention context serving `device` (made by [`init`] or [`register`]).
pub fn context(device: &Device) -> Result<std::sync::Arc<flash_attn_wgpu::Context>> {
    registry::for_device(&registry::cube_device(device)?)
}
