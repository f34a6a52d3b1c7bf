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
//! work the ranks compare the call ([`agree`]: an all-gather of its fields): a rank that
//! disagrees makes every rank fail with [`Error::Distributed`] naming the rank, the field and
//! both values in the caller's words (`rank 1 calls with causal = false, rank 0 with causal =
//! true`); a rank that refused its own inputs gets its own typed error, and every other rank
//! an [`Error::Distributed`] that carries its reason; a rank that does not answer within
//! [`comm::TIMEOUT_ENV`] seconds is an error naming it. Nothing is written to a caller's
//! buffer: results are new vectors.

mod agree;
mod comm;
mod layout;
#[cfg(feature = "mpi")]
mod mpi;
mod rank;
mod ring;

use std::ops::Range;

pub use agree::{agree, Terms};
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
        let local = self.check(cfg, &[("q", q.len()), ("k", k.len()), ("v", v.len())]);
        self.rank.traffic.set(Traffic::default());
        self.agree(cfg, T::DTYPE, "forward", Vec::new(), local)?;
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
            &[
                ("q", q.len()),
                ("k", k.len()),
                ("v", v.len()),
                ("out", out.len()),
                ("lse", lse.len()),
                ("d_out", d_out.len()),
            ],
        );
        self.rank.traffic.set(Traffic::default());
        self.agree(cfg, T::DTYPE, "backward", Vec::new(), local)?;
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
    /// rank's keys of it (the ranks' shards in rank order must tile `0..seq_kv`, else
    /// [`Error::Distributed`] on every rank), `k`, `v` its rows `[batch, shard.len(),
    /// heads_kv, dim]`. Each rank attends to its shard (a block of the call where a mask or
    /// modifier reads positions, else a plain call, which the decode kernel takes); one
    /// all-gather of the partials, merged in rank order, gives every rank the same `out` and
    /// `lse`. Sinks are counted once (on rank 0). A shard may be empty (a rank of the cache
    /// that holds no key yet): it adds nothing, and where every shard is (`seq_kv` 0) the
    /// result is a call's with no visible key, out 0 and lse -inf (or the sink).
    pub fn decode_sharded<T: Element>(
        &self,
        cfg: &AttentionConfig,
        shard: Range<usize>,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<HostForward<T>> {
        self.rank.traffic.set(Traffic::default());
        let local = self.check_shard(cfg, &shard, (q.len(), k.len(), v.len()));
        let own = vec![shard.start as u64, shard.end as u64];
        let all = self.agree(cfg, T::DTYPE, "decode_sharded", own, local)?;
        // every rank's own words are its shard: the ranks agreed on the call (decode_sharded)
        let shards: Vec<(u64, u64)> = all
            .iter()
            .map(|t| match t.own[..] {
                [start, end] => (start, end),
                _ => (0, 0),
            })
            .collect();
        tiles(&shards, cfg.seq_kv, self.rank.comm.rank())?;
        let f = ring::decode_sharded(&self.rank, cfg, shard, (q, k, v))?;
        Ok(HostForward {
            out: crate::dtype::from_f32_slice(&f.out),
            lse: f.lse,
        })
    }

    /// This rank's own inputs against the call: a typed error for its own caller (the other
    /// ranks learn it in the agreement, its message the reason).
    fn check(&self, cfg: &AttentionConfig, lens: &[(&str, usize)]) -> Result<()> {
        if cfg.seq_q != cfg.seq_kv {
            return Err(Error::invalid(format!(
                "context parallelism splits one sequence for queries and keys: seq_q must \
                 equal seq_kv, got {} and {}",
                cfg.seq_q, cfg.seq_kv
            )));
        }
        whole_call_only(cfg)?;
        cfg.validate()?;
        let rows = self.local_rows(cfg);
        let n: usize = rows.iter().map(|r| r.len()).sum();
        for &(name, len) in lens {
            // the elements of one local row: [batch, rows, heads, dim], lse [batch, heads_q, rows]
            let per_row = cfg.batch
                * match name {
                    "q" => cfg.heads_q * cfg.head_dim,
                    "k" => cfg.heads_kv * cfg.head_dim,
                    "v" => cfg.heads_kv * cfg.dv(),
                    "lse" => cfg.heads_q,
                    _ => cfg.heads_q * cfg.dv(),
                };
            if len != n * per_row {
                let given = if len % per_row == 0 {
                    format!("{} rows of {per_row}", len / per_row)
                } else {
                    format!("not a whole number of rows of {per_row}")
                };
                return Err(Error::invalid(format!(
                    "{name} of rank {} holds {len} elements ({given}) where its rows of the \
                     call, {rows:?} ({n} of {} over {} ranks, {:?} layout), take {}: pass this \
                     rank's rows (local_rows)",
                    self.rank.comm.rank(),
                    cfg.seq_q,
                    self.rank.comm.size(),
                    self.layout(cfg),
                    n * per_row,
                )));
            }
        }
        Ok(())
    }

    /// [`check`](Self::check) for `decode_sharded`: this rank's shard and its k, v. A call of
    /// no keys at all (every shard empty) is checked as one of a key: a one-device call needs
    /// one, a sharded cache may hold none yet.
    fn check_shard(
        &self,
        cfg: &AttentionConfig,
        shard: &Range<usize>,
        (q, k, v): (usize, usize, usize),
    ) -> Result<()> {
        whole_call_only(cfg)?;
        AttentionConfig {
            seq_kv: cfg.seq_kv.max(1),
            ..cfg.clone()
        }
        .validate()?;
        if shard.start > shard.end || shard.end > cfg.seq_kv {
            return Err(Error::invalid(format!(
                "shard {shard:?} of rank {} must be a range of the call's {} keys (start <= end \
                 <= seq_kv; empty where the rank holds none)",
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
                    "{name} of rank {} holds {len} elements; {want} expected ({}, shard \
                     {shard:?})",
                    self.rank.comm.rank(),
                    if name == "q" {
                        "every query row, on every rank".to_string()
                    } else {
                        format!("{n} keys")
                    }
                )));
            }
        }
        Ok(())
    }

    /// The ranks compare the call before any work ([`agree`]): its fields in the caller's
    /// words ([`Rank::call_terms`]) and this rank's `own` words, or why this rank refused its
    /// inputs (`local`, which this rank returns as it is). Every rank's terms where all agree.
    fn agree(
        &self,
        cfg: &AttentionConfig,
        dtype: crate::DType,
        call: &str,
        own: Vec<u64>,
        local: Result<()>,
    ) -> Result<Vec<Terms>> {
        let terms = match &local {
            Ok(()) => Terms {
                call: self.rank.call_terms(cfg, dtype, call),
                own,
                refused: None,
            },
            Err(e) => Terms::refusal(e.to_string()),
        };
        let agreed = agree::agree_counted(self.rank.comm, &terms);
        local?;
        let (all, sent) = agreed?;
        self.rank.count(|t| &mut t.other, sent);
        Ok(all)
    }
}

/// `cfg` names the whole call: its block is the ranks' to set.
fn whole_call_only(cfg: &AttentionConfig) -> Result<()> {
    match cfg.block {
        Some(_) => Err(Error::invalid(
            "cfg is the whole call: its block is the ranks' to set (block must be None)",
        )),
        None => Ok(()),
    }
}

/// The ranks' shards (`(start, end)` each, in rank order) tile `0..seq_kv`, or the first that
/// does not follow on, named alike on every rank.
fn tiles(shards: &[(u64, u64)], seq_kv: usize, me: usize) -> Result<()> {
    let mut at = 0;
    for (r, &(start, end)) in shards.iter().enumerate() {
        if start != at {
            return Err(Error::Distributed {
                rank: me,
                message: format!(
                    "the ranks' shards must tile the call's {seq_kv} keys in rank order: rank \
                     {r}'s is {start}..{end}, where {} {at}",
                    if r == 0 {
                        "the first must start at".to_string()
                    } else {
                        format!("rank {}'s ends at", r - 1)
                    }
                ),
            });
        }
        at = end;
    }
    if at != seq_kv as u64 {
        return Err(Error::Distributed {
            rank: me,
            message: format!(
                "the ranks' shards must tile the call's {seq_kv} keys in rank order: the last \
                 ends at {at}"
            ),
        });
    }
    Ok(())
}
