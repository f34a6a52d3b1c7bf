//! The command line: flags, their defaults and parsers, and the tuning they ask for.

use std::path::PathBuf;

#[path = "../common/cli.rs"]
mod cli;
use cli::positive;

use clap::{Parser, ValueEnum};
use flash_attn_wgpu::{DType, HalfStorage, Tuning, Variant, Window};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum PassArg {
    /// forward only
    Fwd,
    /// forward then backward
    Fwdbwd,
    /// both, measured from the same calls
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AlgArg {
    /// FlashAttention: tiles in workgroup memory, nothing quadratic in global memory
    Tiled,
    /// standard attention: S and P materialized in global memory
    Naive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VariantArg {
    /// one thread per row, tile reads shared across the subgroup (CPU drivers)
    Rows,
    /// register micro-tiles, conflict-free vec4 workgroup memory (GPUs)
    Blocks,
    /// the f16 forward on cooperative matrices (tensor cores), where the adapter has them
    Coop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HalfArg {
    /// array<f16> in the shader (needs the adapter's SHADER_F16)
    Native,
    /// two halves per u32 word (any adapter)
    Packed,
}

/// Tiled vs naive attention in f32/f16/bf16 on this adapter: GPU time, GFLOP/s, roofline
/// fractions, device memory allocated and modelled global-memory bytes.
///
/// Comma lists (--seq, --batch, --heads, --head-dim, --dtype, --algorithms, --variant) form a grid:
/// every combination is measured. Rows print as they are measured; progress goes to stderr.
#[derive(Parser, Debug)]
#[command(name = "bench", version)]
pub struct Args {
    /// Sequence lengths N (seq_q = seq_kv), comma list
    #[arg(long = "seq", value_delimiter = ',', value_parser = positive,
          default_values_t = [256, 512, 1024, 2048, 4096, 8192, 16384])]
    pub seqs: Vec<usize>,
    /// Batch sizes B, comma list
    #[arg(long, value_delimiter = ',', value_parser = positive, default_values_t = [1])]
    pub batch: Vec<usize>,
    /// Query heads H, comma list
    #[arg(long, value_delimiter = ',', value_parser = positive, default_values_t = [8])]
    pub heads: Vec<usize>,
    /// Key/value heads (GQA/MQA; must divide every --heads value) [default: --heads]
    #[arg(long, value_parser = positive)]
    pub kv_heads: Option<usize>,
    /// Head dimensions D, comma list (1..=256)
    #[arg(long, value_delimiter = ',', value_parser = positive, default_values_t = [64])]
    pub head_dim: Vec<usize>,
    /// Element types of q, k, v, out and the gradients, comma list: f32, f16, bf16
    #[arg(long, value_delimiter = ',', default_value = "f32")]
    pub dtype: Vec<DType>,
    /// Causal (bottom-right aligned) mask
    #[arg(long, conflicts_with = "causal_both")]
    pub causal: bool,
    /// Measure both non-causal and causal in one run
    #[arg(long)]
    pub causal_both: bool,
    /// Sliding window LEFT,RIGHT (flash-attn's window_size; `none` for an unbounded side),
    /// applied to every point: `--window 256,0`
    #[arg(long, value_parser = window_arg, allow_hyphen_values = true)]
    pub window: Option<Window>,
    /// With --window: measure every point without the window too, side by side
    #[arg(long, requires = "window")]
    pub window_both: bool,
    /// Softcap c > 0 on every point (scores become c * tanh(score / c))
    #[arg(long, value_parser = positive_f32)]
    pub softcap: Option<f32>,
    /// With --softcap: measure every point also with the same softcap written as a user score
    /// modifier (`ScoreMod`, FlexAttention's score_mod), side by side with the built-in one
    #[arg(long, requires = "softcap")]
    pub score_mod_both: bool,
    /// A document mask written as a user mask (`MaskMod`, FlexAttention's mask_mod) on every
    /// point: K equal documents per sequence, causal within each when --causal, with its block
    /// mask (64 x 64 blocks) so that blocks across documents are skipped (the FLOPs count only
    /// the visible pairs)
    #[arg(long, value_name = "K", conflicts_with_all = ["varlen", "block_density"])]
    pub doc_mask: Option<usize>,
    /// --causal written as a user mask (`j <= i + seq_kv - seq_q`) with its block mask
    /// instead of the built-in causal mask
    #[arg(long, requires = "causal")]
    pub causal_mask_mod: bool,
    /// --window written as a user mask (`i + shift - left <= j <= i + shift + right`, shift =
    /// seq_kv - seq_q) with its block mask instead of the built-in window
    #[arg(long, requires = "window")]
    pub window_mask_mod: bool,
    /// ALiBi on every point, with the usual slopes (2^(-8 (h + 1) / heads) for head h)
    #[arg(long)]
    pub alibi: bool,
    /// Attention sinks on every point (one logit per head, 1.0)
    #[arg(long)]
    pub sinks: bool,
    /// Per-batch key lengths on every point: this fraction of the keys of each batch take
    /// part (a key-padding mask; the FLOPs count only the visible pairs)
    #[arg(long, value_name = "FRACTION")]
    pub kv_fill: Option<f64>,
    /// Dropout with this probability on every point (fixed seed; the FLOPs do not change)
    #[arg(long, value_name = "P", value_parser = probability)]
    pub dropout: Option<f32>,
    /// Block-sparse on every point: a block mask with this fraction of its blocks on, drawn
    /// at random per head (fixed seed; the FLOPs count only the visible pairs)
    #[arg(long, value_name = "DENSITY", value_parser = probability)]
    pub block_density: Option<f32>,
    /// With --block-density: query rows and keys per block
    #[arg(
        long,
        value_name = "N",
        default_value_t = 64,
        requires = "block_density"
    )]
    pub block_size: usize,
    /// Packed varlen on every point: the batch's B sequences of N rows and keys laid end to
    /// end in one call (the same pairs as the padded batch; with --mods-both, side by side)
    #[arg(long, conflicts_with_all = ["kv_fill", "block_density"])]
    pub varlen: bool,
    /// A boolean mask on every point: one pseudo-random mask with this fraction of its pairs
    /// true, shared by batches and heads (fixed seed; every tile still runs, so the FLOPs do
    /// not change: this measures what reading the mask costs)
    #[arg(long, value_name = "DENSITY", value_parser = probability)]
    pub mask_density: Option<f32>,
    /// An additive bias on every point: one per head ([1, H, N, N], fixed pseudo-random
    /// values in the point's dtype), with its gradient d_bias in the backward (the FLOPs do
    /// not change: this measures what reading the bias and computing d_bias cost)
    #[arg(long, conflicts_with = "varlen")]
    pub bias: bool,
    /// Measure every point also without the modifiers (--softcap, --alibi, --sinks,
    /// --kv-fill, --dropout, --block-density, --varlen, --mask-density, --bias), side by side
    #[arg(long)]
    pub mods_both: bool,
    /// Measure every tiled point twice, side by side: with the library's run-time modifier
    /// bits, and with every bit compiled into the pipelines (the compile-time build; its rows
    /// say `compiled: all` in the note column). What a run-time bit costs when off.
    #[arg(long)]
    pub compiled_both: bool,
    /// Which pass to time
    #[arg(long, value_enum, default_value = "both")]
    pub pass: PassArg,
    /// Algorithms, comma list
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["tiled", "naive"])]
    pub algorithms: Vec<AlgArg>,
    /// Skip the naive algorithm for N above this (its memory is O(N^2))
    #[arg(long, value_name = "N")]
    pub naive_max_seq: Option<usize>,
    /// Timed calls per point after one warm-up call; the median is reported (0 counts as 1)
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Wall-clock budget in seconds: points predicted (from the throughput measured so far)
    /// to end past it are skipped and recorded as skipped
    #[arg(long, value_name = "SECONDS")]
    pub budget_s: Option<f64>,
    /// Write every record as JSON to FILE
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the table as Markdown to FILE
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Write runtime and memory against N (log-log) as SVG to FILE
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Tiled-kernel variants, comma list, each measured beside the others [default: the
    /// adapter's choice]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub variant: Vec<VariantArg>,
    /// Rows variant: share no tile reads across the subgroup
    #[arg(long)]
    pub no_subgroup: bool,
    /// How f16 tensors are stored on the device [default: the adapter's choice]
    #[arg(long, value_enum)]
    pub half_storage: Option<HalfArg>,
    /// Size of the roofline probes (1.0: a few hundred ms on a software driver)
    #[arg(long, default_value_t = 1.0, value_parser = positive_f64)]
    pub roofline_scale: f64,
    /// Print, under each row, the median GPU time of each kernel of the pass (timestamps)
    #[arg(long)]
    pub per_kernel: bool,
    /// Print the adapter, its limits and the default tuning, then exit
    #[arg(long)]
    pub info: bool,
    /// Decode mode: one call per step of --decode-queries query rows against KV caches of each
    /// --seq keys (each --batch; the first --heads, --kv-heads, --head-dim and --dtype),
    /// split-KV next to one split, KV bytes per second against the copy roofline, and the
    /// per-call cost; its own table (the grid's flags do not apply)
    #[arg(long)]
    pub decode: bool,
    /// Decode mode: measure every point also with the subgroup reads off (`rows_subgroup`
    /// 0), side by side with the adapter's default
    #[arg(long, requires = "decode")]
    pub subgroup_both: bool,
    /// Decode mode: measure every point also with the other `Tuning::decode_q_chunks`
    /// (workgroups of as many rows as hold q whole, or of the most rows with q held a chunk
    /// at a time), side by side with the adapter's default
    #[arg(long, requires = "decode")]
    pub q_chunks_both: bool,
    /// Decode mode: also measure 8-bit KV caches (q8_0, e4m3; comma-separated) beside the
    /// --dtype cache, each call through the KV-cache entry points, interleaved call by call;
    /// a table of its own
    #[arg(long, requires = "decode", value_delimiter = ',')]
    pub kv_formats: Vec<flash_attn_wgpu::CacheFormat>,
    /// Decode mode: MLA's layout (DeepSeek-V2/V3): the values are the first N dims of each
    /// key row (`head_dim_v` N, the keys --head-dim wide: 576 with 512), read in place through
    /// a view of the one latent cache; KV bytes are that cache's, the FLOP floor from the
    /// measured FMA rate beside each point. No paged column
    #[arg(long, requires = "decode", value_parser = positive)]
    pub mla_values: Option<usize>,
    /// Decode mode: query rows per call (1: a decode step; a few: speculative tokens)
    #[arg(long, default_value_t = 1, value_parser = positive)]
    pub decode_queries: usize,
}

impl Args {
    /// The adapter's default tuning with --no-subgroup and --half-storage applied (the
    /// variant is the grid's: `variants`).
    pub fn tuning(&self, default: Tuning) -> Tuning {
        let mut tuning = default;
        if self.no_subgroup {
            tuning.rows_subgroup = 0;
        }
        if let Some(h) = self.half_storage {
            tuning.half_storage = match h {
                HalfArg::Native => HalfStorage::Native,
                HalfArg::Packed => HalfStorage::Packed,
            };
        }
        tuning
    }

    /// --variant in the order given without repeats, or the adapter's choice.
    pub fn variants(&self, default: Variant) -> Vec<Variant> {
        let mut out = Vec::new();
        for v in &self.variant {
            let v = match v {
                VariantArg::Rows => Variant::Rows,
                VariantArg::Blocks => Variant::Blocks,
                VariantArg::Coop => Variant::Coop,
            };
            if !out.contains(&v) {
                out.push(v);
            }
        }
        if out.is_empty() {
            out.push(default);
        }
        out
    }
}

/// `LEFT,RIGHT`, each a whole number or `none` (unbounded).
fn window_arg(s: &str) -> Result<Window, String> {
    let side = |x: &str| -> Result<Option<usize>, String> {
        match x.trim() {
            "none" | "-1" => Ok(None),
            v => v
                .parse::<usize>()
                .map(Some)
                .map_err(|e| format!("{v:?} is not a whole number or `none`: {e}")),
        }
    };
    match s.split(',').collect::<Vec<_>>().as_slice() {
        [l, r] => Ok(Window::new(side(l)?, side(r)?)),
        _ => Err(format!(
            "expected LEFT,RIGHT (e.g. 256,0 or none,0), got {s:?}"
        )),
    }
}

fn positive_f32(s: &str) -> Result<f32, String> {
    positive_f64(s).map(|v| v as f32)
}

fn probability(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(v) if (0.0..1.0).contains(&v) => Ok(v),
        Ok(v) => Err(format!("must be in [0, 1), got {v}")),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        Ok(v) => Err(format!("must be a positive number, got {v}")),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}
