//! The CUDA path's throughput over a grid, as JSON records that scripts/bench_compare.py puts
//! beside PyTorch SDPA (scripts/sdpa_bench.py) and the wgpu bench, measured on the same GPU in
//! one GPU run (scripts/gpu-run.sh).
//!
//! FLOPs: forward 4 * B * H * Sq * Sk * D, halved for causal; forward+backward 3.5x forward
//! (backward 2.5x). Times are CUDA events around the launches (`last_gpu_timing`), device
//! tensors only (no host copies); one warm-up call (NVRTC compile, module load) per point,
//! then the median of `--repeats` calls.
//!
//! ```text
//! cargo run --release --features cuda --example cuda_bench -- --seq 4096,8192 --batch 4,2 \
//!     --heads 32 --head-dim 128 --dtype bf16 --causal-both --json cuda.json
//! ```
//!
//! `--decode`: one query row against KV caches of each `--seq` length, for each `--batch`
//! (every pair), causal, the decode kernel's split heuristic next to one split in the same run;
//! KV bytes read per second (`2 * B * Skv * Hkv * D * size`), the floor of a decode step.

#[path = "common/cli.rs"]
mod cli;
#[path = "common/stats.rs"]
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use cli::positive;
use flash_attn_wgpu::cuda::kernels::decode_geometry;
use flash_attn_wgpu::cuda::{CudaContext, CudaTensor};
use flash_attn_wgpu::{AttentionConfig, DType, Element, Error};
use rand::{rngs::StdRng, Rng, SeedableRng};
use stats::Stats;

/// CUDA-path forward and forward+backward throughput on the first CUDA device.
///
/// --seq and --batch pair up (the i-th batch with the i-th length; one batch value applies to
/// every length), so B * N can stay fixed while N grows; without --batch, B = 16384 / N (at
/// least 1). With --decode every batch meets every length (default B = 1).
#[derive(Parser, Debug)]
#[command(name = "cuda_bench")]
struct Args {
    /// Sequence lengths N (seq_q = seq_kv), comma list
    #[arg(long = "seq", value_delimiter = ',', value_parser = positive, default_values_t = [4096, 8192, 16384])]
    seqs: Vec<usize>,
    /// Batch per sequence length (one value: every length), comma list [default: 16384 / N,
    /// at least 1; with --decode: 1]
    #[arg(long, value_delimiter = ',', value_parser = positive)]
    batch: Vec<usize>,
    /// Query heads
    #[arg(long, value_parser = positive, default_value_t = 32)]
    heads: usize,
    /// Key/value heads [default: --heads]
    #[arg(long, value_parser = positive)]
    kv_heads: Option<usize>,
    /// Head dimensions, comma list
    #[arg(long, value_delimiter = ',', value_parser = positive, default_values_t = [128])]
    head_dim: Vec<usize>,
    /// f16, bf16 (comma list)
    #[arg(long, value_delimiter = ',', default_value = "bf16")]
    dtype: Vec<DType>,
    /// Measure non-causal and causal
    #[arg(long)]
    causal_both: bool,
    /// Causal only
    #[arg(long, conflicts_with = "causal_both")]
    causal: bool,
    /// Forward only (no backward)
    #[arg(long)]
    forward_only: bool,
    /// Timed calls per point after one warm-up call
    #[arg(long, value_parser = positive, default_value_t = 5)]
    repeats: usize,
    /// CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Write the records as JSON to FILE
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Decode steps (one query row) against KV caches of the --seq lengths instead
    #[arg(long)]
    decode: bool,
    /// Print the CUDA device, its architecture and NVRTC's version, then exit
    #[arg(long)]
    info: bool,
    /// Check the arguments and print the points that would be measured, without touching a
    /// GPU (the GPU check's rehearsal runs this where there is none)
    #[arg(long)]
    dry_run: bool,
}

impl Args {
    /// The batch of the i-th --seq value (forward mode).
    fn batch_for(&self, i: usize) -> usize {
        match self.batch.len() {
            0 => (16384 / self.seqs[i]).max(1),
            1 => self.batch[0],
            _ => self.batch[i],
        }
    }

    /// The batches every decode length is measured at.
    fn decode_batches(&self) -> Vec<usize> {
        if self.batch.is_empty() {
            vec![1]
        } else {
            self.batch.clone()
        }
    }

    /// Argument combinations clap cannot check.
    fn check(&self) -> Result<(), String> {
        if !self.decode && self.batch.len() > 1 && self.batch.len() != self.seqs.len() {
            return Err(format!(
                "--batch takes one value or one per --seq value ({}), got {} (with --decode \
                 every batch meets every length)",
                self.seqs.len(),
                self.batch.len()
            ));
        }
        if let Some(kv) = self.kv_heads.filter(|kv| !self.heads.is_multiple_of(*kv)) {
            return Err(format!(
                "--kv-heads {kv} must divide --heads {}",
                self.heads
            ));
        }
        Ok(())
    }

    /// What a run would measure, one line a point.
    fn points(&self) -> Vec<String> {
        let kv = self.kv_heads.unwrap_or(self.heads);
        let mut out = Vec::new();
        for (i, &n) in self.seqs.iter().enumerate() {
            for &d in &self.head_dim {
                for &dtype in &self.dtype {
                    if self.decode {
                        for b in self.decode_batches() {
                            out.push(format!(
                                "decode {} B={b} cache={n} H={}/{kv} D={d}",
                                dtype.name(),
                                self.heads
                            ));
                        }
                    } else {
                        let pass = if self.forward_only {
                            "fwd"
                        } else {
                            "fwd, fwd+bwd"
                        };
                        out.push(format!(
                            "{pass} {} B={} N={n} H={}/{kv} D={d} causal={}",
                            dtype.name(),
                            self.batch_for(i),
                            self.heads,
                            if self.causal_both {
                                "both".into()
                            } else {
                                self.causal.to_string()
                            }
                        ));
                    }
                }
            }
        }
        out
    }
}

#[derive(serde::Serialize)]
struct Record {
    backend: &'static str,
    device: String,
    dtype: &'static str,
    pass: &'static str,
    batch: usize,
    heads_q: usize,
    heads_kv: usize,
    seq_q: usize,
    seq_kv: usize,
    head_dim: usize,
    causal: bool,
    median_ms: Option<f64>,
    min_ms: Option<f64>,
    max_ms: Option<f64>,
    tflops: Option<f64>,
    kernels_ms: Vec<(&'static str, f64)>,
    note: String,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    a.check()?;
    if a.dry_run {
        if a.info {
            println!("cuda_bench --info: a dry run; no CUDA device opened");
            return Ok(());
        }
        for p in a.points() {
            println!("would measure: {p}");
        }
        return Ok(());
    }
    let ctx = CudaContext::new(a.device)?;
    ctx.set_gpu_timing(true);
    let device = format!("{} (sm_{})", ctx.device_name(), ctx.arch());
    println!("device: {device}, NVRTC {:?}", ctx.nvrtc_version());
    if a.info {
        return Ok(());
    }
    if a.decode {
        return decode(&ctx, &a);
    }
    let causals: Vec<bool> = if a.causal_both {
        vec![false, true]
    } else {
        vec![a.causal]
    };
    println!(
        "| dtype | B | H | N | D | causal | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut records = Vec::new();
    for (i, &n) in a.seqs.iter().enumerate() {
        let batch = a.batch_for(i);
        for &d in &a.head_dim {
            for &dtype in &a.dtype {
                for &causal in &causals {
                    let mut cfg = AttentionConfig::new(
                        batch,
                        n,
                        n,
                        a.heads,
                        a.kv_heads.unwrap_or(a.heads),
                        d,
                    );
                    cfg.causal = causal;
                    let got = match dtype {
                        DType::F16 => point::<half::f16>(&ctx, &cfg, &a),
                        DType::BF16 => point::<half::bf16>(&ctx, &cfg, &a),
                        DType::F32 => point::<f32>(&ctx, &cfg, &a),
                    };
                    let fwd_flops =
                        4.0 * (batch * a.heads * n * n * d) as f64 / if causal { 2.0 } else { 1.0 };
                    let mut row = |pass: &'static str, flops: f64, r: &Result<Timed, Error>| {
                        let (ms, kernels, note) = match r {
                            Ok(t) => (Some(t.ms), t.kernels_ms.clone(), String::new()),
                            Err(e) => (None, Vec::new(), e.to_string()),
                        };
                        let (min_ms, max_ms) = (ms.map(|m| m.min), ms.map(|m| m.max));
                        let ms = ms.map(|m| m.median);
                        records.push(Record {
                            backend: "cuda",
                            device: device.clone(),
                            dtype: dtype.name(),
                            pass,
                            batch,
                            heads_q: cfg.heads_q,
                            heads_kv: cfg.heads_kv,
                            seq_q: n,
                            seq_kv: n,
                            head_dim: d,
                            causal,
                            median_ms: ms,
                            min_ms,
                            max_ms,
                            tflops: ms.map(|ms| flops / (ms * 1e-3) / 1e12),
                            kernels_ms: kernels,
                            note,
                        });
                        ms.map(|ms| (ms, flops / (ms * 1e-3) / 1e12))
                    };
                    let (fwd, fb) = match got {
                        Ok((f, b)) => (Ok(f), b.map(Ok)),
                        Err(e) => (Err(e), None),
                    };
                    let fwd_cell = row("fwd", fwd_flops, &fwd);
                    let fb_cell = match (&fwd, fb) {
                        (_, Some(fb)) => row("fwdbwd", 3.5 * fwd_flops, &fb),
                        (Err(e), None) if !a.forward_only => {
                            let e = Err(Error::Device(format!("no forward: {e}")));
                            row("fwdbwd", 3.5 * fwd_flops, &e)
                        }
                        _ => None,
                    };
                    let cell = |c: Option<(f64, f64)>| match c {
                        Some((ms, t)) => (format!("{ms:.3}"), format!("{t:.1}")),
                        None => ("-".into(), "-".into()),
                    };
                    let ((fm, ft), (bm, bt)) = (cell(fwd_cell), cell(fb_cell));
                    println!(
                        "| {} | {batch} | {} | {n} | {d} | {causal} | {fm} | {ft} | {bm} | {bt} |",
                        dtype.name(),
                        a.heads
                    );
                    if let Err(e) = &fwd {
                        eprintln!("  {}: {e}", dtype.name());
                    }
                    // the records so far, after every point: a run killed at its limit keeps them
                    if let Some(path) = &a.json {
                        std::fs::write(path, serde_json::to_string_pretty(&records)?)
                            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                    }
                }
            }
        }
    }
    if let Some(path) = &a.json {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Decode steps: per batch and cache length, the split heuristic's time next to one split's,
/// and the KV bytes read per second. A point that fails is a row with its error, and the rest
/// still run; with `--json` the records so far are rewritten after every point (a run killed
/// at its limit leaves what it measured), and any failure makes the exit status 2 at the end.
fn decode(ctx: &CudaContext, a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "| dtype | B | cache | splits | split ms [min-max] | one split ms [min-max] | split / one \
         | KV GB/s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let kv_heads = a.kv_heads.unwrap_or(a.heads);
    let device = format!("{} (sm_{})", ctx.device_name(), ctx.arch());
    let mut records = Vec::new();
    let mut failures = 0;
    for &dtype in &a.dtype {
        for batch in a.decode_batches() {
            for &n in &a.seqs {
                for &d in &a.head_dim {
                    let mut cfg = AttentionConfig::new(batch, 1, n, a.heads, kv_heads, d);
                    cfg.causal = true;
                    let splits = decode_geometry(&cfg).splits;
                    let bytes = 2 * batch * n * kv_heads * d * dtype.size_bytes();
                    let mut times = Vec::new();
                    for kv_splits in [None, Some(1)] {
                        cfg.kv_splits = kv_splits;
                        let t = match dtype {
                            DType::F16 => forward_ms::<half::f16>(ctx, &cfg, a.repeats),
                            DType::BF16 => forward_ms::<half::bf16>(ctx, &cfg, a.repeats),
                            DType::F32 => forward_ms::<f32>(ctx, &cfg, a.repeats),
                        };
                        records.push(Record {
                            backend: "cuda",
                            device: device.clone(),
                            dtype: dtype.name(),
                            pass: if kv_splits.is_none() {
                                "decode"
                            } else {
                                "decode 1 split"
                            },
                            batch,
                            heads_q: cfg.heads_q,
                            heads_kv: cfg.heads_kv,
                            seq_q: 1,
                            seq_kv: n,
                            head_dim: d,
                            causal: true,
                            median_ms: t.as_ref().ok().map(|t| t.median),
                            min_ms: t.as_ref().ok().map(|t| t.min),
                            max_ms: t.as_ref().ok().map(|t| t.max),
                            tflops: None,
                            kernels_ms: Vec::new(),
                            note: match &t {
                                Ok(t) => format!(
                                    "{splits} splits; KV {:.0} GB/s",
                                    bytes as f64 / (t.median * 1e-3) / 1e9
                                ),
                                Err(e) => e.to_string(),
                            },
                        });
                        times.push(t);
                    }
                    match (&times[0], &times[1]) {
                        (Ok(split), Ok(one)) => println!(
                            "| {} | {batch} | {n} | {splits} | {:.4} [{}] | {:.4} [{}] | {:.2} | {:.0} |",
                            dtype.name(),
                            split.median,
                            split.range(4),
                            one.median,
                            one.range(4),
                            split.median / one.median,
                            bytes as f64 / (split.median * 1e-3) / 1e9
                        ),
                        (a, b) => {
                            failures += 1;
                            let e = a.as_ref().err().or(b.as_ref().err()).map(|e| e.to_string());
                            println!(
                                "| {} | {batch} | {n} | {splits} | failed: {} | | | |",
                                dtype.name(),
                                e.unwrap_or_default()
                            );
                        }
                    }
                    if let Some(path) = &a.json {
                        std::fs::write(path, serde_json::to_string_pretty(&records)?)
                            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                    }
                }
            }
        }
    }
    if let Some(path) = &a.json {
        println!("wrote {}", path.display());
    }
    if failures > 0 {
        return Err(format!("{failures} decode points failed (their rows say why)").into());
    }
    Ok(())
}

/// The GPU milliseconds of `repeats` forward calls after one warm-up call.
fn forward_ms<T: Element>(
    ctx: &CudaContext,
    cfg: &AttentionConfig,
    repeats: usize,
) -> Result<Stats, Error> {
    let mut rng = StdRng::seed_from_u64(7);
    let q = upload_random::<T>(ctx, &mut rng, &cfg.q_shape())?;
    let k = upload_random::<T>(ctx, &mut rng, &cfg.kv_shape())?;
    let v = upload_random::<T>(ctx, &mut rng, &cfg.kv_shape())?;
    let mut times = Vec::new();
    for rep in 0..=repeats {
        drop(ctx.forward(cfg, &q, &k, &v)?);
        let t = ctx
            .last_gpu_timing()
            .ok_or_else(|| Error::Device("no CUDA timing for the last call".into()))?;
        if rep > 0 {
            times.push(t.seconds);
        }
    }
    Ok(Stats::of(&times).scaled(1e3))
}

/// Milliseconds of a pass (median, min, max), and its kernels' medians.
struct Timed {
    ms: Stats,
    kernels_ms: Vec<(&'static str, f64)>,
}

fn upload_random<T: Element>(
    ctx: &CudaContext,
    rng: &mut StdRng,
    shape: &[usize],
) -> Result<CudaTensor, Error> {
    let n: usize = shape.iter().product();
    let x: Vec<T> = (0..n)
        .map(|_| T::from_f32(rng.random_range(-1.0..1.0)))
        .collect();
    ctx.upload(&x, shape)
}

/// One point: the forward and (unless --forward-only) forward+backward, timed from the same
/// calls as the wgpu bench does.
fn point<T: Element>(
    ctx: &CudaContext,
    cfg: &AttentionConfig,
    a: &Args,
) -> Result<(Timed, Option<Timed>), Error> {
    let mut rng = StdRng::seed_from_u64(7);
    let q = upload_random::<T>(ctx, &mut rng, &cfg.q_shape())?;
    let k = upload_random::<T>(ctx, &mut rng, &cfg.kv_shape())?;
    let v = upload_random::<T>(ctx, &mut rng, &cfg.kv_shape())?;
    let d_out = upload_random::<T>(ctx, &mut rng, &cfg.q_shape())?;
    let timing = || {
        ctx.last_gpu_timing()
            .ok_or_else(|| Error::Device("no CUDA timing for the last call".into()))
    };
    let (mut fwd, mut fb) = (Vec::new(), Vec::new());
    let (mut fwd_k, mut bwd_k) = (Vec::new(), Vec::new());
    for rep in 0..=a.repeats {
        let f = ctx.forward(cfg, &q, &k, &v)?;
        let tf = timing()?;
        let mut tb = None;
        if !a.forward_only {
            let g = ctx.backward(cfg, &q, &k, &v, &f.out, &f.lse, &d_out)?;
            tb = Some(timing()?);
            drop(g);
        }
        if rep > 0 {
            fwd.push(tf.seconds);
            fwd_k.push(tf.per_kernel);
            if let Some(tb) = tb {
                fb.push(tf.seconds + tb.seconds);
                bwd_k.push(tb.per_kernel);
            }
        }
    }
    let f = Timed {
        ms: Stats::of(&fwd).scaled(1e3),
        kernels_ms: medians(&fwd_k),
    };
    let b = (!fb.is_empty()).then(|| Timed {
        ms: Stats::of(&fb).scaled(1e3),
        kernels_ms: medians(&bwd_k),
    });
    Ok((f, b))
}

/// Per kernel, the median milliseconds over the runs.
fn medians(runs: &[Vec<(&'static str, f64)>]) -> Vec<(&'static str, f64)> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|i| {
            let v: Vec<f64> = runs.iter().filter_map(|r| r.get(i).map(|x| x.1)).collect();
            (first[i].0, Stats::of(&v).median * 1e3)
        })
        .collect()
}
