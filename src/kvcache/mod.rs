//! Attention over a KV cache (flash-attn's `flash_attn_with_kvcache`): a dense cache of
//! `[batch, max_seq, heads_kv, head_dim]` keys and values whose batch b holds
//! `cache_seqlens[b]` valid rows; a call may first append new keys and values at each batch's
//! length, then attends q over each batch's keys `[0, cache_seqlens[b] + new)`, with the
//! causal diagonal, window and ALiBi positions aligned to that length (query i sits at
//! position `i + cache_seqlens[b] + new - seq_q`): `AttentionConfig::seqlens_kv` with
//! `align_to_seqlens`. The append and the attention are recorded into one submission. A paged
//! cache (`AttentionConfig::paged`: page pools and a block table) works the same way; the
//! append writes through the table. A left-padded cache (flash-attn's `cache_leftpad`) sets
//! `AttentionConfig::leftpad_kv`: batch b's keys before it are hidden.

mod cache;
mod latent;
mod quantized;

pub use cache::QuantizedCache;

use crate::checks::check_meta;
use crate::config::AttentionConfig;
use crate::device::Context;
use crate::dtype::DType;
use crate::error::{Error, Result, TensorRole};
use crate::outputs::Forward;
use crate::plan::{BufRef, BufferCopy};
use crate::rotary::{check_rotation, Positions, Rotary};
use crate::tensor::Tensor;

/// The attention config of a KV-cache call, on every backend: `cfg` (its `seq_kv` the cache's
/// capacity, `max_seq`) over the keys each batch holds after appending `new_rows`, aligned per
/// batch. A typed error where `cfg` already sets key lengths, `cache_seqlens` does not hold one
/// length per batch, or an append would run past the capacity.
pub(crate) fn kvcache_config(
    cfg: &AttentionConfig,
    cache_seqlens: &[usize],
    new_rows: usize,
) -> Result<AttentionConfig> {
    cfg.validate()?;
    separate_v(cfg)?;
    if cfg.seqlens_kv.is_some() || cfg.align_to_seqlens {
        return Err(Error::invalid(
            "forward_with_kvcache takes each batch's key length from cache_seqlens: \
             cfg.seqlens_kv must be None and align_to_seqlens false",
        ));
    }
    if cfg.varlen.is_some() {
        return Err(Error::invalid(
            "forward_with_kvcache takes a padded batch (the cache's layout): cfg.varlen must be \
             None",
        ));
    }
    if cache_seqlens.len() != cfg.batch {
        return Err(Error::invalid(format!(
            "cache_seqlens must hold one length per batch ([batch] = [{}]), got {}",
            cfg.batch,
            cache_seqlens.len()
        )));
    }
    let mut lens = Vec::with_capacity(cfg.batch);
    for (b, &n) in cache_seqlens.iter().enumerate() {
        match n.checked_add(new_rows).filter(|&t| t <= cfg.seq_kv) {
            Some(t) => lens.push(t),
            None => {
                return Err(Error::invalid(format!(
                    "cache overflow: batch {b} holds {n} keys, appending {new_rows} would make \
                     {}, past the cache's capacity seq_kv = {}",
                    n.saturating_add(new_rows),
                    cfg.seq_kv
                )))
            }
        }
    }
    if new_rows > 0 && cfg.paged.is_some() {
        check_append_targets(cfg, cache_seqlens, new_rows)?;
    }
    let mut c = cfg.clone();
    c.seqlens_kv = Some(lens);
    c.align_to_seqlens = true;
    c.validate()?;
    Ok(c)
}

/// A call that takes a separate v refuses a config whose values are in its keys
/// (`values_in_keys`: an MLA latent cache, which the latent-cache calls take alone).
pub(crate) fn separate_v(cfg: &AttentionConfig) -> Result<()> {
    if cfg.values_in_keys {
        return Err(Error::invalid(
            "values_in_keys: a latent cache holds the values in its key rows, so this call's \
             separate v would not be read; pass the one cache to forward_with_latent_cache \
             (or forward_with_quantized_latent_cache), or set values_in_keys false",
        ));
    }
    Ok(())
}

/// [`kvcache_config`] for a latent cache (`latent`: v is k's first head_dim_v dims, no v
/// passed), or for separate k and v caches.
pub(crate) fn step_config(
    cfg: &AttentionConfig,
    cache_seqlens: &[usize],
    new_rows: usize,
    latent: bool,
) -> Result<AttentionConfig> {
    if !latent {
        return kvcache_config(cfg, cache_seqlens, new_rows);
    }
    let plain = AttentionConfig {
        values_in_keys: false,
        ..cfg.clone()
    };
    let mut c = kvcache_config(&plain, cache_seqlens, new_rows)?;
    c.values_in_keys = true;
    c.validate()?;
    Ok(c)
}

/// A paged append writes each batch's new rows through its block table; batches may share
/// pages they read (a common prefix), but two batches writing the same cache rows would leave
/// whichever copy ran last: a typed error instead (a `cache_batch_idx` naming one cache row
/// twice is such a case).
fn check_append_targets(
    cfg: &AttentionConfig,
    cache_seqlens: &[usize],
    new_rows: usize,
) -> Result<()> {
    // (first pool row, rows, batch) of every run, sorted by where it writes
    let mut runs: Vec<(usize, usize, usize)> = cache_seqlens
        .iter()
        .enumerate()
        .flat_map(|(b, &len)| {
            append_runs(cfg, b, len, new_rows)
                .into_iter()
                .map(move |(_, dst, n)| (dst, n, b))
        })
        .collect();
    runs.sort_unstable();
    for w in runs.windows(2) {
        let ((at, n, b0), (next, _, b1)) = (w[0], w[1]);
        if next < at + n {
            let page_size = cfg.paged.as_ref().map_or(1, |p| p.page_size);
            return Err(Error::invalid(format!(
                "paged append: batches {} and {} would both write page {}, row {} (their \
                 block tables share that page past their lengths); give each batch its own \
                 pages for the rows it appends",
                b0.min(b1),
                b0.max(b1),
                next / page_size,
                next % page_size
            )));
        }
    }
    Ok(())
}

/// A tensor's shape and dtype, as the checks see it on every backend.
pub(crate) type Meta<'a> = (&'a [usize], DType);

/// The rows an append brings (`k_new`'s second dimension), after checking both tensors are
/// `[batch, new, heads_kv, head_dim]` in `dtype` (v `head_dim_v` wide; a latent cache's
/// append has no v).
pub(crate) fn append_rows(
    cfg: &AttentionConfig,
    (k, v): (Meta<'_>, Option<Meta<'_>>),
    dtype: DType,
) -> Result<usize> {
    let rows = if k.0.len() == 4 { k.0[1] } else { 0 };
    let expected = [cfg.batch, rows.max(1), cfg.heads_kv, cfg.head_dim];
    check_meta(TensorRole::KNew, k.0, k.1, &expected, dtype)?;
    if let Some(v) = v {
        let expected_v = [cfg.batch, rows.max(1), cfg.heads_kv, cfg.dv()];
        check_meta(TensorRole::VNew, v.0, v.1, &expected_v, dtype)?;
    }
    Ok(rows)
}

/// Where an append of `new` rows writes batch b's rows, which start at its length `len`: runs
/// of (first row of `k_new`, first row of the cache, rows), each within one page of a paged
/// cache (one run for a dense one). Rows count `heads_kv x head_dim` elements.
pub(crate) fn append_runs(
    c: &AttentionConfig,
    b: usize,
    len: usize,
    new: usize,
) -> Vec<(usize, usize, usize)> {
    let mut runs = Vec::new();
    let mut r = 0;
    while r < new {
        let pos = len + r;
        let (dst, n) = match &c.paged {
            Some(p) => (
                p.row(b, pos),
                (p.page_size - pos % p.page_size).min(new - r),
            ),
            None => (b * c.seq_kv + pos, new - r),
        };
        runs.push((b * new + r, dst, n));
        r += n;
    }
    runs
}

/// The buffer copies that append `t` (k_new or v_new, plan input `src`, `hd` elements a head:
/// head_dim or head_dim_v) to the cache (plan input `dst`) at each batch's length: runs of whole rows from a row-major `t`; from a view
/// (a packed QKV projection, BHSD), each row, or each head of a row, that lies contiguous. A
/// typed `Unsupported` where a piece would not start on a 4-byte word (copies move words).
fn append_copies(
    c: &AttentionConfig,
    (t, hd): (&Tensor, usize),
    (src, dst): (usize, usize),
    cache_seqlens: &[usize],
    new_rows: usize,
) -> Result<Vec<BufferCopy>> {
    let esz = t.dtype().size_bytes() as u64;
    let (head, hd, row_bytes) = (hd, hd as u64, (c.heads_kv * hd) as u64 * esz);
    let [sb, ss, sh, _] = <[usize; 4]>::try_from(t.strides())
        .map_err(|_| Error::invalid(format!("{}: a 4-d tensor expected", t.describe())))?;
    // pieces a row and elements a piece (0: whole runs of rows)
    let (pieces, piece) = if t.is_row_major() {
        (0, 0)
    } else if sh == head || c.heads_kv == 1 {
        (1, c.heads_kv as u64 * hd)
    } else {
        (c.heads_kv as u64, hd)
    };
    let words = |bytes: u64| bytes.is_multiple_of(4);
    if !(words(t.offset())
        && (pieces == 0
            || words(piece * esz) && [sb, ss, sh].iter().all(|&x| words(x as u64 * esz))))
    {
        return Err(Error::Unsupported {
            feature: format!(
                "appending from a {} view whose rows or heads do not start on 4-byte words \
                 ({}: strides {:?}, offset {})",
                t.dtype(),
                t.describe(),
                t.strides(),
                t.offset()
            ),
            backend: crate::Backend::Wgpu,
            reason: "the append is a buffer copy of whole 4-byte words".into(),
        });
    }
    let copy = |src_offset: u64, dst_offset: u64, size: u64| BufferCopy {
        src: BufRef::Input(src),
        src_offset,
        dst: BufRef::Input(dst),
        dst_offset,
        size,
    };
    let mut copies = Vec::new();
    for (b, &len) in cache_seqlens.iter().enumerate() {
        for (from, to, rows) in append_runs(c, b, len, new_rows) {
            if pieces == 0 {
                copies.push(copy(
                    from as u64 * row_bytes,
                    to as u64 * row_bytes,
                    rows as u64 * row_bytes,
                ));
                continue;
            }
            for r in 0..rows {
                let (bb, i) = ((from + r) / new_rows, (from + r) % new_rows);
                for h in 0..pieces {
                    let at = (bb * sb + i * ss) as u64 + h * sh as u64;
                    copies.push(copy(
                        at * esz,
                        (to + r) as u64 * row_bytes + h * hd * esz,
                        piece * esz,
                    ));
                }
            }
        }
    }
    Ok(copies)
}

impl Context {
    /// Attention of q over a KV cache, after appending `append = Some((k_new, v_new))`
    /// (`[batch, new, heads_kv, head_dim]`, v_new `head_dim_v` wide: `cfg.dv()`) at each
    /// batch's length (module [`kvcache`](crate::kvcache)): `cfg.seq_kv` is the caches'
    /// capacity (`k_cache` is `cfg.kv_shape()`, `[batch, seq_kv, heads_kv, head_dim]`, and
    /// `v_cache` `cfg.v_shape()`), `cache_seqlens[b]` the rows batch b held before the call.
    /// The caches are written in place; the caller advances its lengths by `new`. One
    /// submission, no wait. On wgpu the append is a buffer copy: half-precision caches need
    /// `heads_kv` times each head dim even (whole 4-byte words), else `Unsupported`.
    pub fn forward_with_kvcache(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        k_cache: &mut Tensor,
        v_cache: &mut Tensor,
        cache_seqlens: &[usize],
        append: Option<(&Tensor, &Tensor)>,
    ) -> Result<Forward> {
        self.kvcache_impl(
            cfg,
            q,
            (&*k_cache, Some(&*v_cache)),
            cache_seqlens,
            append.map(|(k, v)| (k, Some(v))),
            None,
            None,
        )
    }

    /// [`forward_with_kvcache`](Context::forward_with_kvcache) writing into `dst` (out and lse
    /// of an earlier step's result, or tensors from `zeros_of`) instead of new tensors, as
    /// [`forward_into`](Context::forward_into): a decode loop allocates nothing per step.
    pub fn forward_with_kvcache_into(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        (k_cache, v_cache): (&mut Tensor, &mut Tensor),
        cache_seqlens: &[usize],
        append: Option<(&Tensor, &Tensor)>,
        dst: &Forward,
    ) -> Result<()> {
        self.kvcache_impl(
            cfg,
            q,
            (&*k_cache, Some(&*v_cache)),
            cache_seqlens,
            append.map(|(k, v)| (k, Some(v))),
            Some(dst),
            None,
        )
        .map(drop)
    }

    /// Attention of q over a KV cache as
    /// [`forward_with_kvcache`](Context::forward_with_kvcache), with a rotary embedding
    /// (module [`rotary`](crate::rotary)) fused in as flash-attn's `rotary_cos`, `rotary_sin`
    /// and `rotary_interleaved` do: q is rotated at its positions and the new keys before
    /// they are appended (the values are not), in the same submission as the append and the
    /// attention. The caches hold rotated keys afterwards, as flash-attn's do. The tables are
    /// `[table_rows, rotary_dim / 2]` in q's dtype, `rotary_dim <= head_dim`, and must hold
    /// every position the call reaches (a typed error otherwise, before any GPU work).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with_kvcache_rotary(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        k_cache: &mut Tensor,
        v_cache: &mut Tensor,
        cache_seqlens: &[usize],
        append: Option<(&Tensor, &Tensor)>,
        rotary: Rotary<'_, Tensor>,
    ) -> Result<Forward> {
        // the call's checks before the rotation's GPU work
        self.kvcache_step(
            cfg,
            q,
            cache_seqlens,
            append.map(|(k, v)| (k, Some(v))),
            false,
        )?;
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("rotary + kvcache"),
            });
        let (q_rot, k_rot) =
            self.rotate_for_kvcache(&mut enc, cfg, cache_seqlens, q, append.map(|a| a.0), rotary)?;
        let append = append.zip(k_rot.as_ref()).map(|((_, v), k)| (k, v));
        let f = self.kvcache_impl(
            cfg,
            &q_rot,
            (&*k_cache, Some(&*v_cache)),
            cache_seqlens,
            append.map(|(k, v)| (k, Some(v))),
            None,
            Some(&mut enc),
        )?;
        self.scoped(|| self.queue.submit([enc.finish()]))?;
        Ok(f)
    }

    /// Rotary embedding (module [`rotary`](crate::rotary)) of `x`, a `[batch, rows, heads,
    /// head_dim]` tensor in the tables' dtype, row i of batch b at `positions.at(b, i)`: a new
    /// tensor of `x`'s shape (for a prefill, rotate q and k before
    /// [`forward`](Context::forward); a KV-cache step takes the tables itself,
    /// [`forward_with_kvcache_rotary`](Context::forward_with_kvcache_rotary)). One
    /// submission, no wait.
    pub fn apply_rotary(
        &self,
        x: &Tensor,
        rotary: Rotary<'_, Tensor>,
        positions: &Positions,
    ) -> Result<Tensor> {
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("rotary"),
            });
        let out = self.rotary_into(&mut enc, (TensorRole::Q, x), rotary, positions)?;
        self.scoped(|| self.queue.submit([enc.finish()]))?;
        Ok(out)
    }

    /// q and the new keys of a KV-cache call (`k_new`) rotated into `enc` at flash-attn's
    /// positions (`Positions::for_kvcache`): the tensors the call then attends with and
    /// appends.
    pub(crate) fn rotate_for_kvcache(
        &self,
        enc: &mut wgpu::CommandEncoder,
        cfg: &AttentionConfig,
        cache_seqlens: &[usize],
        q: &Tensor,
        k_new: Option<&Tensor>,
        rotary: Rotary<'_, Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (q_pos, k_pos) = Positions::for_kvcache(cfg, cache_seqlens);
        let q_rot = self.rotary_into(enc, (TensorRole::Q, q), rotary, &q_pos)?;
        let k_rot = match k_new {
            Some(k) => Some(self.rotary_into(enc, (TensorRole::KNew, k), rotary, &k_pos)?),
            None => None,
        };
        Ok((q_rot, k_rot))
    }

    /// Checks `x` (`role` names it in errors) and the tables, and records the rotation into
    /// `enc`.
    fn rotary_into(
        &self,
        enc: &mut wgpu::CommandEncoder,
        (role, x): (TensorRole, &Tensor),
        rotary: Rotary<'_, Tensor>,
        positions: &Positions,
    ) -> Result<Tensor> {
        self.check_owned(x, || role.to_string())?;
        self.check_owned(rotary.cos, || TensorRole::RotaryCos.to_string())?;
        self.check_owned(rotary.sin, || TensorRole::RotarySin.to_string())?;
        let (shape, dims) = check_rotation(
            (role, x.shape(), x.dtype()),
            (rotary.cos.shape(), rotary.cos.dtype()),
            (rotary.sin.shape(), rotary.sin.dtype()),
            positions,
        )?;
        for (what, t) in [
            (role.to_string(), x),
            ("rotary_cos".into(), rotary.cos),
            ("rotary_sin".into(), rotary.sin),
        ] {
            if t.needs_view() {
                return Err(crate::tensor::strided_unsupported(
                    &format!("a rotary embedding ({what})"),
                    t,
                ));
            }
        }
        let plan = crate::plan::rotary(
            (role, shape, x.dtype()),
            dims,
            rotary.interleaved,
            positions,
            &self.plan_env(),
        )?;
        let mut out = self.execute_into(&plan, &[x, rotary.cos, rotary.sin], Some(enc), None)?;
        Ok(out.remove(0))
    }

    /// What every KV-cache call checks first, before any GPU work: the new keys and values
    /// (this context's, of the shapes `append_rows` takes; no values for a latent cache,
    /// `latent`), and q against the step's config. Returns that config (`step_config`) and the
    /// rows each batch appends.
    pub(crate) fn kvcache_step(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        cache_seqlens: &[usize],
        append: Option<(&Tensor, Option<&Tensor>)>,
        latent: bool,
    ) -> Result<(AttentionConfig, usize)> {
        let dtype = q.dtype();
        let new_rows = match append {
            Some((k, v)) => {
                self.check_owned(k, || "k_new".into())?;
                if let Some(v) = v {
                    self.check_owned(v, || "v_new".into())?;
                }
                let v = v.map(|v| (v.shape(), v.dtype()));
                append_rows(cfg, ((k.shape(), k.dtype()), v), dtype)?
            }
            None => 0,
        };
        let c = step_config(cfg, cache_seqlens, new_rows, latent)?;
        crate::tensor::check_tensor(self, TensorRole::Q, q, &c.q_shape(), dtype)?;
        Ok((c, new_rows))
    }

    /// A dense or paged KV-cache call: separate k and v caches, or a latent cache
    /// (`v_cache` None: the values are k's first head_dim_v dims, bound from k's buffer, and
    /// an append brings keys alone).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn kvcache_impl(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        (k_cache, v_cache): (&Tensor, Option<&Tensor>),
        cache_seqlens: &[usize],
        append: Option<(&Tensor, Option<&Tensor>)>,
        dst: Option<&Forward>,
        enc: Option<&mut wgpu::CommandEncoder>,
    ) -> Result<Forward> {
        let dtype = q.dtype();
        let latent = v_cache.is_none();
        let (c, new_rows) = self.kvcache_step(cfg, q, cache_seqlens, append, latent)?;
        crate::tensor::check_tensor(self, TensorRole::K, k_cache, &c.kv_shape(), dtype)?;
        if let Some(v_cache) = v_cache {
            crate::tensor::check_tensor(self, TensorRole::V, v_cache, &c.v_shape(), dtype)?;
        } else if k_cache.needs_view() {
            return Err(crate::tensor::strided_unsupported(
                "a latent cache (its values are read from its own key rows)",
                k_cache,
            ));
        }
        let mut plan = crate::plan::forward(&c, dtype, &self.plan_env())?;
        let mut inputs: Vec<&Tensor> = vec![q, k_cache, v_cache.unwrap_or(k_cache)];
        if let Some((k_new, v_new)) = append {
            let dims = [Some(c.head_dim), v_new.map(|_| c.dv())];
            let odd = dims
                .into_iter()
                .flatten()
                .find(|&d| !((c.heads_kv * d * dtype.size_bytes()) as u64).is_multiple_of(4));
            if let Some(d) = odd {
                return Err(Error::Unsupported {
                    feature: format!(
                        "appending to a {dtype} KV cache with heads_kv x head dim = {} (odd)",
                        c.heads_kv * d
                    ),
                    backend: crate::Backend::Wgpu,
                    reason: "the append is a buffer copy of whole 4-byte words; append with \
                             your own copy, or use an even heads_kv x head_dim"
                        .into(),
                });
            }
            // each new row is written once: a latent cache's values are in its keys
            let first = plan.inputs.len();
            let news = [Some((k_new, c.head_dim)), v_new.map(|v| (v, c.dv()))];
            for (n, (t, hd)) in news.into_iter().flatten().enumerate() {
                plan.inputs.push(if n == 0 {
                    TensorRole::KNew
                } else {
                    TensorRole::VNew
                });
                inputs.push(t);
                plan.copies.extend(append_copies(
                    &c,
                    (t, hd),
                    (first + n, 1 + n),
                    cache_seqlens,
                    new_rows,
                )?);
            }
        }
        let given = dst.map(|d| [&d.out, &d.lse]);
        let outputs = self.execute_into(&plan, &inputs, enc, given.as_ref().map(|g| &g[..]))?;
        Forward::from_outputs(outputs, "forward")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_are_cut_into_runs_at_page_boundaries() {
        let mut c = AttentionConfig::new(2, 1, 12, 2, 1, 8);
        // dense: one run per batch, at its length
        assert_eq!(append_runs(&c, 1, 5, 3), vec![(3, 12 + 5, 3)]);
        // pages of 4, batch 1's pages [2, 0, 1]: rows 3..9 of batch 1 cross two boundaries
        c.paged = Some(crate::PagedKv {
            page_size: 4,
            num_pages: 3,
            pages_per_seq: 3,
            block_table: vec![0, 1, 2, 2, 0, 1],
        });
        assert_eq!(
            append_runs(&c, 1, 3, 6),
            vec![(6, 2 * 4 + 3, 1), (7, 0, 4), (11, 4, 1)]
        );
        // an overflowing append is refused before any run is made
        let e = kvcache_config(&AttentionConfig::new(2, 1, 12, 2, 1, 8), &[5, 10], 3);
        assert!(matches!(e, Err(Error::InvalidConfig(m)) if m.contains("batch 1 holds 10")));
    }

    #[test]
    fn paged_appends_may_share_read_pages_but_not_the_rows_they_write() {
        let mut c = AttentionConfig::new(2, 1, 8, 2, 1, 8);
        // both batches read page 0 (a prefix of 4 rows); batch 0 appends into page 1, batch 1
        // into page 2
        c.paged = Some(crate::PagedKv {
            page_size: 4,
            num_pages: 3,
            pages_per_seq: 2,
            block_table: vec![0, 1, 0, 2],
        });
        kvcache_config(&c, &[4, 5], 2).unwrap();
        // an append inside the shared page: batch 0's rows 2..4 and batch 1's 3..5 meet in it
        let e = kvcache_config(&c, &[2, 3], 2);
        assert!(
            matches!(&e, Err(Error::InvalidConfig(m)) if m.contains("batches 0 and 1 would both write page 0, row 3")),
            "{e:?}"
        );
        // one cache row named twice (cache_batch_idx [1, 1]): reading is fine, appending not
        c.paged = Some(crate::PagedKv::cache_rows(2, 8, vec![1, 1]));
        kvcache_config(&c, &[3, 3], 0).unwrap();
        let e = kvcache_config(&c, &[3, 3], 1);
        assert!(matches!(e, Err(Error::InvalidConfig(_))), "{e:?}");
    }
}
