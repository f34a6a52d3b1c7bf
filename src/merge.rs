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

use crate::checks::{check_shards, ShardMeta};
use crate::device::Context;
use crate::error::Result;
use crate::outputs::Forward;
use crate::tensor::Tensor;

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
}
