//! Exact merges of partial attention results: attention over disjoint shards of the keys,
//! each `(out_i, lse_i)`, folded into the result over all the keys (and its lse):
//!
//! `lse = log(sum_i exp(lse_i))`, `out = sum_i exp(lse_i - lse) out_i`.
//!
//! This is how one sequence's keys can be spread over several devices or machines (ring or
//! context parallelism) with whatever transport the caller runs: compute each shard's forward
//! where its keys live, bring the `(out, lse)` pairs to one device, merge. A shard that lets a
//! row see no key (lse -inf, out 0) adds nothing to it; a row no shard lets see a key comes
//! out as the forward gives it, lse -inf and out 0.
//!
//! The backward of sharded attention needs no merge: each shard's backward, called with the
//! merged out and lse (and the full d_out), gives that shard's dK and dV and its part of dQ;
//! the shards' dQ parts sum to dQ.
//!
//! Sinks act as one extra key per head: give them to one shard's config only. Causal masks and
//! windows align queries to the end of each shard's keys: shard a causal sequence with a
//! boolean mask or a block mask of the pairs instead.

use crate::device::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::forward::Forward;
use crate::tensor::Tensor;

/// What a merge checks of one shard: out's shape and dtype, lse's shape and dtype.
pub(crate) struct ShardMeta<'a> {
    pub out: (&'a [usize], DType),
    pub lse: (&'a [usize], DType),
}

/// Every shard's out is `[batch, seq_q, heads_q, head_dim]` (shard 0's shape) in shard 0's
/// dtype, every lse f32 `[batch, heads_q, seq_q]`; at least one shard. Returns out's shape and
/// dtype; errors name the shard, what was expected and what was given.
pub(crate) fn check_shards(shards: &[ShardMeta<'_>]) -> Result<([usize; 4], DType)> {
    let Some(first) = shards.first() else {
        return Err(Error::invalid(
            "merge: at least one shard (out, lse) is needed, got none",
        ));
    };
    let shape: [usize; 4] = first.out.0.try_into().map_err(|_| {
        Error::invalid(format!(
            "merge: shard 0's out has shape {:?}, expected 4 dimensions [batch, seq_q, \
             heads_q, head_dim]",
            first.out.0
        ))
    })?;
    crate::tensor::shape_elements(&shape)?;
    if shape[3] > crate::MAX_HEAD_DIM_V {
        return Err(Error::invalid(format!(
            "merge: head_dim (out's last dimension) is {}, at most {} (MAX_HEAD_DIM_V)",
            shape[3],
            crate::MAX_HEAD_DIM_V
        )));
    }
    let dtype = first.out.1;
    let [batch, seq_q, heads, _] = shape;
    let lse_shape = [batch, heads, seq_q];
    for (i, s) in shards.iter().enumerate() {
        if s.out.0 != shape {
            return Err(Error::invalid(format!(
                "merge: shard {i}'s out has shape {:?}, expected {shape:?} (shard 0's)",
                s.out.0
            )));
        }
        if s.out.1 != dtype {
            return Err(Error::DType {
                tensor: format!("shard {i}'s out"),
                expected: dtype,
                got: s.out.1,
            });
        }
        if s.lse.0 != lse_shape {
            return Err(Error::invalid(format!(
                "merge: shard {i}'s lse has shape {:?}, expected {lse_shape:?} ([batch, \
                 heads_q, seq_q] of out {shape:?})",
                s.lse.0
            )));
        }
        if s.lse.1 != DType::F32 {
            return Err(Error::DType {
                tensor: format!("shard {i}'s lse"),
                expected: DType::F32,
                got: s.lse.1,
            });
        }
    }
    Ok((shape, dtype))
}

impl Context {
    /// Merges partial results over disjoint key shards into the exact result over all their
    /// keys (module [`merge`](crate::merge)): out in the shards' dtype, lse f32. The shards'
    /// tensors must belong to this context (download and upload those computed elsewhere).
    /// Exact up to one rounding to the dtype: the running result is kept in f32. lse values
    /// are taken as a forward returns them (finite, -inf or NaN; `merge_host` refuses +inf).
    ///
    /// ```no_run
    /// use flash_attn_wgpu::{AttentionConfig, Context};
    /// let ctx = Context::new()?;
    /// // one query row over 2 x 500 keys, as two calls of 500 (two devices, or two caches)
    /// let half = AttentionConfig::new(1, 1, 500, 8, 8, 64);
    /// let q = ctx.zeros(&half.q_shape())?;
    /// let (k0, k1) = (ctx.zeros(&half.kv_shape())?, ctx.zeros(&half.kv_shape())?);
    /// let a = ctx.forward(&half, &q, &k0, &k0)?;
    /// let b = ctx.forward(&half, &q, &k1, &k1)?;
    /// let all = ctx.merge(&[a, b])?; // attention over all 1,000 keys
    /// # Ok::<(), flash_attn_wgpu::Error>(())
    /// ```
    pub fn merge(&self, shards: &[Forward]) -> Result<Forward> {
        let metas: Vec<ShardMeta<'_>> = shards
            .iter()
            .map(|s| ShardMeta {
                out: (s.out.shape(), s.out.dtype()),
                lse: (s.lse.shape(), s.lse.dtype()),
            })
            .collect();
        let (shape, dtype) = check_shards(&metas)?;
        for (i, s) in shards.iter().enumerate() {
            self.check_owned(&s.out, || format!("shard {i}'s out"))?;
            self.check_owned(&s.lse, || format!("shard {i}'s lse"))?;
        }
        let plan = crate::plan::merge(shape, shards.len(), dtype, &self.plan_env())?;
        let inputs: Vec<&Tensor> = shards.iter().flat_map(|s| [&s.out, &s.lse]).collect();
        Forward::from_outputs(self.execute(&plan, &inputs)?, "merge")
    }

    /// [`merge`](Context::merge) on host slices: each shard's out shaped `out_shape`
    /// (`[batch, seq_q, heads_q, head_dim]`) in `T`, its lse f32 `[batch, heads_q, seq_q]`
    /// (finite, -inf or NaN; +inf is refused). Uploads, merges, downloads.
    pub fn merge_host<T: crate::Element>(
        &self,
        out_shape: &[usize],
        shards: &[crate::HostForward<T>],
    ) -> Result<crate::HostForward<T>> {
        crate::AttentionBackend::merge_host(self, out_shape, shards)
    }
}
