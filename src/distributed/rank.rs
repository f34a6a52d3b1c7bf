//! One rank's state in a context-parallel call, apart from the calls themselves so that the
//! ring (`ring.rs`) and the public face (`mod.rs`) both read it without naming each other.

use std::cell::Cell;
use std::ops::Range;

use super::comm::Comm;
use super::layout::Layout;
use crate::config::AttentionConfig;
use crate::device::Context;

/// How the K/V blocks reach the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Round the ring, a block at a time, overlapping the work.
    Ring,
    /// All at once: every rank gathers every block (Llama 3's context parallelism).
    AllGather,
    /// All-gather where each rank's K/V block (f32) is under [`ALL_GATHER_BELOW`] bytes, the
    /// ring otherwise.
    Auto,
}

/// [`Schedule::Auto`]'s threshold: a rank's K and V under this many bytes (f32) take the
/// all-gather (a ring step then moves too little to pay a network's latency, and the
/// gathered K/V is small; set by that cost model, not by a measurement across machines:
/// docs/log/distributed.md).
pub const ALL_GATHER_BELOW: usize = 1 << 20;

/// What a rank sent in its last call, by kind, in bytes: the traffic the model predicts
/// (the ring: K and V once round, forward; K, V, dK and dV, backward).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// K and V blocks (the dtype's bytes).
    pub kv: u64,
    /// dK and dV accumulators (f32).
    pub grads: u64,
    /// Headers, partial results and the rest.
    pub other: u64,
}

/// This rank: its context, its communicator, the schedule and layout every call takes, and
/// the bytes the last call sent.
pub(super) struct Rank<'a> {
    pub(super) ctx: &'a Context,
    pub(super) comm: &'a dyn Comm,
    pub(super) schedule: Schedule,
    pub(super) layout: Option<Layout>,
    pub(super) traffic: Cell<Traffic>,
}

impl<'a> Rank<'a> {
    pub(super) fn new(ctx: &'a Context, comm: &'a dyn Comm) -> Self {
        Rank {
            ctx,
            comm,
            schedule: Schedule::Ring,
            layout: None,
            traffic: Cell::new(Traffic::default()),
        }
    }

    /// As set, else zigzag where the call is causal and contiguous otherwise.
    pub(super) fn layout(&self, cfg: &AttentionConfig) -> Layout {
        self.layout.unwrap_or(Layout::for_causal(cfg.causal))
    }

    pub(super) fn local_rows(&self, cfg: &AttentionConfig) -> Vec<Range<usize>> {
        self.layout(cfg)
            .rows(cfg.seq_q, self.comm.size(), self.comm.rank())
    }

    /// Adds `bytes` to the kind of traffic `kind` picks.
    pub(super) fn count(&self, kind: fn(&mut Traffic) -> &mut u64, bytes: usize) {
        let mut t = self.traffic.get();
        *kind(&mut t) += bytes as u64;
        self.traffic.set(t);
    }
}
