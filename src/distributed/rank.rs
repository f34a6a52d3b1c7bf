//! One rank's state in a context-parallel call, apart from the calls themselves so that the
//! ring (`ring.rs`) and the public face (`mod.rs`) both read it without naming each other.

use std::cell::Cell;
use std::ops::Range;

use super::agree::term;
use super::comm::Comm;
use super::layout::Layout;
use crate::config::AttentionConfig;
use crate::device::Context;
use crate::DType;

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

    /// The fields of `call` (forward, backward, decode_sharded) over `cfg` in `dtype` that every
    /// rank must give alike, in the caller's words, in the order a difference is reported: the
    /// call and its shape, the dtype, every field of the config (the destructuring names each,
    /// so that a new field cannot be left out), then the schedule and the layout (after
    /// `causal`, which sets it unless `with_layout` does).
    pub(super) fn call_terms(
        &self,
        cfg: &AttentionConfig,
        dtype: DType,
        call: &str,
    ) -> Vec<(String, String)> {
        let AttentionConfig {
            batch,
            seq_q,
            seq_kv,
            heads_q,
            heads_kv,
            head_dim,
            head_dim_v: _, // as dv() below: None and Some(head_dim) are one call
            values_in_keys,
            causal,
            window,
            softcap,
            alibi_slopes,
            sinks,
            seqlens_kv,
            align_to_seqlens,
            leftpad_kv,
            paged,
            dropout,
            block_mask,
            mask,
            bias,
            varlen,
            score_mod,
            mask_mod,
            softmax_scale,
            algorithm,
            kv_splits,
            block: _, // None: checked before
        } = cfg;
        fn or_none<T>(x: &Option<T>, show: impl Fn(&T) -> String) -> String {
            x.as_ref().map_or("None".into(), show)
        }
        let debug = |x: &dyn std::fmt::Debug| format!("{x:?}");
        let side = |s: Option<usize>| s.map_or("None".into(), |n| n.to_string());
        vec![
            term("call", call),
            term("ranks", self.comm.size()),
            term("batch", batch),
            term("seq_q", seq_q),
            term("seq_kv", seq_kv),
            term("heads_q", heads_q),
            term("heads_kv", heads_kv),
            term("head_dim", head_dim),
            term("head_dim_v", cfg.dv()),
            term("dtype", dtype),
            term("causal", causal),
            term(
                "window",
                format!("({}, {})", side(window.left), side(window.right)),
            ),
            term("softmax_scale", or_none(softmax_scale, f32::to_string)),
            term("softcap", or_none(softcap, f32::to_string)),
            term("alibi_slopes", or_none(alibi_slopes, |x| debug(x))),
            term("sinks", or_none(sinks, |x| debug(x))),
            term(
                "dropout",
                or_none(dropout, |d| {
                    format!("p {}, seed {}, offset {}", d.p, d.seed, d.offset)
                }),
            ),
            term("score_mod", or_none(score_mod, |m| debug(&m.wgsl_source()))),
            term(
                "score_mod's tensors",
                or_none(score_mod, |m| debug(&m.captured())),
            ),
            term(
                "score_mod's trainable tensor",
                or_none(score_mod, |m| debug(&m.trainable())),
            ),
            term("mask_mod", or_none(mask_mod, |m| debug(&m.wgsl_source()))),
            term(
                "mask_mod's tensors",
                or_none(mask_mod, |m| debug(&m.captured())),
            ),
            term("block_mask", or_none(block_mask, |x| debug(x))),
            term("seqlens_kv", or_none(seqlens_kv, |x| debug(x))),
            term("align_to_seqlens", align_to_seqlens),
            term("leftpad_kv", or_none(leftpad_kv, |x| debug(x))),
            term("values_in_keys", values_in_keys),
            term("paged", or_none(paged, |x| debug(x))),
            term("mask", or_none(mask, |x| debug(x))),
            term("bias", or_none(bias, |x| debug(x))),
            term("varlen", or_none(varlen, |x| debug(x))),
            term("algorithm", debug(algorithm)),
            term("kv_splits", or_none(kv_splits, usize::to_string)),
            term("schedule", debug(&self.schedule)),
            term("layout", debug(&self.layout(cfg))),
        ]
    }
}
