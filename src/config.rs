//! What the caller asks for: shapes, masking, scale and algorithm, and their validation.

use crate::bias::ScoreBias;
use crate::block_mask::BlockMask;
use crate::bool_mask::BoolMask;
use crate::dropout::Dropout;
use crate::error::{Error, Result};
use crate::varlen::Varlen;

/// Largest head dimension every kernel family is built for (q, k and v alike).
pub const MAX_HEAD_DIM: usize = 256;

/// Largest query/key head dimension a call may have (MLA's 512 latent + 64 rotary dims):
/// past [`MAX_HEAD_DIM`] only the paths docs/SEMANTICS.md names run it ("Head dims").
pub const MAX_HEAD_DIM_QK: usize = 576;

/// Largest value head dimension a call may have ([`AttentionConfig::head_dim_v`], MLA's 512).
pub const MAX_HEAD_DIM_V: usize = 512;

/// Which implementation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// FlashAttention: Q/K/V tiles in workgroup memory, online softmax, no seq_q x seq_kv buffer.
    #[default]
    Tiled,
    /// Standard attention: S = scale * Q K^T and P = softmax(S) materialized in global memory.
    Naive,
}

/// A sliding window around the bottom-right aligned diagonal (flash-attn's `window_size`):
/// query row i, at key position i' = i + seq_kv - seq_q, sees key j iff
/// `i' - left <= j <= i' + right`. `None` leaves that side unbounded; both `None` is no window.
/// With `causal`, `right` is at most 0 (causal is the window `(None, Some(0))`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Window {
    /// How many keys before the query's aligned position a row sees (`None`: all of them).
    pub left: Option<usize>,
    /// How many keys after it a row sees (`None`: all of them).
    pub right: Option<usize>,
}

impl Window {
    /// Largest bound a side takes: the kernels compare key offsets in 32-bit integers.
    pub const MAX_SIDE: usize = 1 << 30;

    /// A window of `left` keys before and `right` keys after each row's aligned position.
    pub fn new(left: Option<usize>, right: Option<usize>) -> Window {
        Window { left, right }
    }

    /// True when the window hides anything (a side is bounded).
    pub fn is_active(&self) -> bool {
        self.left.is_some() || self.right.is_some()
    }
}

/// Shapes and options of one attention call.
///
/// Layouts (row-major): q is `[batch, seq_q, heads_q, head_dim]`, k `[batch, seq_kv,
/// heads_kv, head_dim]`, v `[batch, seq_kv, heads_kv, dv]` and out `[batch, seq_q, heads_q,
/// dv]` (dv = [`head_dim_v`](AttentionConfig::head_dim_v), by default head_dim), lse
/// `[batch, heads_q, seq_q]` (natural log).
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionConfig {
    /// Sequences in the batch (1 for a packed varlen call).
    pub batch: usize,
    /// Query rows per sequence (the packed total with varlen).
    pub seq_q: usize,
    /// Keys per sequence (the packed total with varlen; with `paged`, pages_per_seq * page_size).
    pub seq_kv: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads: divides heads_q (GQA; 1 is MQA).
    pub heads_kv: usize,
    /// Elements per query and key head, 1 to [`MAX_HEAD_DIM`] (to [`MAX_HEAD_DIM_QK`] on the
    /// paths that take wider heads: docs/SEMANTICS.md, "Head dims").
    pub head_dim: usize,
    /// Elements per value (and output) head where they differ from `head_dim` (DeepSeek's
    /// 192/128 prefill, MLA's 576/512 decode), 1 to [`MAX_HEAD_DIM_V`]; `None`: `head_dim`.
    /// Not every path runs a call whose dims differ: the others refuse it with
    /// `Error::Unsupported` (docs/SEMANTICS.md, "Head dims").
    pub head_dim_v: Option<usize>,
    /// MLA's latent cache (FlashMLA's layout): the values are the first `head_dim_v` dims of
    /// each key row, stored once; there is no separate v. Set by the latent-cache calls
    /// ([`Context::forward_with_latent_cache`](crate::Context::forward_with_latent_cache) and
    /// its 8-bit form), which take the one cache; a call that takes a separate v refuses it
    /// (`Error::InvalidConfig`). `head_dim_v` must be at most `head_dim`. Default false.
    pub values_in_keys: bool,
    /// Bottom-right aligned causal mask: query i sees key j iff `j <= i + seq_kv - seq_q`.
    pub causal: bool,
    /// Sliding window (local attention); composes with `causal`. Default: none.
    pub window: Window,
    /// Softcap c > 0 (Gemma 2, Grok): each scaled score s becomes `c * tanh(s / c)` before
    /// masking and softmax; the backward differentiates through tanh. `None`: off.
    pub softcap: Option<f32>,
    /// ALiBi (BLOOM, MPT): f32 slopes, one per query head (`[heads_q]`) or one per batch
    /// and query head (`[batch, heads_q]`). Adds `-slope * |i' - j|` (i' = i + seq_kv -
    /// seq_q, aligned as the causal mask) to each scaled score, after the softcap and before
    /// masking and softmax. The slopes take no gradient. `None`: off.
    pub alibi_slopes: Option<Vec<f32>>,
    /// Attention sinks (gpt-oss): one f32 logit per query head (`[heads_q]`) that joins every
    /// row's softmax denominator and carries no value: `lse = ln(sum_j exp(s_j) + exp(sink))`,
    /// the lse returned includes it, and a row that sees no key gets out = 0 and lse = sink.
    /// The backward returns `d_sinks`. `None`: off.
    pub sinks: Option<Vec<f32>>,
    /// Per-batch key lengths on the padded layout (`[batch]`, each at most `seq_kv`): keys
    /// at or past `seqlens_kv[b]` are hidden from every row of batch b (the key-padding mask
    /// of batched training). It does not move the causal or window alignment, which stays
    /// relative to `seq_kv`, unless `align_to_seqlens` is set. A row that sees no key gets
    /// out 0 and lse -inf (or the sink). `None`: every key of every batch.
    pub seqlens_kv: Option<Vec<usize>>,
    /// With `seqlens_kv`: align batch b's causal diagonal, window and ALiBi positions to its
    /// own key length (query i sits at position `i + seqlens_kv[b] - seq_q`), as a KV cache
    /// holds its keys (flash-attn's `flash_attn_with_kvcache`); false: to `seq_kv`.
    pub align_to_seqlens: bool,
    /// Per-batch left padding of the keys (`[batch]`; flash-attn's `cache_leftpad`): keys
    /// before `leftpad_kv[b]` are hidden from every row of batch b, as keys at or past its
    /// length are. Positions do not move: the causal diagonal, window and ALiBi stay where
    /// they were (aligned to the end of the keys), as in flash-attn. Each entry at most the
    /// batch's key length (`seqlens_kv[b]`, or `seq_kv`). Not with varlen. `None`: no padding.
    pub leftpad_kv: Option<Vec<usize>>,
    /// K and V in pages through a block table ([`crate::PagedKv`]): k and v are the page
    /// pools `[num_pages, page_size, heads_kv, head_dim]` and `seq_kv` is `pages_per_seq x
    /// page_size`. Forward only (wgpu); `None`: k and v are `[batch, seq_kv, heads_kv,
    /// head_dim]`.
    pub paged: Option<crate::PagedKv>,
    /// Dropout on the attention probabilities ([`Dropout`]: probability, seed, offset), in the
    /// forward and the backward, which regenerates the forward's mask. `None`: off.
    pub dropout: Option<Dropout>,
    /// Block-sparse attention ([`BlockMask`]): pairs whose block is off are hidden, and tiles
    /// whose blocks are all off are skipped. `None`: every block.
    pub block_mask: Option<BlockMask>,
    /// A boolean mask over pairs ([`BoolMask`], PyTorch's boolean `attn_mask`): true means the
    /// pair takes part; broadcast over batch and heads. `None`: every pair.
    pub mask: Option<BoolMask>,
    /// An additive bias over pairs ([`ScoreBias`], PyTorch's float `attn_mask`), broadcast
    /// over batch and heads, added to each scaled score after the softcap and ALiBi; with
    /// `ScoreBias::grad` the backward returns `d_bias`. `None`: no bias.
    pub bias: Option<ScoreBias>,
    /// Variable-length sequences packed into batch 1 ([`Varlen`]: cumulative lengths): each
    /// sequence attends only within itself, with causal, window and ALiBi aligned per
    /// sequence. [`AttentionConfig::packed`] builds such a call. `None`: padded batches.
    pub varlen: Option<Varlen>,
    /// A user-defined score modifier (FlexAttention's `score_mod`): WGSL (and CUDA C) that
    /// every kernel applies to each visible pair's score after the built-in modifiers, with
    /// its derivative in the backward ([`crate::ScoreMod`]). None: off.
    pub score_mod: Option<crate::ScoreMod>,
    /// A user-defined mask (FlexAttention's `mask_mod`): WGSL that every kernel applies with
    /// the other masks ([`crate::MaskMod`]); with the block mask `Context::create_block_mask`
    /// gives from it, blocks it hides are skipped. None: off.
    pub mask_mod: Option<crate::MaskMod>,
    /// `None` means `1 / sqrt(head_dim)`.
    pub softmax_scale: Option<f32>,
    /// Tiled (FlashAttention, the default) or naive (for comparison).
    pub algorithm: Algorithm,
    /// Decode calls (a few query rows: [`crate::plan::route::Route::Decode`]) split the keys
    /// into this many parts computed in parallel and merged exactly (split-KV,
    /// FlashDecoding); `None`: as many as [`crate::plan::decode::kv_splits`] picks. 1 to
    /// [`MAX_KV_SPLITS`]; splits past the keys are empty. Other calls ignore it.
    pub kv_splits: Option<usize>,
    /// This call is one block of a larger call ([`Block`]): its rows and keys are a range of
    /// that call's, and every position-aware mask and modifier sees the larger call's
    /// indices. None: the call is whole. What context parallelism and key shards merge.
    pub block: Option<Block>,
}

/// One block of a larger call: rows `q0..q0 + seq_q` and keys `k0..k0 + seq_kv` of a call of
/// `whole_seq_q` rows and `whole_seq_kv` keys (the batch, the heads and every modifier are
/// the block call's own config's), where `seq_q`, `seq_kv` are the block call's. The causal
/// diagonal and the window are aligned in the whole call (bottom-right, as ever), ALiBi's
/// distances, a user `score_mod`'s and `mask_mod`'s `i` and `j`, a block mask's blocks and
/// dropout's random numbers are the whole call's at those indices; `out` and `lse` are the
/// block's over its keys alone, which [`Context::merge`](crate::Context::merge) folds with
/// the other key blocks of the same rows into the whole call's, and the backward of a block
/// with the whole call's `out` and `lse` gives its keys' dK, dV and its part of dQ (the parts
/// sum to the whole call's). Sinks count as one more key: give them to one block of a row's.
/// Refused (`Unsupported`) with a bias, a boolean mask, per-batch key lengths, varlen,
/// paged or latent caches, and calls past one storage binding; the CUDA backend refuses
/// blocks. Checked by `validate`: the ranges within the whole call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Block {
    /// The whole call's query rows.
    pub whole_seq_q: usize,
    /// The whole call's keys.
    pub whole_seq_kv: usize,
    /// The block's first row in the whole call.
    pub q0: usize,
    /// The block's first key in the whole call.
    pub k0: usize,
}

/// The most key splits a decode call may ask for ([`AttentionConfig::kv_splits`]).
pub const MAX_KV_SPLITS: usize = 1024;

/// The six sizes of a call, by name, so that a swap reads wrong in the source:
///
/// ```
/// use flash_attn_wgpu::{AttentionConfig, Shape};
/// let cfg = AttentionConfig {
///     causal: true,
///     ..AttentionConfig::from_shape(Shape {
///         batch: 2,
///         seq_q: 128,
///         seq_kv: 128,
///         heads_q: 32,
///         heads_kv: 8,
///         head_dim: 64,
///     })
/// };
/// assert_eq!(cfg.group(), 4);
/// assert_eq!(cfg.shape().heads_kv, 8);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Sequences in the batch (1 for a packed varlen call).
    pub batch: usize,
    /// Query rows per sequence.
    pub seq_q: usize,
    /// Keys per sequence.
    pub seq_kv: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads: divides heads_q.
    pub heads_kv: usize,
    /// Elements per head, 1 to [`MAX_HEAD_DIM`].
    pub head_dim: usize,
}

impl From<Shape> for AttentionConfig {
    fn from(s: Shape) -> Self {
        AttentionConfig::from_shape(s)
    }
}

impl AttentionConfig {
    /// A plain call of the named sizes: as [`new`](AttentionConfig::new), with every size
    /// named (prefer it where the arguments are not obvious).
    pub fn from_shape(s: Shape) -> Self {
        Self::new(
            s.batch, s.seq_q, s.seq_kv, s.heads_q, s.heads_kv, s.head_dim,
        )
    }

    /// The call's six sizes.
    pub fn shape(&self) -> Shape {
        Shape {
            batch: self.batch,
            seq_q: self.seq_q,
            seq_kv: self.seq_kv,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
        }
    }

    /// A plain call: `batch` sequences of `seq_q` query rows over `seq_kv` keys, `heads_q`
    /// query heads sharing `heads_kv` key/value heads (GQA/MQA when fewer; `heads_q` must be a
    /// multiple), `head_dim` elements a head (1..=256), no mask or modifier, the scale
    /// 1/sqrt(head_dim). Set the public fields for the rest (`causal`, `window`, `softcap`,
    /// ...). Tensors are row-major `[batch, seq, heads, head_dim]`; the lengths are checked
    /// against the config when a call runs, so a config whose arguments were swapped fails
    /// there unless the swapped shape happens to have the same element counts:
    /// [`from_shape`](AttentionConfig::from_shape) names them.
    pub fn new(
        batch: usize,
        seq_q: usize,
        seq_kv: usize,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
    ) -> Self {
        Self {
            batch,
            seq_q,
            seq_kv,
            heads_q,
            heads_kv,
            head_dim,
            head_dim_v: None,
            values_in_keys: false,
            causal: false,
            window: Window::default(),
            softcap: None,
            alibi_slopes: None,
            sinks: None,
            seqlens_kv: None,
            align_to_seqlens: false,
            leftpad_kv: None,
            paged: None,
            dropout: None,
            block_mask: None,
            mask: None,
            bias: None,
            varlen: None,
            score_mod: None,
            mask_mod: None,
            softmax_scale: None,
            algorithm: Algorithm::default(),
            kv_splits: None,
            block: None,
        }
    }

    /// The whole call a block call is part of ([`AttentionConfig::block`]): this config with
    /// the whole call's lengths and no block; the config itself where it is whole.
    pub fn whole_call(&self) -> AttentionConfig {
        match self.block {
            None => self.clone(),
            Some(b) => AttentionConfig {
                seq_q: b.whole_seq_q,
                seq_kv: b.whole_seq_kv,
                block: None,
                ..self.clone()
            },
        }
    }

    /// A packed variable-length call (flash-attn's varlen API): sequences with the cumulative
    /// lengths `cu_seqlens_q` and `cu_seqlens_kv` (sequences + 1 offsets each, from 0 to the
    /// totals) laid end to end in q `[total_q, heads_q, head_dim]` and k, v `[total_kv,
    /// heads_kv, head_dim]`; lse is `[heads_q, total_q]`. Batch 1, `seq_q` and `seq_kv` the
    /// totals (the last offsets). Checked by `validate` like every other field.
    pub fn packed(
        cu_seqlens_q: Vec<u32>,
        cu_seqlens_kv: Vec<u32>,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
    ) -> Self {
        let total = |cu: &[u32]| cu.last().map_or(0, |&n| n as usize);
        let mut cfg = Self::new(
            1,
            total(&cu_seqlens_q),
            total(&cu_seqlens_kv),
            heads_q,
            heads_kv,
            head_dim,
        );
        cfg.varlen = Some(Varlen {
            cu_seqlens_q,
            cu_seqlens_kv,
        });
        cfg
    }

    /// The softmax scale in use: `softmax_scale`, or `1 / sqrt(head_dim)`.
    pub fn scale(&self) -> f32 {
        self.softmax_scale
            .unwrap_or_else(|| 1.0 / (self.head_dim.max(1) as f32).sqrt())
    }

    /// Query heads per kv head.
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv.max(1)
    }

    /// Elements per value and output head: `head_dim_v`, or `head_dim`.
    pub fn dv(&self) -> usize {
        self.head_dim_v.unwrap_or(self.head_dim)
    }

    /// True when values are as wide as queries and keys (`head_dim_v` unset or equal).
    pub fn same_head_dims(&self) -> bool {
        self.dv() == self.head_dim
    }

    /// q (and dq): `[batch, seq_q, heads_q, head_dim]`.
    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.seq_q, self.heads_q, self.head_dim]
    }

    /// out (and d_out): `[batch, seq_q, heads_q, dv]` (`dv()`: head_dim unless `head_dim_v`).
    pub fn out_shape(&self) -> [usize; 4] {
        [self.batch, self.seq_q, self.heads_q, self.dv()]
    }

    /// k (and dk): `[batch, seq_kv, heads_kv, head_dim]`, or with `paged` the page pools
    /// `[num_pages, page_size, heads_kv, head_dim]`.
    pub fn kv_shape(&self) -> [usize; 4] {
        self.kv_shape_of(self.head_dim)
    }

    /// v (and dv): as k's, `dv()` wide.
    pub fn v_shape(&self) -> [usize; 4] {
        self.kv_shape_of(self.dv())
    }

    /// Bytes one token (one key position, every kv head) takes in a KV cache of this call's
    /// shape, for one layer: keys and values stored apart (`latent` false: `head_dim +
    /// head_dim_v` elements a kv head), or an MLA latent cache (`latent`: `head_dim`, the
    /// values inside: [`Context::forward_with_latent_cache`](crate::Context::forward_with_latent_cache)),
    /// in `dtype` or in the 8-bit `format` (its records, each its own dim wide; E4M3's
    /// per-head scales are a cache's, not a token's). A paged pool takes this per row it
    /// holds, used or not.
    pub fn cache_bytes_per_token(
        &self,
        dtype: crate::DType,
        format: Option<crate::CacheFormat>,
        latent: bool,
    ) -> u64 {
        let row = |dim: usize| match format {
            Some(f) => f.record_words(dim) as u64 * 4,
            None => (dim * dtype.size_bytes()) as u64,
        };
        let values = if latent { 0 } else { row(self.dv()) };
        self.heads_kv as u64 * (row(self.head_dim) + values)
    }

    fn kv_shape_of(&self, dim: usize) -> [usize; 4] {
        match &self.paged {
            Some(p) => [p.num_pages, p.page_size, self.heads_kv, dim],
            None => [self.batch, self.seq_kv, self.heads_kv, dim],
        }
    }

    /// lse: `[batch, heads_q, seq_q]`.
    pub fn lse_shape(&self) -> [usize; 3] {
        [self.batch, self.heads_q, self.seq_q]
    }

    /// Key offset of the causal diagonal: query i sees keys `j <= i + causal_offset()`.
    pub fn causal_offset(&self) -> i64 {
        self.seq_kv as i64 - self.seq_q as i64
    }

    /// The key offsets `j - i'` (i' = i + seq_kv - seq_q) a query row sees, as (lowest,
    /// highest), `None` where unbounded: causal and the window together. Query i sees key j
    /// iff `lo <= j - i - causal_offset() <= hi`.
    pub fn band(&self) -> (Option<i64>, Option<i64>) {
        let lo = self.window.left.map(|l| -(l as i64));
        let right = self.window.right.map(|r| r as i64);
        let hi = match (self.causal, right) {
            (true, Some(r)) => Some(r.min(0)),
            (true, None) => Some(0),
            (false, r) => r,
        };
        (lo, hi)
    }

    /// The shift, in keys, of batch b's causal diagonal and window from the padded alignment:
    /// `seqlens_kv[b] - seq_kv` with `align_to_seqlens` (at most 0), else 0.
    pub fn align_shift(&self, b: usize) -> i64 {
        match (&self.seqlens_kv, self.align_to_seqlens) {
            (Some(s), true) => s[b] as i64 - self.seq_kv as i64,
            _ => 0,
        }
    }

    /// True when query row i sees key j (bounds not checked): causal and the window.
    pub fn sees(&self, i: usize, j: usize) -> bool {
        let d = j as i64 - i as i64 - self.causal_offset();
        let (lo, hi) = self.band();
        lo.is_none_or(|lo| d >= lo) && hi.is_none_or(|hi| d <= hi)
    }

    /// The ALiBi slope of (batch b, query head h), if ALiBi is on.
    pub fn alibi_slope(&self, b: usize, h: usize) -> Option<f32> {
        let s = self.alibi_slopes.as_ref()?;
        Some(if s.len() == self.heads_q {
            s[h]
        } else {
            s[b * self.heads_q + h]
        })
    }

    /// Keys [0, n) of batch b take part: `seqlens_kv[b]`, or every key.
    pub fn kv_len(&self, b: usize) -> usize {
        self.seqlens_kv.as_ref().map_or(self.seq_kv, |s| s[b])
    }

    /// Keys before the result are hidden from batch b: `leftpad_kv[b]`, or 0.
    pub fn kv_start(&self, b: usize) -> usize {
        self.leftpad_kv.as_ref().map_or(0, |s| s[b])
    }

    /// True when a key range is set per batch (`seqlens_kv` or `leftpad_kv`): the kernels
    /// read each batch's [start, length) at run time.
    pub(crate) fn per_batch_keys(&self) -> bool {
        self.seqlens_kv.is_some() || self.leftpad_kv.is_some()
    }

    /// The sink of query head h, if sinks are on.
    pub fn sink(&self, h: usize) -> Option<f32> {
        self.sinks.as_ref().map(|s| s[h])
    }

    /// With dropout: the factor pair (i, j) of (batch b, query head h) takes, 0 (dropped) or
    /// `1 / (1 - p)` (kept), from [`Dropout::keeps`]; 1 without dropout.
    pub fn dropout_factor(&self, b: usize, h: usize, i: usize, j: usize) -> f64 {
        match &self.dropout {
            Some(d) if d.keeps((b * self.heads_q + h) as u32, i as u32, j as u32) => {
                1.0 / (1.0 - d.p as f64)
            }
            Some(_) => 0.0,
            None => 1.0,
        }
    }

    pub(crate) fn lse_len(&self) -> usize {
        self.lse_shape().iter().product()
    }
}

pub use crate::modifiers::MAX_PAIR_ENTRIES;

/// Per-head f32 values (`name`): one of the `lengths` (described by `expected`) and finite.
pub(crate) fn check_values(
    name: &str,
    values: &Option<Vec<f32>>,
    lengths: &[usize],
    expected: &str,
) -> Result<()> {
    let Some(v) = values else { return Ok(()) };
    if !lengths.contains(&v.len()) {
        return Err(Error::invalid(format!(
            "{name} must hold {expected}, got {}",
            v.len()
        )));
    }
    match v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        Some((i, x)) => Err(Error::invalid(format!(
            "{name} must be finite, got {x} at index {i}"
        ))),
        None => Ok(()),
    }
}
