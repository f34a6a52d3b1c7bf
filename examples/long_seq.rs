//! One tiled forward+backward at a long sequence (default N = 131072, B = 1, H = 1, D = 64),
//! reporting GPU time and the device memory the library allocated, next to what the naive
//! algorithm would need (it refuses: one head's seq x seq matrix exceeds the binding limit).
//!
//! cargo run --release --example long_seq -- [--seq 131072] [--head-dim 64] [--causal]
//! (--help lists the flags)

use std::process::ExitCode;
use std::time::Instant;

#[path = "common/cli.rs"]
mod cli;
use cli::positive;

use clap::Parser;
use flash_attn_wgpu::{Algorithm, AttentionConfig, Context, Error};

/// One tiled forward+backward at a long sequence (B = 1, H = 1): GPU time and the device
/// memory the library allocated, next to what the naive algorithm would need.
#[derive(Parser, Debug)]
#[command(name = "long_seq", version)]
struct Args {
    /// Sequence length N (seq_q = seq_kv)
    #[arg(long, default_value_t = 131_072, value_parser = positive)]
    seq: usize,
    /// Head dimension D (1..=256)
    #[arg(long, default_value_t = 64, value_parser = positive)]
    head_dim: usize,
    /// Causal (bottom-right aligned) mask
    #[arg(long)]
    causal: bool,
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
    let (seq, head_dim, causal) = (a.seq, a.head_dim, a.causal);
    let mut cfg = AttentionConfig::new(1, seq, seq, 1, 1, head_dim);
    cfg.causal = causal;
    cfg.validate()?;
    let ctx = Context::new()?;
    ctx.set_gpu_timing(true);
    println!("adapter: {}", ctx.adapter_info());
    let n = seq * head_dim;
    let fill = |salt: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + salt) % 2003) as f32 / 1001.5) - 1.0)
            .collect()
    };
    let (q, k, v, d_out) = (
        ctx.upload(&fill(1), &cfg.q_shape())?,
        ctx.upload(&fill(2), &cfg.kv_shape())?,
        ctx.upload(&fill(3), &cfg.kv_shape())?,
        ctx.upload(&fill(4), &cfg.q_shape())?,
    );
    let inputs = ctx.memory_stats().live_bytes;
    ctx.reset_peak_memory();
    let fwd_flops = 4.0 * (seq as f64).powi(2) * head_dim as f64 / if causal { 2.0 } else { 1.0 };

    let t = Instant::now();
    let f = ctx.forward(&cfg, &q, &k, &v)?;
    let fwd_s = ctx
        .last_gpu_timing()
        .map_or(t.elapsed().as_secs_f64(), |g| g.seconds);
    println!(
        "seq {seq} head_dim {head_dim} causal {causal}: tiled forward {:.1} s ({:.2} GFLOP/s)",
        fwd_s,
        fwd_flops / fwd_s / 1e9
    );
    let t = Instant::now();
    let g = ctx.backward(&cfg, &q, &k, &v, &f.out, &f.lse, &d_out)?;
    let bwd_s = ctx
        .last_gpu_timing()
        .map_or(t.elapsed().as_secs_f64(), |g| g.seconds);
    println!(
        "tiled backward {:.1} s ({:.2} GFLOP/s at 2.5x forward FLOPs)",
        bwd_s,
        2.5 * fwd_flops / bwd_s / 1e9
    );
    let extra = ctx.memory_stats().peak_bytes.saturating_sub(inputs);
    println!(
        "inputs {:.1} MiB; allocated by forward+backward {:.1} MiB ({:.1} bytes per query row)",
        inputs as f64 / 1048576.0,
        extra as f64 / 1048576.0,
        extra as f64 / seq as f64
    );
    let finite = ctx.download::<f32>(&g.dq)?.iter().all(|x| x.is_finite())
        && ctx.download::<f32>(&f.out)?.iter().all(|x| x.is_finite());
    println!("outputs finite: {finite}");

    cfg.algorithm = Algorithm::Naive;
    match ctx.forward(&cfg, &q, &k, &v) {
        Err(Error::DeviceLimit { needed, limit, .. }) => println!(
            "naive: refused, its {seq} x {seq} score matrix needs {:.1} GiB, the binding limit is {:.0} MiB",
            needed as f64 / (1u64 << 30) as f64,
            limit as f64 / 1048576.0
        ),
        Err(e) => println!("naive: {e}"),
        Ok(_) => println!("naive: ran"),
    }
    if !finite {
        return Err("non-finite output".into());
    }
    Ok(())
}
