//! Tiled (FlashAttention) vs naive attention, in f32, f16 and bf16, side by side in one run on
//! this adapter, over a grid of batch x heads x head_dim x sequence length x causal.
//!
//! FLOPs: forward 4 * B * H * Sq * Sk * D (halved for causal); backward 2.5x forward.
//!
//! ```text
//! cargo run --release --example bench -- --seq 256,512,1024 --dtype f32,f16,bf16 \
//!     --pass both --json out.json --plot out.svg
//! cargo run --release --example bench -- --help
//! ```
//!
//! Inputs are random f32 in [-1, 1), generated once per shape and rounded to each dtype.
//! When both passes are asked for, one loop of calls measures them: each call runs the forward
//! (its GPU time and peak memory are the `fwd` point) and then the backward (`fwdbwd` is the
//! sum of the two GPU times). Every point gets one warm-up call (pipeline compilation) and
//! then `--repeats` timed calls; the median is reported.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use flash_attn_wgpu::kernels::workgroup_words;
use flash_attn_wgpu::{
    dtype, plan, Algorithm, AttentionConfig, Context, DType, Element, Error, HalfStorage, Roofline,
    Tensor, Variant,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
enum PassArg {
    /// forward only
    Fwd,
    /// forward then backward
    Fwdbwd,
    /// both, measured from the same calls
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Pass {
    Fwd,
    FwdBwd,
}

impl Pass {
    fn name(self) -> &'static str {
        match self {
            Pass::Fwd => "fwd",
            Pass::FwdBwd => "fwdbwd",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AlgArg {
    /// FlashAttention: tiles in workgroup memory, nothing quadratic in global memory
    Tiled,
    /// standard attention: S and P materialized in global memory
    Naive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum VariantArg {
    /// several threads per query row (GPUs)
    Lanes,
    /// one thread per row, tile reads shared across the subgroup (CPU drivers)
    Rows,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum HalfArg {
    /// array<f16> in the shader (needs the adapter's SHADER_F16)
    Native,
    /// two halves per u32 word (any adapter)
    Packed,
}

/// Tiled vs naive attention in f32/f16/bf16 on this adapter: GPU time, GFLOP/s, roofline
/// fractions, device memory allocated and modelled global-memory bytes.
///
/// Comma lists (--seq, --batch, --heads, --head-dim, --dtype, --algorithms) form a grid:
/// every combination is measured. Rows print as they are measured; progress goes to stderr.
#[derive(Parser, Debug)]
#[command(name = "bench", version)]
struct Args {
    /// Sequence lengths N (seq_q = seq_kv), comma list
    #[arg(long = "seq", value_delimiter = ',', value_parser = positive,
          default_values_t = [256, 512, 1024, 2048, 4096, 8192, 16384])]
    seqs: Vec<usize>,
    /// Batch sizes B, comma list
    #[arg(long, value_delimiter = ',', value_parser = positive, default_values_t = [1])]
    batch: Vec<usize>,
    /// Query heads H, comma list
    #[arg(long, value_delimiter = ',', value_parser = positive, default_values_t = [8])]
    heads: Vec<usize>,
    /// Key/value heads (GQA/MQA; must divide every --heads value) [default: --heads]
    #[arg(long, value_parser = positive)]
    kv_heads: Option<usize>,
    /// Head dimensions D, comma list (1..=256)
    #[arg(long, value_delimiter = ',', value_parser = positive, default_values_t = [64])]
    head_dim: Vec<usize>,
    /// Element types of q, k, v, out and the gradients, comma list: f32, f16, bf16
    #[arg(long, value_delimiter = ',', value_parser = parse_dtype, default_value = "f32")]
    dtype: Vec<DType>,
    /// Causal (bottom-right aligned) mask
    #[arg(long, conflicts_with = "causal_both")]
    causal: bool,
    /// Measure both non-causal and causal in one run
    #[arg(long)]
    causal_both: bool,
    /// Which pass to time
    #[arg(long, value_enum, default_value = "both")]
    pass: PassArg,
    /// Algorithms, comma list
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["tiled", "naive"])]
    algorithms: Vec<AlgArg>,
    /// Skip the naive algorithm for N above this (its memory is O(N^2))
    #[arg(long, value_name = "N")]
    naive_max_seq: Option<usize>,
    /// Timed calls per point after one warm-up call; the median is reported (0 counts as 1)
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Wall-clock budget in seconds: points predicted (from the throughput measured so far)
    /// to end past it are skipped and recorded as skipped
    #[arg(long, value_name = "SECONDS")]
    budget_s: Option<f64>,
    /// Write every record as JSON to FILE
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write the table as Markdown to FILE
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Write runtime and memory against N (log-log) as SVG to FILE
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Tiled-kernel variant [default: the adapter's choice]
    #[arg(long, value_enum)]
    variant: Option<VariantArg>,
    /// Rows variant: share no tile reads across the subgroup
    #[arg(long)]
    no_subgroup: bool,
    /// How f16 tensors are stored on the device [default: the adapter's choice]
    #[arg(long, value_enum)]
    half_storage: Option<HalfArg>,
    /// Size of the roofline probes (1.0: a few hundred ms on a software driver)
    #[arg(long, default_value_t = 1.0, value_parser = positive_f64)]
    roofline_scale: f64,
    /// Print the adapter, its limits and the default tuning, then exit
    #[arg(long)]
    info: bool,
}

fn positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(format!("{s:?} is not a whole number: {e}")),
    }
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        Ok(v) => Err(format!("must be a positive number, got {v}")),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse()
}

fn dedup<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for &x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// FLOPs by the convention of the FlashAttention papers.
fn flops(cfg: &AttentionConfig, pass: Pass) -> f64 {
    let f = 4.0
        * (cfg.batch * cfg.heads_q) as f64
        * cfg.seq_q as f64
        * cfg.seq_kv as f64
        * cfg.head_dim as f64;
    let f = if cfg.causal { f / 2.0 } else { f };
    match pass {
        Pass::Fwd => f,
        Pass::FwdBwd => 3.5 * f,
    }
}

/// Tile sizes the bytes model needs: query rows per forward tile, key rows per dK/dV tile and
/// query rows per dQ tile.
#[derive(Debug, Clone, Copy)]
struct ModelTiles {
    fwd_q: u32,
    dkdv_kv: u32,
    dq_q: u32,
}

/// Global-memory bytes each algorithm moves by design, as in the paper's IO analysis, from the
/// kernels' bindings. Tensors of the call's dtype (q, k, v, out, d_out, dq, dk, dv) count
/// `dtype.size_bytes()` per element; lse, delta and the naive path's score matrices are f32.
/// The naive path writes and rereads the seq_q x seq_kv matrices; the tiled path reads K and V
/// once per Q tile (and Q, dO, lse, delta once per K/V tile in the dK/dV kernel) and nothing
/// quadratic.
fn bytes_moved_model(
    cfg: &AttentionConfig,
    dtype: DType,
    alg: Algorithm,
    pass: Pass,
    t: ModelTiles,
) -> f64 {
    let (bh, sq, sk, d) = (
        (cfg.batch * cfg.heads_q) as f64,
        cfg.seq_q as f64,
        cfg.seq_kv as f64,
        cfg.head_dim as f64,
    );
    let vis = if cfg.causal { 0.5 } else { 1.0 };
    let q_tiles = (sq / t.fwd_q as f64).ceil();
    let kv_tiles = (sk / t.dkdv_kv as f64).ceil();
    let dq_tiles = (sq / t.dq_q as f64).ceil();
    // (elements of the call's dtype, f32 elements)
    let fwd = match alg {
        // scores: Q, K -> S; softmax: S -> P, lse; pv: P, V -> O
        Algorithm::Naive => (2.0 * sq * d + 2.0 * sk * d, 4.0 * sq * sk + sq),
        // Q once, K and V once per Q tile (the visible part), O once; lse once
        Algorithm::Tiled => (sq * d + q_tiles * 2.0 * sk * d * vis + sq * d, sq),
    };
    let bwd = match alg {
        // delta: O, dO -> delta; probs: Q, K, lse -> P; dp: dO, V -> dP;
        // ds: P, delta, dP -> dS (over dP); dkdv: P, dS, Q, dO -> dK, dV; dq: dS, K -> dQ
        Algorithm::Naive => (
            2.0 * sq * d
                + (sq * d + sk * d)
                + (sq * d + sk * d)
                + (2.0 * sq * d + 2.0 * sk * d)
                + (sk * d + sq * d),
            sq + (sq + sq * sk) + sq * sk + (3.0 * sq * sk + sq) + 2.0 * sq * sk + sq * sk,
        ),
        // delta: O, dO -> delta; dK/dV: K, V once, Q and dO (and lse, delta) once per K/V
        // tile, dK and dV written once; dQ: Q, dO, lse, delta once, K and V once per Q tile,
        // dQ written once
        Algorithm::Tiled => (
            2.0 * sq * d
                + (4.0 * sk * d + kv_tiles * 2.0 * sq * d * vis)
                + (3.0 * sq * d + dq_tiles * 2.0 * sk * d * vis),
            sq + kv_tiles * 2.0 * sq * vis + 2.0 * sq,
        ),
    };
    let (elems, f32s) = match pass {
        Pass::Fwd => fwd,
        Pass::FwdBwd => (fwd.0 + bwd.0, fwd.1 + bwd.1),
    };
    bh * (elems * dtype.size_bytes() as f64 + f32s * 4.0)
}

/// One measured (or skipped) point.
struct Record {
    algorithm: Algorithm,
    dtype: DType,
    pass: Pass,
    cfg: AttentionConfig,
    median_ms: Option<f64>,
    gflops: Option<f64>,
    bytes_allocated: Option<u64>,
    bytes_allocated_plan: Option<u64>,
    bytes_moved_model: f64,
    /// Naive time over tiled time of the same point (naive rows only).
    speedup: Option<f64>,
    /// This point's time over the f32 time of the same point (half dtypes only).
    vs_f32: Option<f64>,
    timestamps: Option<bool>,
    note: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The inputs of one shape, in f32, shared by every dtype, algorithm and pass.
struct HostInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_out: Vec<f32>,
}

impl HostInputs {
    fn random(cfg: &AttentionConfig, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut random =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
        let nq = cfg.batch * cfg.seq_q * cfg.heads_q * cfg.head_dim;
        let nkv = cfg.batch * cfg.seq_kv * cfg.heads_kv * cfg.head_dim;
        HostInputs {
            q: random(nq),
            k: random(nkv),
            v: random(nkv),
            d_out: random(nq),
        }
    }
}

/// Device copies of the inputs in one dtype.
struct DeviceInputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    d_out: Option<Tensor>,
}

fn upload_as<T: Element>(
    ctx: &Context,
    host: &HostInputs,
    cfg: &AttentionConfig,
    with_d_out: bool,
) -> Result<DeviceInputs, Error> {
    let up = |x: &[f32], shape: &[usize]| ctx.upload(&dtype::from_f32_slice::<T>(x), shape);
    Ok(DeviceInputs {
        q: up(&host.q, &cfg.q_shape())?,
        k: up(&host.k, &cfg.kv_shape())?,
        v: up(&host.v, &cfg.kv_shape())?,
        d_out: if with_d_out {
            Some(up(&host.d_out, &cfg.q_shape())?)
        } else {
            None
        },
    })
}

fn upload(
    ctx: &Context,
    dt: DType,
    host: &HostInputs,
    cfg: &AttentionConfig,
    with_d_out: bool,
) -> Result<DeviceInputs, Error> {
    match dt {
        DType::F32 => upload_as::<f32>(ctx, host, cfg, with_d_out),
        DType::F16 => upload_as::<half::f16>(ctx, host, cfg, with_d_out),
        DType::BF16 => upload_as::<half::bf16>(ctx, host, cfg, with_d_out),
    }
}

/// Medians and allocations of one (shape, dtype, causal, algorithm) point.
struct Measured {
    fwd_ms: f64,
    fwd_alloc: u64,
    /// Forward + backward, when the backward ran.
    fwdbwd: Option<(f64, u64)>,
    timestamps: bool,
}

/// Warm-up, then `repeats` timed calls: the forward, then (with `d_out`) the backward on its
/// output. Allocated bytes are the peak of the library's device memory beyond the inputs.
fn measure(
    ctx: &Context,
    cfg: &AttentionConfig,
    x: &DeviceInputs,
    repeats: usize,
) -> Result<Measured, Error> {
    let gpu_seconds = || {
        ctx.last_gpu_timing()
            .ok_or_else(|| Error::Device("no GPU timing recorded for the last call".into()))
    };
    let inputs = ctx.memory_stats().live_bytes;
    let (mut fwd_times, mut fb_times) = (Vec::new(), Vec::new());
    let (mut fwd_alloc, mut fb_alloc) = (0, 0);
    let mut timestamps = true;
    for rep in 0..=repeats {
        ctx.reset_peak_memory();
        let f = ctx.forward(cfg, &x.q, &x.k, &x.v)?;
        let tf = gpu_seconds()?;
        timestamps &= tf.from_timestamps;
        fwd_alloc = ctx.memory_stats().peak_bytes.saturating_sub(inputs);
        let mut tb = None;
        if let Some(d_out) = &x.d_out {
            let g = ctx.backward(cfg, &x.q, &x.k, &x.v, &f.out, &f.lse, d_out)?;
            let t = gpu_seconds()?;
            timestamps &= t.from_timestamps;
            tb = Some(t.seconds);
            fb_alloc = ctx.memory_stats().peak_bytes.saturating_sub(inputs);
            drop(g);
        }
        drop(f);
        if rep > 0 {
            fwd_times.push(tf.seconds);
            if let Some(tb) = tb {
                fb_times.push(tf.seconds + tb);
            }
        }
    }
    Ok(Measured {
        fwd_ms: median(fwd_times) * 1e3,
        fwd_alloc,
        fwdbwd: (!fb_times.is_empty()).then(|| (median(fb_times) * 1e3, fb_alloc)),
        timestamps,
    })
}

/// One grid shape (everything but dtype, causal, algorithm and pass).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shape {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    seq: usize,
}

impl Shape {
    fn config(&self, causal: bool, alg: Algorithm) -> AttentionConfig {
        let mut cfg = AttentionConfig::new(
            self.batch,
            self.seq,
            self.seq,
            self.heads,
            self.kv_heads,
            self.head_dim,
        );
        cfg.causal = causal;
        cfg.algorithm = alg;
        cfg
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn alg_name(a: Algorithm) -> &'static str {
    match a {
        Algorithm::Tiled => "tiled",
        Algorithm::Naive => "naive",
    }
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    // Everything the user asked for is checked before the GPU is touched.
    let dtypes = {
        // f32 first, so that every half-precision point finds its f32 time (vs_f32).
        let mut d = dedup(&a.dtype);
        d.sort_by_key(|&t| t != DType::F32);
        d
    };
    let algorithms: Vec<Algorithm> = {
        // tiled first, so that every naive point finds its tiled time (speedup).
        let mut v: Vec<Algorithm> = dedup(&a.algorithms)
            .into_iter()
            .map(|x| match x {
                AlgArg::Tiled => Algorithm::Tiled,
                AlgArg::Naive => Algorithm::Naive,
            })
            .collect();
        v.sort_by_key(|&x| x != Algorithm::Tiled);
        v
    };
    let passes = match a.pass {
        PassArg::Fwd => vec![Pass::Fwd],
        PassArg::Fwdbwd => vec![Pass::FwdBwd],
        PassArg::Both => vec![Pass::Fwd, Pass::FwdBwd],
    };
    let need_bwd = passes.contains(&Pass::FwdBwd);
    let causals = if a.causal_both {
        vec![false, true]
    } else {
        vec![a.causal]
    };
    let repeats = a.repeats.max(1);
    let mut shapes = Vec::new();
    for &batch in &dedup(&a.batch) {
        for &heads in &dedup(&a.heads) {
            for &head_dim in &dedup(&a.head_dim) {
                for &seq in &dedup(&a.seqs) {
                    let kv_heads = a.kv_heads.unwrap_or(heads);
                    let s = Shape {
                        batch,
                        heads,
                        kv_heads,
                        head_dim,
                        seq,
                    };
                    s.config(false, Algorithm::Tiled).validate().map_err(|e| {
                        format!("B={batch} H={heads} kv-heads={kv_heads} D={head_dim} N={seq}: {e}")
                    })?;
                    shapes.push(s);
                }
            }
        }
    }
    // Cheapest first: under a time budget, the points that do not fit are the largest.
    shapes.sort_by_key(|s| s.batch * s.heads * s.head_dim * s.seq * s.seq);

    let ctx = Context::new()?;
    let default_tuning = ctx.tuning();
    let mut tuning = default_tuning;
    if let Some(v) = a.variant {
        tuning.variant = match v {
            VariantArg::Lanes => Variant::Lanes,
            VariantArg::Rows => Variant::Rows,
        };
    }
    if a.no_subgroup {
        tuning.rows_subgroup = 0;
    }
    if let Some(h) = a.half_storage {
        tuning.half_storage = match h {
            HalfArg::Native => HalfStorage::Native,
            HalfArg::Packed => HalfStorage::Packed,
        };
    }
    ctx.set_tuning(tuning)?;
    let adapter = ctx.adapter_info().name.clone();
    println!("adapter: {}", ctx.adapter_info());
    println!("default tuning: {default_tuning:?}");
    if a.info {
        let info = ctx.adapter_info();
        println!(
            "limits: max buffer {} MiB, storage buffers per stage {}, invocations per workgroup {}, \
             workgroups per dimension {}",
            info.max_buffer_bytes >> 20,
            info.max_storage_buffers_per_stage,
            info.max_invocations_per_workgroup,
            info.max_workgroups_per_dimension
        );
        for d in [64usize, 128] {
            let v = default_tuning.variant;
            let (f, kv, q) = (
                ctx.tiles_for(v.forward(), d)?,
                ctx.tiles_for(v.backward_dkdv(), d)?,
                ctx.tiles_for(v.backward_dq(), d)?,
            );
            println!(
                "tiles at D={d}: forward {}x{}, dK/dV {}x{}, dQ {}x{}",
                f.br, f.bc, kv.bc, kv.br, q.br, q.bc
            );
        }
        return Ok(());
    }

    eprintln!("measuring the adapter's roofline...");
    let roof: Roofline = ctx.measure_roofline(a.roofline_scale)?;
    let (fwd_kernel, dkdv_kernel, dq_kernel) = (
        tuning.variant.forward(),
        tuning.variant.backward_dkdv(),
        tuning.variant.backward_dq(),
    );
    println!("tuning: {tuning:?}");
    for &d in &dedup(&a.head_dim) {
        let (tq, tkv, tdq) = (
            ctx.tiles_for(fwd_kernel, d)?,
            ctx.tiles_for(dkdv_kernel, d)?,
            ctx.tiles_for(dq_kernel, d)?,
        );
        println!(
            "D={d}: forward tiles {}x{} ({} B workgroup memory), dK/dV {}x{}, dQ {}x{}",
            tq.br,
            tq.bc,
            workgroup_words(fwd_kernel, d as u32, tq) * 4,
            tkv.bc,
            tkv.br,
            tdq.br,
            tdq.bc
        );
    }
    println!(
        "roofline (measured): FMA {:.1} GFLOP/s, copy {:.2} GB/s",
        roof.fma_gflops, roof.copy_gbps
    );
    println!("FLOPs: forward 4*B*H*Sq*Sk*D (halved for causal); backward 2.5x forward; fwdbwd = 3.5x forward");
    println!(
        "repeats={repeats} (median GPU time after one warm-up call); %FMA: achieved GFLOP/s over the FMA \
         roofline; %BW: modelled bytes over time over the copy roofline; speedup: naive time over \
         tiled time; vs_f32: this dtype's time over f32's"
    );
    println!("{}", table_header());

    let naive_runs = |s: &Shape| a.naive_max_seq.is_none_or(|m| s.seq <= m);
    let total_points: usize = shapes
        .iter()
        .map(|s| {
            let algs = algorithms
                .iter()
                .filter(|&&x| x == Algorithm::Tiled || naive_runs(s))
                .count();
            dtypes.len() * causals.len() * algs
        })
        .sum();
    let started = Instant::now();
    let mut records: Vec<Record> = Vec::new();
    let mut failures = 0usize;
    // Slowest throughput seen so far per (algorithm, dtype), FLOP/s, for the budget prediction.
    let mut slowest: HashMap<(Algorithm, DType), f64> = HashMap::new();
    let mut point = 0;
    for (si, shape) in shapes.iter().enumerate() {
        let tiles = ModelTiles {
            fwd_q: ctx.tiles_for(fwd_kernel, shape.head_dim)?.br,
            dkdv_kv: ctx.tiles_for(dkdv_kernel, shape.head_dim)?.bc,
            dq_q: ctx.tiles_for(dq_kernel, shape.head_dim)?.br,
        };
        // Generated on first use, shared by every dtype, causal and algorithm of this shape.
        let mut host: Option<HostInputs> = None;
        for &dt in &dtypes {
            let mut device: Option<DeviceInputs> = None;
            for &causal in &causals {
                for &alg in &algorithms {
                    if alg == Algorithm::Naive && !naive_runs(shape) {
                        continue;
                    }
                    point += 1;
                    let cfg = shape.config(causal, alg);
                    let heaviest = if need_bwd { Pass::FwdBwd } else { Pass::Fwd };
                    let elapsed = started.elapsed().as_secs_f64();
                    let predicted = slowest
                        .get(&(alg, dt))
                        .map(|rate| (repeats + 1) as f64 * flops(&cfg, heaviest) / rate);
                    let what = format!(
                        "B={} H={} D={} N={} {dt} {} {}",
                        shape.batch,
                        shape.heads,
                        shape.head_dim,
                        shape.seq,
                        if causal { "causal" } else { "non-causal" },
                        alg_name(alg),
                    );
                    eprintln!(
                        "[{point}/{total_points}] {elapsed:.0}s: {what}{}",
                        predicted.map_or(String::new(), |p| format!(" (predicted {p:.1}s)"))
                    );
                    let result = match (a.budget_s, predicted) {
                        (Some(budget), Some(p)) if elapsed + p > budget => Err(format!(
                            "skipped: predicted {p:.1} s after {elapsed:.0} s passes --budget-s {budget}"
                        )),
                        (Some(budget), _) if elapsed > budget => Err(format!(
                            "skipped: {elapsed:.0} s passed --budget-s {budget}"
                        )),
                        _ => {
                            let measured = match &device {
                                Some(x) => measure(&ctx, &cfg, x, repeats),
                                None => {
                                    let h = host.get_or_insert_with(|| {
                                        HostInputs::random(&cfg, 0x5eed + si as u64)
                                    });
                                    upload(&ctx, dt, h, &cfg, need_bwd).and_then(|x| {
                                        let m = measure(&ctx, &cfg, &x, repeats);
                                        device = Some(x);
                                        m
                                    })
                                }
                            };
                            measured.map_err(|e| match e {
                                Error::DeviceLimit {
                                    what,
                                    needed,
                                    limit,
                                    ..
                                } => format!("device limit: {what} needs {needed} B > {limit} B"),
                                e => {
                                    failures += 1;
                                    eprintln!("error: {what}: {e}");
                                    format!("FAILED: {e}")
                                }
                            })
                        }
                    };
                    if let Ok(m) = &result {
                        let (ms, pass) = match m.fwdbwd {
                            Some((ms, _)) => (ms, Pass::FwdBwd),
                            None => (m.fwd_ms, Pass::Fwd),
                        };
                        let rate = flops(&cfg, pass) / (ms * 1e-3);
                        let e = slowest.entry((alg, dt)).or_insert(rate);
                        *e = e.min(rate);
                    }
                    for &pass in &passes {
                        let rec = record(&ctx, &cfg, dt, pass, tiles, &result, &records)?;
                        println!("{}", table_row(&rec, &roof));
                        records.push(rec);
                    }
                }
            }
        }
    }
    eprintln!(
        "measured {} records in {:.1} s",
        records.len(),
        started.elapsed().as_secs_f64()
    );

    if let Some(path) = &a.json {
        write_file(path, &to_json(&records, &adapter, &roof, &tuning))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &a.markdown {
        let mut md = format!(
            "Adapter: {}\n\nTuning: {tuning:?}; roofline (measured): FMA {:.1} GFLOP/s, copy {:.2} GB/s; \
             repeats {repeats} (median GPU time after one warm-up call)\n\n",
            ctx.adapter_info(),
            roof.fma_gflops,
            roof.copy_gbps
        );
        md.push_str(&to_markdown(&records, &roof));
        write_file(path, &md)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &a.plot {
        let slice = Slice {
            batch: shapes_first(&a.batch),
            heads: shapes_first(&a.heads),
            head_dim: shapes_first(&a.head_dim),
            causal: causals[0],
        };
        plot_svg(path, &records, &adapter, slice)
            .map_err(|e| format!("plot {}: {e}", path.display()))?;
        println!(
            "wrote {} (B={} H={} D={} {})",
            path.display(),
            slice.batch,
            slice.heads,
            slice.head_dim,
            if slice.causal { "causal" } else { "non-causal" }
        );
    }
    if failures > 0 {
        return Err(format!("{failures} points failed (their notes say why)").into());
    }
    Ok(())
}

/// The record of one pass of a measured (or skipped, or failed) point, with its speedup over
/// the tiled record and its ratio to the f32 record of the same point when those exist.
fn record(
    ctx: &Context,
    cfg: &AttentionConfig,
    dt: DType,
    pass: Pass,
    tiles: ModelTiles,
    result: &Result<Measured, String>,
    earlier: &[Record],
) -> Result<Record, String> {
    let env = ctx.plan_env();
    // What the plans say the calls allocate: the forward's outputs and scratch; for fwdbwd
    // the larger of that and the forward's outputs (still held) plus the backward's.
    let plan_bytes = plan::forward(cfg, dt, &env).and_then(|f| match pass {
        Pass::Fwd => Ok(f.allocated_bytes()),
        Pass::FwdBwd => plan::backward(cfg, dt, &env).map(|b| {
            let fwd_outputs: u64 = f
                .outputs
                .iter()
                .map(|o| {
                    o.dtype
                        .buffer_bytes(o.shape.iter().product::<usize>() as u64)
                        .unwrap_or(u64::MAX)
                })
                .sum();
            f.allocated_bytes()
                .max(fwd_outputs.saturating_add(b.allocated_bytes()))
        }),
    });
    let mut rec = Record {
        algorithm: cfg.algorithm,
        dtype: dt,
        pass,
        cfg: cfg.clone(),
        median_ms: None,
        gflops: None,
        bytes_allocated: None,
        bytes_allocated_plan: plan_bytes.ok(),
        bytes_moved_model: bytes_moved_model(cfg, dt, cfg.algorithm, pass, tiles),
        speedup: None,
        vs_f32: None,
        timestamps: None,
        note: String::new(),
    };
    match result {
        Ok(m) => {
            let (ms, alloc) = match pass {
                Pass::Fwd => (m.fwd_ms, m.fwd_alloc),
                Pass::FwdBwd => m.fwdbwd.ok_or("internal: backward not measured")?,
            };
            rec.median_ms = Some(ms);
            rec.gflops = Some(flops(cfg, pass) / (ms * 1e-3) / 1e9);
            rec.bytes_allocated = Some(alloc);
            rec.timestamps = Some(m.timestamps);
        }
        Err(note) => rec.note = note.clone(),
    }
    let same =
        |r: &&Record| r.pass == pass && r.cfg.causal == cfg.causal && same_shape(&r.cfg, cfg);
    if cfg.algorithm == Algorithm::Naive {
        let tiled = earlier
            .iter()
            .filter(same)
            .find(|r| r.algorithm == Algorithm::Tiled && r.dtype == dt);
        rec.speedup = ratio(rec.median_ms, tiled.and_then(|r| r.median_ms));
    }
    if dt != DType::F32 {
        let f32_rec = earlier
            .iter()
            .filter(same)
            .find(|r| r.algorithm == cfg.algorithm && r.dtype == DType::F32);
        rec.vs_f32 = ratio(rec.median_ms, f32_rec.and_then(|r| r.median_ms));
    }
    Ok(rec)
}

fn shapes_first(v: &[usize]) -> usize {
    v.first().copied().unwrap_or(1)
}

fn write_file(path: &std::path::Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn same_shape(a: &AttentionConfig, b: &AttentionConfig) -> bool {
    (
        a.batch, a.seq_q, a.seq_kv, a.heads_q, a.heads_kv, a.head_dim,
    ) == (
        b.batch, b.seq_q, b.seq_kv, b.heads_q, b.heads_kv, b.head_dim,
    )
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    }
}

/// Modelled bytes over time, as a fraction of the measured copy bandwidth.
fn bw_fraction(bytes: f64, ms: f64, roof: &Roofline) -> f64 {
    bytes / (ms * 1e-3) / (roof.copy_gbps * 1e9)
}

const COLUMNS: [&str; 17] = [
    "pass",
    "causal",
    "B",
    "H",
    "D",
    "seq",
    "alg",
    "dtype",
    "ms",
    "GFLOP/s",
    "%FMA",
    "%BW",
    "speedup",
    "vs_f32",
    "alloc MiB",
    "model MiB",
    "note",
];

fn cells(r: &Record, roof: &Roofline) -> [String; 17] {
    let c = &r.cfg;
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".to_string(), f);
    [
        r.pass.name().into(),
        if c.causal { "yes" } else { "no" }.into(),
        c.batch.to_string(),
        if c.heads_kv == c.heads_q {
            c.heads_q.to_string()
        } else {
            format!("{}/{}", c.heads_q, c.heads_kv)
        },
        c.head_dim.to_string(),
        c.seq_q.to_string(),
        alg_name(r.algorithm).into(),
        r.dtype.name().into(),
        opt(r.median_ms, &|v| format!("{v:.3}")),
        opt(r.gflops, &|v| format!("{v:.1}")),
        opt(r.gflops, &|v| format!("{:.1}", 100.0 * v / roof.fma_gflops)),
        opt(r.median_ms, &|ms| {
            format!("{:.1}", 100.0 * bw_fraction(r.bytes_moved_model, ms, roof))
        }),
        opt(r.speedup, &|v| format!("{v:.2}x")),
        opt(r.vs_f32, &|v| format!("{v:.2}")),
        opt(r.bytes_allocated.map(|b| b as f64), &|v| {
            format!("{:.3}", v / 1048576.0)
        }),
        format!("{:.1}", r.bytes_moved_model / 1048576.0),
        r.note.clone(),
    ]
}

const WIDTHS: [usize; 16] = [6, 6, 3, 5, 4, 6, 5, 5, 11, 9, 6, 6, 8, 6, 10, 10];

fn table_header() -> String {
    let mut s = String::new();
    for (i, c) in COLUMNS.iter().enumerate() {
        match WIDTHS.get(i) {
            Some(&w) => {
                let _ = write!(s, "{c:>w$} ");
            }
            None => {
                let _ = write!(s, " {c}");
            }
        }
    }
    s.trim_end().to_string()
}

fn table_row(r: &Record, roof: &Roofline) -> String {
    let mut s = String::new();
    for (i, c) in cells(r, roof).iter().enumerate() {
        match WIDTHS.get(i) {
            Some(&w) => {
                let _ = write!(s, "{c:>w$} ");
            }
            None => {
                let _ = write!(s, " {c}");
            }
        }
    }
    s.trim_end().to_string()
}

fn to_markdown(records: &[Record], roof: &Roofline) -> String {
    let mut s = format!("| {} |\n|", COLUMNS.join(" | "));
    for _ in COLUMNS {
        s.push_str("---|");
    }
    s.push('\n');
    for r in records {
        let row: Vec<String> = cells(r, roof)
            .into_iter()
            .map(|c| c.replace('|', "\\|"))
            .collect();
        let _ = writeln!(s, "| {} |", row.join(" | "));
    }
    s
}

fn json_num(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or("null".into(), |x| format!("{x}"))
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn to_json(
    records: &[Record],
    adapter: &str,
    roof: &Roofline,
    tuning: &flash_attn_wgpu::Tuning,
) -> String {
    let mut s = String::from("[\n");
    for (n, r) in records.iter().enumerate() {
        let c = &r.cfg;
        let _ = writeln!(
            s,
            "  {{\"algorithm\": \"{}\", \"dtype\": \"{}\", \"pass\": \"{}\", \"batch\": {}, \"heads_q\": {}, \
             \"heads_kv\": {}, \"seq_q\": {}, \"seq_kv\": {}, \"head_dim\": {}, \"causal\": {}, \
             \"median_ms\": {}, \"gflops\": {}, \"fma_roofline_fraction\": {}, \
             \"bandwidth_roofline_fraction\": {}, \"speedup_naive_over_tiled\": {}, \"vs_f32\": {}, \
             \"bytes_allocated\": {}, \"bytes_allocated_plan\": {}, \"bytes_moved_model\": {}, \
             \"timestamps\": {}, \"variant\": \"{:?}\", \"half_storage\": \"{:?}\", \
             \"roofline_fma_gflops\": {}, \"roofline_copy_gbps\": {}, \"adapter\": {}, \"note\": {}}}{}",
            alg_name(r.algorithm),
            r.dtype.name(),
            r.pass.name(),
            c.batch,
            c.heads_q,
            c.heads_kv,
            c.seq_q,
            c.seq_kv,
            c.head_dim,
            c.causal,
            json_num(r.median_ms),
            json_num(r.gflops),
            json_num(r.gflops.map(|g| g / roof.fma_gflops)),
            json_num(r.median_ms.map(|ms| bw_fraction(r.bytes_moved_model, ms, roof))),
            json_num(r.speedup),
            json_num(r.vs_f32),
            r.bytes_allocated.map_or("null".into(), |b| b.to_string()),
            r.bytes_allocated_plan.map_or("null".into(), |b| b.to_string()),
            r.bytes_moved_model,
            r.timestamps.map_or("null".into(), |t| t.to_string()),
            tuning.variant,
            tuning.half_storage,
            roof.fma_gflops,
            roof.copy_gbps,
            json_str(adapter),
            json_str(&r.note),
            if n + 1 < records.len() { "," } else { "" }
        );
    }
    s.push_str("]\n");
    s
}

/// Which (B, H, D, causal) the plot shows.
#[derive(Debug, Clone, Copy)]
struct Slice {
    batch: usize,
    heads: usize,
    head_dim: usize,
    causal: bool,
}

/// One plotted line: its legend name, style and points (N, value).
struct Series {
    name: String,
    algorithm: Algorithm,
    dtype: DType,
    pass: Pass,
    points: Vec<(f64, f64)>,
}

/// Colour by dtype (hue) and pass (light: fwd, dark: fwdbwd); the naive algorithm is dashed
/// with triangles, tiled solid with circles.
fn series_color(dtype: DType, pass: Pass) -> plotters::style::RGBColor {
    use plotters::style::RGBColor;
    match (dtype, pass) {
        (DType::F32, Pass::Fwd) => RGBColor(0x6b, 0xae, 0xd6),
        (DType::F32, Pass::FwdBwd) => RGBColor(0x08, 0x51, 0x9c),
        (DType::F16, Pass::Fwd) => RGBColor(0x74, 0xc4, 0x76),
        (DType::F16, Pass::FwdBwd) => RGBColor(0x00, 0x6d, 0x2c),
        (DType::BF16, Pass::Fwd) => RGBColor(0xfd, 0x8d, 0x3c),
        (DType::BF16, Pass::FwdBwd) => RGBColor(0xa6, 0x36, 0x03),
    }
}

/// 1-2-5 ticks covering `lo..hi` (powers of ten only when that would be too many).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (e0, e1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let pick = |mantissas: &[f64]| -> Vec<f64> {
        (e0..=e1)
            .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|v| *v >= lo && *v <= hi)
            .collect()
    };
    let ticks = pick(&[1.0, 2.0, 5.0]);
    if ticks.len() > 12 {
        pick(&[1.0])
    } else {
        ticks
    }
}

/// Runtime and memory against sequence length, log-log, one line per (algorithm, dtype,
/// pass): the paper's Figure 3 on this adapter.
fn plot_svg(
    path: &std::path::Path,
    records: &[Record],
    adapter: &str,
    slice: Slice,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let in_slice: Vec<&Record> = records
        .iter()
        .filter(|r| {
            r.cfg.batch == slice.batch
                && r.cfg.heads_q == slice.heads
                && r.cfg.head_dim == slice.head_dim
                && r.cfg.causal == slice.causal
        })
        .collect();
    // Every (algorithm, dtype, pass) in the slice, in measurement order, so both panels and the
    // legend agree.
    let mut names: Vec<(Algorithm, DType, Pass)> = Vec::new();
    for r in &in_slice {
        let key = (r.algorithm, r.dtype, r.pass);
        if !names.contains(&key) {
            names.push(key);
        }
    }
    let series = |value: &dyn Fn(&Record) -> Option<f64>| -> Vec<Series> {
        names
            .iter()
            .map(|&(algorithm, dtype, pass)| {
                let mut points: Vec<(f64, f64)> = in_slice
                    .iter()
                    .filter(|r| (r.algorithm, r.dtype, r.pass) == (algorithm, dtype, pass))
                    .filter_map(|r| {
                        value(r)
                            .filter(|v| *v > 0.0 && v.is_finite())
                            .map(|v| (r.cfg.seq_q as f64, v))
                    })
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    name: format!("{} {} {}", alg_name(algorithm), dtype, pass.name()),
                    algorithm,
                    dtype,
                    pass,
                    points,
                }
            })
            .collect()
    };
    let panels: [(&str, &str, Vec<Series>); 2] = [
        ("runtime (median GPU time)", "ms", series(&|r| r.median_ms)),
        (
            "device memory allocated beyond the inputs",
            "MiB",
            series(&|r| r.bytes_allocated.map(|b| b as f64 / 1048576.0)),
        ),
    ];

    let root = SVGBackend::new(path, (1500, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "flash-attn-wgpu on {adapter}: B={} H={} D={} {}",
        slice.batch,
        slice.heads,
        slice.head_dim,
        if slice.causal { "causal" } else { "non-causal" }
    );
    let root = root.titled(&title, ("sans-serif", 22))?;
    let (charts, legend) = root.split_horizontally(1270);
    let areas = charts.split_evenly((1, 2));
    for (area, (title, unit, series)) in areas.iter().zip(panels.iter()) {
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in series.iter().flat_map(|s| s.points.iter()) {
            (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (1.0, 2.0, 1.0, 10.0);
        }
        let mut ns: Vec<f64> = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        ns.sort_by(|a, b| a.total_cmp(b));
        ns.dedup();
        let (ylo, yhi) = (y0 / 1.5, y1 * 1.5);
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{title}, log-log"), ("sans-serif", 18))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (x0 / 1.25..x1 * 1.25).log_scale().with_key_points(ns),
                (ylo..yhi).log_scale().with_key_points(log_ticks(ylo, yhi)),
            )?;
        chart
            .configure_mesh()
            .x_desc("sequence length N")
            .y_desc(*unit)
            .x_label_formatter(&|x| format!("{}", x.round() as u64))
            .y_label_formatter(&|y| short_number(*y))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 15))
            .bold_line_style(RGBColor(215, 215, 215))
            .light_line_style(TRANSPARENT)
            .draw()?;
        for s in series.iter().filter(|s| !s.points.is_empty()) {
            let color = series_color(s.dtype, s.pass);
            let line = color.stroke_width(2);
            let pts = s.points.iter().copied();
            match s.algorithm {
                Algorithm::Tiled => {
                    chart.draw_series(LineSeries::new(pts.clone(), line))?;
                    chart.draw_series(pts.map(|p| Circle::new(p, 4, color.filled())))?;
                }
                Algorithm::Naive => {
                    chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, line))?;
                    chart.draw_series(pts.map(|p| TriangleMarker::new(p, 5, color.filled())))?;
                }
            }
        }
    }
    // One legend for both panels, beside them.
    let legend = legend.margin(70, 10, 5, 5);
    legend.draw(&Text::new(
        "series (algorithm dtype pass)",
        (0, 0),
        ("sans-serif", 14),
    ))?;
    for (i, s) in panels[0].2.iter().enumerate() {
        let y = 28 + 24 * i as i32;
        let color = series_color(s.dtype, s.pass);
        let line = color.stroke_width(2);
        match s.algorithm {
            Algorithm::Tiled => {
                legend.draw(&PathElement::new(vec![(0, y), (36, y)], line))?;
                legend.draw(&Circle::new((18, y), 4, color.filled()))?;
            }
            Algorithm::Naive => {
                legend.draw(&PathElement::new(vec![(0, y), (12, y)], line))?;
                legend.draw(&PathElement::new(vec![(24, y), (36, y)], line))?;
                legend.draw(&TriangleMarker::new((18, y), 5, color.filled()))?;
            }
        }
        legend.draw(&Text::new(s.name.clone(), (46, y - 7), ("sans-serif", 14)))?;
    }
    root.present()?;
    Ok(())
}

/// Tick labels: 0.005, 0.5, 2, 250, 12k ...
fn short_number(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 10.0 || (v - v.round()).abs() < 1e-9 * a {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        let digits = (-a.log10() - 1e-9).ceil() as usize;
        format!("{v:.digits$}")
    }
}
