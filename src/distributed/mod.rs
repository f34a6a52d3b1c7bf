//! Context parallelism: one attention call spread over ranks (processes, GPUs, machines), each
//! holding its share of the sequence on its own [`Context`], exact (the same result as one
//! device, to f32 rounding) and deterministic (the same bits every run: every sum in a fixed
//! order). The ranks talk through a [`Comm`]: MPI's (`MpiComm`, feature `mpi`: MPICH or
//! Open MPI, across processes and machines, any vendor's GPUs) or threads of one process
//! ([`LocalRing`]).
//!
//! - **Ring** ([`Schedule::Ring`], Liu et al. 2023): each rank's K/V block travels round the
//!   ring while the block it holds computes (the transfer overlaps the work); each rank
//!   attends its rows to every block as a block of the whole call ([`crate::Block`]: causal,
//!   windows, ALiBi, user `score_mod`/`mask_mod`, block masks and dropout at the whole call's
//!   indices) and merges the partial results in key order. The backward sends each block's
//!   K, V and its dK, dV accumulated so far round the ring the same way, and back to its
//!   owner.
//! - **Layouts** ([`Layout`]): a causal call is zigzag (rank r holds chunks r and 2R - 1 - r
//!   of 2R: the same visible pairs on every rank), a non-causal one contiguous.
//! - **All-gather** ([`Schedule::AllGather`], Llama 3's form): every rank gathers all K and V
//!   and attends its rows to them in one call; its dK, dV are summed to their owners by a ring
//!   reduce-scatter. Cheaper where each rank's block is small (latency-bound steps);
//!   [`Schedule::Auto`] takes it below [`ALL_GATHER_BELOW`] bytes a rank.
//! - **Decode over a sharded KV cache** ([`ContextParallel::decode_sharded`]): each rank
//!   attends the (replicated) query rows to its shard of the keys, and one all-gather of the
//!   partials, merged in rank order, gives every rank the result.
//!
//! Tensors are host slices in the usual layouts, of the rank's rows (its chunks, in order:
//! [`ContextParallel::local_rows`]); the whole call's `cfg` names the whole sequence
//! (`seq_q == seq_kv`, self-attention). The work is f32 (inputs read exactly, each output
//! rounded once to the dtype); K and V travel in the dtype, dK and dV in f32. Before any
//! work the ranks compare the call (an all-gather of its fields): a rank that disagrees, or
//! that refused its own inputs, makes every rank fail with [`Error::Distributed`] naming the
//! rank and the field; a rank that does not answer within [`comm::TIMEOUT_ENV`] seconds
//! likewise. Nothing is written to a caller's buffer: results are new vectors.

mod comm;
mod layout;
#[cfg(feature = "mpi")]
mod mpi;
mod rank;
mod ring;

use std::ops::Range;

pub use comm::{timeout, Comm, LocalRing, DEFAULT_TIMEOUT_S, TIMEOUT_ENV};
pub use layout::{take_rows, Layout};
#[cfg(feature = "mpi")]
pub use mpi::MpiComm;
pub use rank::{Schedule, Traffic, ALL_GATHER_BELOW};

use crate::config::AttentionConfig;
use crate::device::Context;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::outputs::{HostForward, HostGradients};
use rank::Rank;

/// One rank's side of context-parallel attention: its context and its communicator (module
/// docs).
pub struct ContextParallel<'a> {
    rank: Rank<'a>,
}

impl std::fmt::Debug for ContextParallel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextParallel")
            .field("rank", &self.rank.comm.rank())
            .field("size", &self.rank.comm.size())
            .field("schedule", &self.rank.schedule)
            .finish()
    }
}

impl<'a> ContextParallel<'a> {
    /// This rank of the call, computing on `ctx`, talking through `comm`; the ring schedule.
    pub fn new(ctx: &'a Context, comm: &'a dyn Comm) -> Self {
        ContextParallel {
            rank: Rank::new(ctx, comm),
        }
    }

    /// The schedule the calls take ([`Schedule`]); every rank must take the same.
    pub fn with_schedule(self, schedule: Schedule) -> Self {
        ContextParallel {
            rank: Rank {
                schedule,
                ..self.rank
            },
        }
    }

    /// The layout every call takes, in place of [`Layout::for_causal`] (ring-flash-attn's
    /// `ring_flash_attn_func` keeps a causal sequence contiguous, at the cost of balance); every
    /// rank must take the same.
    pub fn with_layout(self, layout: Layout) -> Self {
        ContextParallel {
            rank: Rank {
                layout: Some(layout),
                ..self.rank
            },
        }
    }

    /// How `cfg`'s sequence is spread: as [`with_layout`](Self::with_layout) set, else zigzag
    /// where it is causal and contiguous otherwise.
    pub fn layout(&self, cfg: &AttentionConfig) -> Layout {
        self.rank.layout(cfg)
    }

    /// The rows of `cfg`'s sequence this rank holds, in the order of its local tensors.
    pub fn local_rows(&self, cfg: &AttentionConfig) -> Vec<Range<usize>> {
        self.rank.local_rows(cfg)
    }

    /// The bytes this rank sent in its last call.
    pub fn traffic(&self) -> Traffic {
        self.rank.traffic.get()
    }

    /// The forward of the whole call `cfg` over the ranks: `q`, `k`, `v` are this rank's rows
    /// (`[batch, local rows, heads, dim]`, [`local_rows`](Self::local_rows)); returns this
    /// rank's rows of `out` and `lse` (`[batch, heads_q, local rows]`). Every rank calls it
    /// with the same `cfg`.
    pub fn forward<T: Element>(
        &self,
        cfg: &AttentionConfig,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<HostForward<T>> {
        let local = self.check(
            cfg,
            T::DTYPE,
            &[("q", q.len()), ("k", k.len()), ("v", v.len())],
        );
        self.agree(cfg, T::DTYPE, 0, local)?;
        self.rank.traffic.set(Traffic::default());
        let f = ring::forward(&self.rank, cfg, (q, k, v))?;
        Ok(HostForward {
            out: crate::dtype::from_f32_slice(&f.out),
            lse: f.lse,
        })
    }

    /// The backward of the whole call over the ranks, from this rank's rows of the inputs and
    /// of the forward's `out` and `lse` and of `d_out`: this rank's dq, and dk, dv of its own
    /// rows (each summed over every rank's queries), and `d_sinks` (summed over the ranks:
    /// the same on each).
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: Element>(
        &self,
        cfg: &AttentionConfig,
        q: &[T],
        k: &[T],
        v: &[T],
        out: &[T],
        lse: &[f32],
        d_out: &[T],
    ) -> Result<HostGradients<T>> {
        let local = self.check(
            cfg,
            T::DTYPE,
            &[
                ("q", q.len()),
                ("k", k.len()),
                ("v", v.len()),
                ("out", out.len()),
                ("lse", lse.len()),
                ("d_out", d_out.len()),
            ],
        );
        self.agree(cfg, T::DTYPE, 1, local)?;
        self.rank.traffic.set(Traffic::default());
        let g = ring::backward(&self.rank, cfg, (q, k, v, out, lse, d_out))?;
        let to = |x: &[f32]| crate::dtype::from_f32_slice(x);
        Ok(HostGradients {
            dq: to(&g.dq),
            dk: to(&g.dk),
            dv: to(&g.dv),
            d_sinks: g.d_sinks,
            d_bias: None,
            d_table: None,
        })
    }

    /// Decode (or any call) over keys sharded across the ranks: `cfg` is the whole call
    /// (its `seq_kv` every shard's keys together; q replicated on every rank), `shard` this
    /// rank's keys of it (the ranks' shards in rank order must tile `0..seq_kv`), `k`, `v`
    /// its rows `[batch, shard.len(), heads_kv, dim]`. Each rank attends to its shard (a block
    /// of the call where a mask or modifier reads positions, else a plain call, which the
    /// decode kernel takes); one all-gather of the partials, merged in rank order, gives every
    /// rank the same `out` and `lse`. Sinks are counted once (on rank 0).
    pub fn decode_sharded<T: Element>(
        &self,
        cfg: &AttentionConfig,
        shard: Range<usize>,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<HostForward<T>> {
        let local = self.check_shard(cfg, &shard, T::DTYPE, q.len(), k.len(), v.len());
        self.agree(cfg, T::DTYPE, 2, local)?;
        self.rank.traffic.set(Traffic::default());
        let f = ring::decode_sharded(&self.rank, cfg, shard, (q, k, v))?;
        Ok(HostForward {
            out: crate::dtype::from_f32_slice(&f.out),
            lse: f.lse,
        })
    }

    /// This rank's own inputs against the call: a typed error for its own caller (the other
    /// ranks learn that it refused them).
    fn check(
        &self,
        cfg: &AttentionConfig,
        dtype: crate::DType,
        lens: &[(&str, usize)],
    ) -> Result<()> {
        if cfg.seq_q != cfg.seq_kv {
            return Err(Error::invalid(format!(
                "context parallelism splits one sequence for queries and keys: seq_q must \
                 equal seq_kv, got {} and {}",
                cfg.seq_q, cfg.seq_kv
            )));
        }
        if cfg.block.is_some() {
            return Err(Error::invalid(
                "cfg is the whole call: its block is the ranks' to set (block must be None)",
            ));
        }
        cfg.validate()?;
        let _ = dtype;
        let n: usize = self.local_rows(cfg).iter().map(|r| r.len()).sum();
        let lse_len = cfg.batch * cfg.heads_q * n;
        for &(name, len) in lens {
            let width = match name {
                "k" => cfg.heads_kv * cfg.head_dim,
                "v" => cfg.heads_kv * cfg.dv(),
                "lse" => 0,
                "q" => cfg.heads_q * cfg.head_dim,
                _ => cfg.heads_q * cfg.dv(),
            };
            let want = if name == "lse" {
                lse_len
            } else {
                cfg.batch * n * width
            };
            if len != want {
                return Err(Error::invalid(format!(
                    "{name} of rank {} holds {len} elements; its {n} rows of the call ({:?} \
                     of {} over {} ranks) take {want}",
                    self.rank.comm.rank(),
                    self.local_rows(cfg),
                    cfg.seq_q,
                    self.rank.comm.size()
                )));
            }
        }
        Ok(())
    }

    fn check_shard(
        &self,
        cfg: &AttentionConfig,
        shard: &Range<usize>,
        dtype: crate::DType,
        q: usize,
        k: usize,
        v: usize,
    ) -> Result<()> {
        let _ = dtype;
        if cfg.block.is_some() {
            return Err(Error::invalid(
                "cfg is the whole call: its block is the ranks' to set (block must be None)",
            ));
        }
        cfg.validate()?;
        if shard.end > cfg.seq_kv || shard.is_empty() {
            return Err(Error::invalid(format!(
                "shard {shard:?} of rank {} must be a non-empty range of the call's {} keys",
                self.rank.comm.rank(),
                cfg.seq_kv
            )));
        }
        let n = shard.len();
        for (name, len, want) in [
            ("q", q, cfg.q_shape().iter().product::<usize>()),
            ("k", k, cfg.batch * n * cfg.heads_kv * cfg.head_dim),
            ("v", v, cfg.batch * n * cfg.heads_kv * cfg.dv()),
        ] {
            if len != want {
                return Err(Error::invalid(format!(
                    "{name} of rank {} holds {len} elements; {want} expected (shard {shard:?})",
                    self.rank.comm.rank()
                )));
            }
        }
        Ok(())
    }

    /// The ranks compare the call before any work: every field of `header` and a digest of
    /// the config (its modifiers), and whether each rank took its own inputs. A difference is
    /// [`Error::Distributed`] on every rank, naming the first rank that differs from rank 0
    /// and the field.
    fn agree(
        &self,
        cfg: &AttentionConfig,
        dtype: crate::DType,
        call: u64,
        local: Result<()>,
    ) -> Result<()> {
        let digest = {
            use std::hash::{Hash, Hasher};
            // SipHash with its fixed keys: the same on every rank of one build
            let mut h = std::collections::hash_map::DefaultHasher::new();
            format!("{:?}", cfg.whole_call()).hash(&mut h);
            h.finish()
        };
        let fields: [(&str, u64); 13] = [
            ("call (forward, backward or decode_sharded)", call),
            ("ranks", self.rank.comm.size() as u64),
            ("batch", cfg.batch as u64),
            ("seq_q", cfg.seq_q as u64),
            ("seq_kv", cfg.seq_kv as u64),
            ("heads_q", cfg.heads_q as u64),
            ("heads_kv", cfg.heads_kv as u64),
            ("head_dim", cfg.head_dim as u64),
            ("head_dim_v", cfg.dv() as u64),
            ("dtype", dtype as u64),
            ("schedule", self.rank.schedule as u64),
            ("layout", self.layout(cfg) as u64),
            (
                "config (causal, window, the modifiers and their values)",
                digest,
            ),
        ];
        let mut words: Vec<u64> = fields.iter().map(|f| f.1).collect();
        words.push(local.is_ok() as u64);
        let all = self.rank.comm.all_gather(bytemuck::cast_slice(&words))?;
        self.rank
            .count(|t| &mut t.other, all.len() / self.rank.comm.size());
        local?;
        let per = words.len();
        let all: &[u64] = &bytemuck::pod_collect_to_vec::<u8, u64>(&all);
        let me = self.rank.comm.rank();
        for r in 0..self.rank.comm.size() {
            if all[r * per + per - 1] == 0 {
                return Err(Error::Distributed {
                    rank: me,
                    message: format!("rank {r} refused its own inputs (its error says why)"),
                });
            }
        }
        for r in 1..self.rank.comm.size() {
            for (i, (name, _)) in fields.iter().enumerate() {
                let (theirs, first) = (all[r * per + i], all[i]);
                if theirs != first {
                    return Err(Error::Distributed {
                        rank: me,
                        message: format!(
                            "the ranks disagree on the call: rank {r}'s {name} is {theirs} where \
                             rank 0's is {first}"
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}
