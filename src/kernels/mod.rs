//! Kernels: their identities and bindings (this file), the pure tile chooser (`tiles`), the
//! parameter block (`params`), WGSL assembly (`wgsl`) and the pipeline cache (`cache`).
//!
//! Every pipeline is `prelude + common.wgsl + kernel.wgsl`. The generated prelude holds the
//! shape constants that size register and workgroup arrays, the kernel's bindings, and the
//! element load/store functions for the call's dtype and storage mode; booleans are
//! `override` constants.

pub mod enumerate;
pub mod flags;
pub mod hooks;
pub mod params;
mod rows;
pub mod tiles;
pub mod wgsl;

pub use params::{fold_grid, Params};
pub use tiles::{
    choose_tiles, fit_to_blocks, workgroup_words, DeviceCaps, GpuClass, Tiles, CPU_PRIVATE_FLOATS,
    GPU_PRIVATE_FLOATS,
};
pub use wgsl::{KernelKey, WgslConsumer};

/// Every compute kernel of the crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// A tiled FlashAttention kernel: a family (how a tile is spread over invocations) and
    /// the pass it runs.
    Flash(Variant, Pass),
    FlashBwdPreprocess,
    FlashBwdSinks,
    FlashBwdBias,
    /// A trainable captured tensor's gradient, in parts (`shaders/flash_bwd_table.wgsl`).
    FlashBwdTable,
    /// The parts of a trainable tensor's gradient summed in order
    /// (`shaders/flash_bwd_table_sum.wgsl`).
    FlashBwdTableSum,
    Merge,
    FlashDecode,
    FlashDecodeOne,
    FlashDecodeCombine,
    NaiveScores,
    NaiveSoftmax,
    NaivePv,
    NaiveBwdProbs,
    NaiveBwdDp,
    NaiveBwdDs,
    NaiveBwdDkDv,
    NaiveBwdDq,
    Cast,
    /// Rotary position embedding of q or the new keys of a KV-cache call
    /// (`shaders/rotary.wgsl`).
    Rotary,
    /// The quantizing append of a KV-cache call into an 8-bit cache (`KernelKey::kv`)
    KvQuantize,
    /// A user mask's block mask (`Context::create_block_mask`, `shaders/mask_blocks.wgsl`).
    MaskBlocks,
    Canary,
    RooflineFma,
    RooflineFmaF16,
    RooflineCoop,
    RooflineCopy,
}

/// A pass of the tiled algorithm, named by what it produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    /// out and lse, Q resident, K and V streamed.
    Forward,
    /// The backward's dK and dV, K and V resident, Q and dO streamed.
    DkDv,
    /// The backward's dQ, Q and dO resident, K and V streamed.
    Dq,
}

impl Pass {
    pub const ALL: [Pass; 3] = [Pass::Forward, Pass::DkDv, Pass::Dq];

    /// The pass's part of kernel names (`flash_fwd_rows`, `flash_bwd_dkdv_blocks`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Pass::Forward => "fwd",
            Pass::DkDv => "bwd_dkdv",
            Pass::Dq => "bwd_dq",
        }
    }
}

/// How a kernel uses binding slot i+1 (slot 0 is always the `Params` uniform).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
}

/// What a binding's array holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindType {
    /// A tensor of the call's element type, read through `load_<name>(i) -> f32` and written
    /// through `store_<name>(i, x)`, functions the prelude generates per storage format.
    Elem,
    /// `array<f32>`: lse and the naive path's score matrices.
    F32,
    /// `array<vec2<f32>>`: the backward's per-row (lse2, delta) pairs.
    Vec2F32,
    /// `array<u32>`.
    U32,
    /// `array<vec4<f32>>`.
    Vec4F32,
}

/// One storage binding of a kernel: its WGSL name, what it holds and how it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    pub name: &'static str,
    pub ty: BindType,
    pub access: Access,
}

const fn b(name: &'static str, ty: BindType, access: Access) -> Binding {
    Binding { name, ty, access }
}

use Access::{Read as R, ReadWrite as W};
use BindType::{Elem as E, Vec2F32 as V2, Vec4F32 as V4, F32, U32};

impl Kernel {
    pub const ALL: [Kernel; 35] = [
        Kernel::FlashBwdPreprocess,
        Kernel::Flash(Variant::Rows, Pass::Forward),
        Kernel::Flash(Variant::Rows, Pass::DkDv),
        Kernel::Flash(Variant::Rows, Pass::Dq),
        Kernel::Flash(Variant::Blocks, Pass::Forward),
        Kernel::Flash(Variant::Blocks, Pass::DkDv),
        Kernel::Flash(Variant::Blocks, Pass::Dq),
        Kernel::Flash(Variant::Coop, Pass::Forward),
        Kernel::Flash(Variant::Coop, Pass::DkDv),
        Kernel::Flash(Variant::Coop, Pass::Dq),
        Kernel::FlashBwdSinks,
        Kernel::FlashBwdBias,
        Kernel::FlashBwdTable,
        Kernel::FlashBwdTableSum,
        Kernel::Merge,
        Kernel::FlashDecode,
        Kernel::FlashDecodeOne,
        Kernel::FlashDecodeCombine,
        Kernel::NaiveScores,
        Kernel::NaiveSoftmax,
        Kernel::NaivePv,
        Kernel::NaiveBwdProbs,
        Kernel::NaiveBwdDp,
        Kernel::NaiveBwdDs,
        Kernel::NaiveBwdDkDv,
        Kernel::NaiveBwdDq,
        Kernel::Cast,
        Kernel::Rotary,
        Kernel::KvQuantize,
        Kernel::MaskBlocks,
        Kernel::Canary,
        Kernel::RooflineFma,
        Kernel::RooflineFmaF16,
        Kernel::RooflineCoop,
        Kernel::RooflineCopy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::FlashBwdPreprocess => "flash_bwd_preprocess",
            Kernel::Flash(Variant::Rows, Pass::Forward) => "flash_fwd_rows",
            Kernel::Flash(Variant::Rows, Pass::DkDv) => "flash_bwd_dkdv_rows",
            Kernel::Flash(Variant::Rows, Pass::Dq) => "flash_bwd_dq_rows",
            Kernel::Flash(Variant::Blocks, Pass::Forward) => "flash_fwd_blocks",
            Kernel::Flash(Variant::Blocks, Pass::DkDv) => "flash_bwd_dkdv_blocks",
            Kernel::Flash(Variant::Blocks, Pass::Dq) => "flash_bwd_dq_blocks",
            Kernel::Flash(Variant::Coop, Pass::Forward) => "flash_fwd_coop",
            Kernel::Flash(Variant::Coop, Pass::DkDv) => "flash_bwd_dkdv_coop",
            Kernel::Flash(Variant::Coop, Pass::Dq) => "flash_bwd_dq_coop",
            Kernel::FlashBwdSinks => "flash_bwd_sinks",
            Kernel::FlashBwdBias => "flash_bwd_bias",
            Kernel::FlashBwdTable => "flash_bwd_table",
            Kernel::FlashBwdTableSum => "flash_bwd_table_sum",
            Kernel::Merge => "merge",
            Kernel::FlashDecode => "flash_decode",
            Kernel::FlashDecodeOne => "flash_decode_one",
            Kernel::FlashDecodeCombine => "flash_decode_combine",
            Kernel::NaiveScores => "naive_scores",
            Kernel::NaiveSoftmax => "naive_softmax",
            Kernel::NaivePv => "naive_pv",
            Kernel::NaiveBwdProbs => "naive_bwd_probs",
            Kernel::NaiveBwdDp => "naive_bwd_dp",
            Kernel::NaiveBwdDs => "naive_bwd_ds",
            Kernel::NaiveBwdDkDv => "naive_bwd_dkdv",
            Kernel::NaiveBwdDq => "naive_bwd_dq",
            Kernel::Cast => "cast",
            Kernel::Rotary => "rotary",
            Kernel::KvQuantize => "kv_quantize",
            Kernel::MaskBlocks => "mask_blocks",
            Kernel::Canary => "canary",
            Kernel::RooflineFma => "roofline_fma",
            Kernel::RooflineFmaF16 => "roofline_fma_f16",
            Kernel::RooflineCoop => "roofline_coop",
            Kernel::RooflineCopy => "roofline_copy",
        }
    }

    pub fn source(self) -> &'static str {
        match self {
            Kernel::FlashBwdPreprocess => include_str!("../../shaders/flash_bwd_preprocess.wgsl"),
            Kernel::Flash(Variant::Rows, Pass::Forward) => {
                include_str!("../../shaders/flash_fwd_rows.wgsl")
            }
            Kernel::Flash(Variant::Rows, Pass::DkDv) => {
                include_str!("../../shaders/flash_bwd_dkdv_rows.wgsl")
            }
            Kernel::Flash(Variant::Rows, Pass::Dq) => {
                include_str!("../../shaders/flash_bwd_dq_rows.wgsl")
            }
            Kernel::Flash(Variant::Blocks, Pass::Forward) => {
                include_str!("../../shaders/flash_fwd_blocks.wgsl")
            }
            Kernel::Flash(Variant::Blocks, Pass::DkDv) => {
                include_str!("../../shaders/flash_bwd_dkdv_blocks.wgsl")
            }
            Kernel::Flash(Variant::Blocks, Pass::Dq) => {
                include_str!("../../shaders/flash_bwd_dq_blocks.wgsl")
            }
            Kernel::Flash(Variant::Coop, Pass::Forward) => {
                include_str!("../../shaders/flash_fwd_coop.wgsl")
            }
            Kernel::Flash(Variant::Coop, Pass::DkDv) => {
                include_str!("../../shaders/flash_bwd_dkdv_coop.wgsl")
            }
            Kernel::Flash(Variant::Coop, Pass::Dq) => {
                include_str!("../../shaders/flash_bwd_dq_coop.wgsl")
            }
            Kernel::FlashBwdSinks => include_str!("../../shaders/flash_bwd_sinks.wgsl"),
            Kernel::FlashBwdBias => include_str!("../../shaders/flash_bwd_bias.wgsl"),
            Kernel::FlashBwdTable => include_str!("../../shaders/flash_bwd_table.wgsl"),
            Kernel::FlashBwdTableSum => include_str!("../../shaders/flash_bwd_table_sum.wgsl"),
            Kernel::Merge => include_str!("../../shaders/merge.wgsl"),
            Kernel::FlashDecode | Kernel::FlashDecodeOne => {
                include_str!("../../shaders/flash_decode.wgsl")
            }
            Kernel::FlashDecodeCombine => {
                include_str!("../../shaders/flash_decode_combine.wgsl")
            }
            Kernel::NaiveScores => include_str!("../../shaders/naive_scores.wgsl"),
            Kernel::NaiveSoftmax => include_str!("../../shaders/naive_softmax.wgsl"),
            Kernel::NaivePv => include_str!("../../shaders/naive_pv.wgsl"),
            Kernel::NaiveBwdProbs => include_str!("../../shaders/naive_bwd_probs.wgsl"),
            Kernel::NaiveBwdDp => include_str!("../../shaders/naive_bwd_dp.wgsl"),
            Kernel::NaiveBwdDs => include_str!("../../shaders/naive_bwd_ds.wgsl"),
            Kernel::NaiveBwdDkDv => include_str!("../../shaders/naive_bwd_dkdv.wgsl"),
            Kernel::NaiveBwdDq => include_str!("../../shaders/naive_bwd_dq.wgsl"),
            Kernel::Cast => include_str!("../../shaders/cast.wgsl"),
            Kernel::Rotary => include_str!("../../shaders/rotary.wgsl"),
            Kernel::KvQuantize => include_str!("../../shaders/kv_quantize.wgsl"),
            Kernel::MaskBlocks => include_str!("../../shaders/mask_blocks.wgsl"),
            Kernel::Canary => include_str!("../../shaders/canary.wgsl"),
            // one probe in two types: the prelude defines FT
            Kernel::RooflineFma | Kernel::RooflineFmaF16 => {
                include_str!("../../shaders/roofline_fma.wgsl")
            }
            Kernel::RooflineCoop => include_str!("../../shaders/roofline_coop.wgsl"),
            Kernel::RooflineCopy => include_str!("../../shaders/roofline_copy.wgsl"),
        }
    }

    /// Storage bindings 1.. in order. The prelude declares them from this table, so the
    /// shader and the host cannot disagree.
    pub fn bindings(self) -> &'static [Binding] {
        const Q: Binding = b("q", E, R);
        const K: Binding = b("k", E, R);
        const V: Binding = b("v", E, R);
        const D_OUT: Binding = b("d_out", E, R);
        const LSE: Binding = b("lse", F32, R);
        // the backward's rows: (lse in the exp2 domain, delta) per query row, written by the
        // preprocess, so that a dK/dV kernel takes 7 storage bindings and leaves the 8th of
        // the WebGPU default for a score tensor
        const LSE_DELTA: Binding = b("lse_delta", V2, R);
        match self {
            Kernel::Flash(_, Pass::Forward) => {
                const { &[Q, K, V, b("out", E, W), b("lse", F32, W)] }
            }
            Kernel::FlashBwdPreprocess => {
                const { &[b("out", E, R), D_OUT, LSE, b("lse_delta", V2, W)] }
            }
            Kernel::Flash(_, Pass::DkDv) => {
                const { &[Q, K, V, D_OUT, LSE_DELTA, b("dk", E, W), b("dv", E, W)] }
            }
            Kernel::Flash(_, Pass::Dq) => const { &[Q, K, V, D_OUT, LSE_DELTA, b("dq", E, W)] },
            Kernel::FlashBwdSinks => const { &[LSE_DELTA, b("d_sinks", F32, W)] },
            Kernel::FlashBwdBias => const { &[b("kept_grads", F32, R), b("d_bias", E, W)] },
            // the kept gradients and scores (two words a pair) in, a part per workgroup out
            Kernel::FlashBwdTable => const { &[b("kept_grads", F32, R), b("parts", F32, W)] },
            Kernel::FlashBwdTableSum => const { &[b("parts", F32, R), b("d_table", F32, W)] },
            // one shard folded into the running merge: lse ping-pongs between two scratch
            // buffers (a binding cannot be read-only and read-write in one dispatch)
            Kernel::Merge => {
                const {
                    &[
                        b("shard_out", E, R),
                        b("shard_lse", F32, R),
                        b("lse_in", F32, R),
                        b("acc", F32, W),
                        b("lse_out", F32, W),
                        b("out", E, W),
                    ]
                }
            }
            Kernel::FlashDecode => {
                const { &[Q, K, V, b("part_out", F32, W), b("part_lse", F32, W)] }
            }
            // one split: the rows' out and lse, finished in the kernel
            Kernel::FlashDecodeOne => const { &[Q, K, V, b("out", E, W), b("lse", F32, W)] },
            Kernel::FlashDecodeCombine => {
                const {
                    &[
                        b("part_out", F32, R),
                        b("part_lse", F32, R),
                        b("out", E, W),
                        b("lse", F32, W),
                    ]
                }
            }
            Kernel::NaiveScores => const { &[Q, K, b("scores", F32, W)] },
            Kernel::NaiveSoftmax => {
                const { &[b("scores", F32, R), b("probs", F32, W), b("lse", F32, W)] }
            }
            Kernel::NaivePv => const { &[b("probs", F32, R), V, b("out", E, W)] },
            Kernel::NaiveBwdProbs => const { &[Q, K, LSE, b("probs", F32, W)] },
            Kernel::NaiveBwdDp => const { &[D_OUT, V, b("dp", F32, W)] },
            // dS is written over dP; lse gives back the score a softcap differentiates at
            // q and k: the raw score where a score transform is on
            Kernel::NaiveBwdDs => const { &[b("probs", F32, R), LSE_DELTA, b("ds", F32, W), Q, K] },
            Kernel::NaiveBwdDkDv => {
                const {
                    &[
                        b("probs", F32, R),
                        b("ds", F32, R),
                        Q,
                        D_OUT,
                        b("dk", E, W),
                        b("dv", E, W),
                    ]
                }
            }
            Kernel::NaiveBwdDq => const { &[b("ds", F32, R), K, b("dq", E, W)] },
            Kernel::Cast => const { &[b("src", F32, R), b("dst", E, W)] },
            // the tables are [table_rows, rotary_dim / 2] in the tensor's format; positions
            // holds each batch's first position (the plan's pair data)
            Kernel::Rotary => {
                const {
                    &[
                        b("src", E, R),
                        b("rot_cos", E, R),
                        b("rot_sin", E, R),
                        b("positions", U32, R),
                        b("dst", E, W),
                    ]
                }
            }
            // rows holds each new row's cache row (the plan's pair data); the cache is words
            Kernel::KvQuantize => {
                const { &[b("src", E, R), b("rows", U32, R), b("cache", U32, W)] }
            }
            Kernel::Canary => const { &[b("counter", U32, W)] },
            // 1.0 where the block has a pair the mask lets through
            Kernel::MaskBlocks => const { &[b("blocks", F32, W)] },
            Kernel::RooflineFma | Kernel::RooflineFmaF16 | Kernel::RooflineCoop => {
                const { &[b("sink", F32, W)] }
            }
            Kernel::RooflineCopy => const { &[b("src", V4, R), b("dst", V4, W)] },
        }
    }

    /// True when the kernel finishes scores or rows (`begin_head` in common.wgsl): the
    /// kernels that read the per-head extras (ALiBi slopes, sinks) when a call has them.
    pub fn finishes_scores(self) -> bool {
        self.is_tiled()
            || matches!(
                self,
                Kernel::NaiveSoftmax
                    | Kernel::NaiveBwdProbs
                    | Kernel::NaiveBwdDs
                    | Kernel::FlashBwdSinks
                    | Kernel::FlashDecode
                    | Kernel::FlashDecodeOne
                    | Kernel::FlashDecodeCombine
            )
    }

    /// True when the kernel weighs values by probabilities (P V, P^T dO) or takes dP into dS:
    /// those take the dropout factor (`dropout_scale` in shaders/modifiers/dropout.wgsl).
    pub fn applies_dropout(self) -> bool {
        self.is_tiled()
            || matches!(
                self,
                Kernel::NaiveSoftmax
                    | Kernel::NaiveBwdDs
                    | Kernel::NaiveBwdDkDv
                    | Kernel::FlashDecode
                    | Kernel::FlashDecodeOne
            )
    }

    /// The decode kernel (`flash_decode.wgsl`): partial results of a key split
    /// (`FlashDecode`, merged by `FlashDecodeCombine`), or out and lse of a call in one split
    /// (`FlashDecodeOne`).
    pub fn is_decode(self) -> bool {
        matches!(self, Kernel::FlashDecode | Kernel::FlashDecodeOne)
    }

    /// True when the kernel meets the gradient at every visited pair's finished score where
    /// that gradient can be kept for d_bias and d_table (`keep_grad`: the dQ kernels, the
    /// naive dS kernel).
    pub fn keeps_grads(self) -> bool {
        matches!(self, Kernel::Flash(_, Pass::Dq) | Kernel::NaiveBwdDs)
    }

    /// True when the kernel can sum a small trainable tensor's gradient itself
    /// (`KernelKey::sums_table`: the tiled dQ kernels, which call `table_flush` last).
    pub fn sums_table(self) -> bool {
        matches!(self, Kernel::Flash(_, Pass::Dq))
    }

    /// True when the kernel reads the kept gradients (`keep_grad`'s scratch, bound as
    /// `kept_grads`): d_bias's and d_table's.
    pub fn reads_kept_grads(self) -> bool {
        self.bindings().iter().any(|b| b.name == "kept_grads")
    }

    /// The modifier bits ([`flags`]) this kernel's code reads, when a pipeline is planned for
    /// a call (`plan::key`): every bit where scores are finished (dropout only where
    /// probabilities weigh values), the band where naive kernels bound their work by it, paged
    /// K/V where K or V is bound, a latent cache where v or dv is, views where an input is
    /// read. Every other bit is compiled in
    /// as false, so that calls differing only in bits a kernel never reads share its pipeline.
    /// tests/shaders.rs checks this against the flag functions each entry point reaches.
    pub fn reads_flags(self) -> u32 {
        use flags::*;
        let reads = |names: &[&str]| {
            self.bindings()
                .iter()
                .any(|b| b.access == Access::Read && names.contains(&b.name))
        };
        let mut bits = match self {
            // the kernels that meet rows, not scores: the sinks' gradient, the decode merge
            Kernel::FlashBwdSinks | Kernel::FlashDecodeCombine => {
                CAUSAL | WINDOW | ALIBI | SINKS | SEQLENS | BLOCKS | VARLEN | MASK
            }
            // the naive dS kernel finishes scores of pairs P already masked
            Kernel::NaiveBwdDs => !(DROPOUT | PAGED | VIEWS | MASK_MOD | LATENT) & every(),
            k if k.finishes_scores() => !(DROPOUT | PAGED | VIEWS | LATENT) & every(),
            // the naive kernels that bound their loops by the band, and the naive dK/dV's
            // per-head state (begin_head)
            Kernel::NaivePv | Kernel::NaiveBwdDq => CAUSAL | WINDOW,
            Kernel::NaiveBwdDkDv => CAUSAL | WINDOW | ALIBI | SINKS | SEQLENS | BLOCKS | MASK,
            Kernel::MaskBlocks => MASK_MOD,
            // runs the user's score_mod (its derivative in the trainable tensor)
            Kernel::FlashBwdTable => SCORE_MOD,
            _ => 0,
        };
        if self.applies_dropout() {
            bits |= DROPOUT;
        }
        if reads(&["k", "v"]) {
            bits |= PAGED;
        }
        // v and dv rows are found by v_index, which a latent cache turns into key rows
        if self.bindings().iter().any(|b| matches!(b.name, "v" | "dv")) {
            bits |= LATENT;
        }
        if reads(&["q", "k", "v", "out", "d_out"]) {
            bits |= VIEWS;
        }
        bits
    }

    /// True when the kernel's code depends on the head dimension (its `HEAD_DIM` constant):
    /// the others share one pipeline across head dims (planned with head_dim 1).
    /// tests/shaders.rs checks this against the functions each entry point reaches.
    pub fn reads_head_dim(self) -> bool {
        !matches!(
            self,
            Kernel::FlashBwdSinks
                | Kernel::FlashBwdBias
                | Kernel::FlashBwdTable
                | Kernel::FlashBwdTableSum
                | Kernel::Merge
                | Kernel::NaiveSoftmax
                | Kernel::Cast
                | Kernel::Rotary
                | Kernel::MaskBlocks
                | Kernel::Canary
                | Kernel::RooflineFma
                | Kernel::RooflineFmaF16
                | Kernel::RooflineCoop
                | Kernel::RooflineCopy
        )
    }

    /// True when the kernel reads rows of values, outputs or their gradients apart from q's and
    /// k's (the prelude's `HEAD_DIM_V`, through `v_at`, `out_at`, `dout_at`, `o_index` or
    /// `v_index`): the kernels that run calls whose values have a head dim of their own
    /// (`plan::head_dims`). The others get one pipeline whatever the values' dim
    /// (`KernelKey::head_dim_v` 0). tests/shaders.rs checks this against the functions each
    /// entry point reaches.
    pub fn reads_value_dim(self) -> bool {
        matches!(
            self,
            Kernel::NaivePv
                | Kernel::NaiveBwdDp
                | Kernel::NaiveBwdDkDv
                | Kernel::FlashBwdPreprocess
                | Kernel::FlashDecode
                | Kernel::FlashDecodeOne
                | Kernel::Flash(_, _)
        )
    }

    /// True when the kernel's pipelines include a call's user code (`ScoreMod`, `MaskMod`):
    /// the kernels that read either bit (`plan::key`, the block-mask builder). A snippet may
    /// define no name their sources define (`modifiers::user_code`).
    pub fn takes_user_code(self) -> bool {
        self.reads_flags() & (flags::SCORE_MOD | flags::MASK_MOD) != 0
    }

    /// The naive (materialized) algorithm's kernels.
    pub fn is_naive(self) -> bool {
        matches!(
            self,
            Kernel::NaiveScores
                | Kernel::NaiveSoftmax
                | Kernel::NaivePv
                | Kernel::NaiveBwdProbs
                | Kernel::NaiveBwdDp
                | Kernel::NaiveBwdDs
                | Kernel::NaiveBwdDkDv
                | Kernel::NaiveBwdDq
        )
    }

    /// True when the kernel reads K and V of a forward call, which may be an 8-bit KV cache
    /// (`KernelKey::kv`): the forward kernels of every algorithm and the decode kernels.
    pub fn reads_kv_cache(self) -> bool {
        matches!(
            self,
            Kernel::Flash(_, Pass::Forward)
                | Kernel::FlashDecode
                | Kernel::FlashDecodeOne
                | Kernel::NaiveScores
                | Kernel::NaivePv
        )
    }

    /// True when some binding holds the call's element type (the key's format matters).
    pub fn has_elem_bindings(self) -> bool {
        self.bindings().iter().any(|b| b.ty == BindType::Elem)
    }

    /// One invocation per item of `total_items`: the kernel file holds `fn item(e: u32)` and
    /// the generated entry point (64 invocations per workgroup, folded grid) calls it.
    pub fn is_elementwise(self) -> bool {
        matches!(
            self,
            Kernel::Cast
                | Kernel::Rotary
                | Kernel::KvQuantize
                | Kernel::MaskBlocks
                | Kernel::FlashBwdPreprocess
                | Kernel::FlashBwdBias
                | Kernel::FlashBwdTableSum
                | Kernel::Merge
                | Kernel::FlashDecodeCombine
                | Kernel::NaiveScores
                | Kernel::NaivePv
                | Kernel::NaiveBwdProbs
                | Kernel::NaiveBwdDp
                | Kernel::NaiveBwdDs
                | Kernel::NaiveBwdDkDv
                | Kernel::NaiveBwdDq
        )
    }

    pub fn is_tiled(self) -> bool {
        matches!(self, Kernel::Flash(..))
    }

    /// Tiled kernels that can run a windowed call's passes (`KernelKey::accumulate`): their
    /// element outputs are then f32 and carried from pass to pass.
    pub fn can_accumulate(self) -> bool {
        self.is_tiled()
    }

    /// Backward kernels, whose outputs are sums over the other sequence: in accumulate mode a
    /// resumed pass adds to what earlier passes stored. (The forward overwrites its output and
    /// reads it back itself to resume the running softmax.)
    pub fn sums_outputs(self) -> bool {
        matches!(self, Kernel::Flash(_, Pass::DkDv | Pass::Dq))
    }

    /// Kernels whose workgroup rows are keys (BC of them) rather than queries.
    pub fn rows_are_keys(self) -> bool {
        matches!(self, Kernel::Flash(_, Pass::DkDv))
    }

    pub fn is_rows_variant(self) -> bool {
        matches!(self, Kernel::Flash(Variant::Rows, _))
    }

    /// Kernels that multiply on cooperative matrices: they need an adapter with
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX` (16x16x16, f16 operands, f32 accumulators), `SHADER_F16`
    /// and `SUBGROUP`, and run on wgpu only (Tint has no cooperative matrices).
    pub fn is_coop(self) -> bool {
        matches!(self, Kernel::Flash(Variant::Coop, _) | Kernel::RooflineCoop)
    }

    /// Kernels built from the register micro-tiles of `shaders/blocks.wgsl`.
    pub fn is_blocks_variant(self) -> bool {
        matches!(self, Kernel::Flash(Variant::Blocks, _))
    }
}

/// Per-adapter choices of kernel shape. `Context::new` picks them from the adapter; override
/// them to benchmark or test the alternatives on one adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Which tiled-kernel variant `Algorithm::Tiled` runs.
    pub variant: Variant,
    /// For the rows variant: the subgroup size its tile reads are shared across, or 0 to share
    /// nothing. Only the adapter's fixed subgroup size (min == max) is accepted.
    pub rows_subgroup: u32,
    /// How f16 tensors are stored: `Native` (`array<f16>`, needs `SHADER_F16`) or `Packed`
    /// (two per u32 word, any adapter). bf16 is always packed.
    pub half_storage: crate::dtype::HalfStorage,
    /// For the decode kernel: whether a workgroup serves as many packed rows (query heads
    /// sharing a kv head) as `DECODE_MAX_ROWS` and its workgroup memory allow, holding the
    /// rows' q a chunk at a time (`true`: GPUs, where each key is then read by fewer
    /// workgroups), or only as many as hold q whole (`false`: CPU drivers, where a key read
    /// again costs what a workgroup-memory read does and the chunks' barriers cost more;
    /// docs/PERFORMANCE.md, "MLA decode"). `Context::new` sets it from the adapter's type.
    pub decode_q_chunks: bool,
}

/// How a tiled kernel spreads a row over invocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// One invocation per row with the row's vectors in private arrays; every invocation reads
    /// the same K/V (or Q/dO) element at once. Suits CPU drivers (lavapipe, SwiftShader, WARP),
    /// where invocations are SIMD lanes and a per-lane workgroup-memory index is a gather.
    Rows,
    /// Register micro-tiles: each invocation owns a TM x TN block of every score tile and a
    /// TM x 4 GPT block of the output, so each vec4 read from workgroup memory feeds several
    /// FMAs; rows are padded to an odd vec4 stride (no bank conflicts). Designed for GPUs
    /// (shaders/blocks.wgsl, docs/PERFORMANCE.md has its model).
    Blocks,
    /// The matrix products of the forward, dK/dV and dQ kernels on cooperative matrices
    /// (tensor cores), for f16 tensors in native storage on adapters that offer 16x16x16
    /// f16 x f16 + f32 (`Context::adapter_info` says whether this one does). Other dtypes, and
    /// head dims whose coop tiles do not fit the workgroup memory, run the blocks kernels.
    Coop,
}

impl Variant {
    /// The variants every adapter can run, for tests and benchmarks that cover them all.
    pub const ALL: [Variant; 2] = [Variant::Rows, Variant::Blocks];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Rows => "rows",
            Variant::Blocks => "blocks",
            Variant::Coop => "coop",
        }
    }

    /// The variant for an adapter of this device type (`Context::new` then picks coop where
    /// cooperative matrices pass their self-check).
    pub fn for_device_type(device_type: wgpu::DeviceType) -> Variant {
        match device_type {
            wgpu::DeviceType::Cpu => Variant::Rows,
            _ => Variant::Blocks,
        }
    }
}

/// [`Tuning::decode_q_chunks`] for an adapter of `device_type`: on but for CPU drivers.
pub fn decode_q_chunks_for(device_type: wgpu::DeviceType) -> bool {
    device_type != wgpu::DeviceType::Cpu
}
