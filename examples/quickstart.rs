//! Quickstart: random Q, K, V; the tiled (FlashAttention) and naive algorithms side by side;
//! each one's time and max error against the f64 CPU reference.
//!
//! cargo run --release --example quickstart -- [--batch 2] [--seq 1024] [--heads 8]
//!     [--kv-heads H] [--head-dim 64] [--causal] [--seed N]   (--help lists the flags)

use std::process::ExitCode;
use std::time::Instant;

#[path = "common/cli.rs"]
mod cli;
use cli::positive;

use clap::Parser;
use flash_attn_wgpu::{unstable::reference, Algorithm, AttentionConfig, Context};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Random Q, K, V; the tiled (FlashAttention) and naive forward side by side, each checked
/// against the f64 CPU reference. Exits non-zero if either misses the tolerance.
#[derive(Parser, Debug)]
#[command(name = "quickstart", version)]
struct Args {
    /// Batch size B
    #[arg(long, default_value_t = 2, value_parser = positive)]
    batch: usize,
    /// Sequence length N (seq_q = seq_kv)
    #[arg(long, default_value_t = 1024, value_parser = positive)]
    seq: usize,
    /// Query heads H
    #[arg(long, default_value_t = 8, value_parser = positive)]
    heads: usize,
    /// Key/value heads (GQA/MQA; must divide --heads) [default: --heads]
    #[arg(long, value_parser = positive)]
    kv_heads: Option<usize>,
    /// Head dimension D (1..=256)
    #[arg(long, default_value_t = 64, value_parser = positive)]
    head_dim: usize,
    /// Causal (bottom-right aligned) mask
    #[arg(long)]
    causal: bool,
    /// Seed of the random inputs [default: a fresh random seed, printed]
    #[arg(long)]
    seed: Option<u64>,
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let a = Args::parse();
    let seed = a.seed.unwrap_or_else(|| rand::rng().random());
    let mut cfg = AttentionConfig::new(
        a.batch,
        a.seq,
        a.seq,
        a.heads,
        a.kv_heads.unwrap_or(a.heads),
        a.head_dim,
    );
    cfg.causal = a.causal;
    cfg.validate()?;
    let ctx = Context::new()?;
    ctx.set_gpu_timing(true);
    println!("adapter: {}", ctx.adapter_info());

    let mut rng = StdRng::seed_from_u64(seed);
    let mut random =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let n_q = cfg.batch * cfg.seq_q * cfg.heads_q * cfg.head_dim;
    let n_kv = cfg.batch * cfg.seq_kv * cfg.heads_kv * cfg.head_dim;
    let (q, k, v) = (random(n_q), random(n_kv), random(n_kv));
    println!(
        "batch {} seq {} heads {}/{} head_dim {} causal {} seed {}",
        cfg.batch, cfg.seq_q, cfg.heads_q, cfg.heads_kv, cfg.head_dim, cfg.causal, seed
    );

    let t = Instant::now();
    let want = reference::forward(&cfg, &q, &k, &v);
    println!(
        "f64 CPU reference: {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let scale = want.out.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let tolerance = 1e-4 * scale;

    let mut ok = true;
    for algorithm in [Algorithm::Tiled, Algorithm::Naive] {
        cfg.algorithm = algorithm;
        // First call compiles the pipelines; time the second.
        ctx.forward_host(&cfg, &q, &k, &v)?;
        let t = Instant::now();
        let got = ctx.forward_host(&cfg, &q, &k, &v)?;
        let wall = t.elapsed().as_secs_f64() * 1e3;
        let gpu = ctx
            .last_gpu_timing()
            .map(|g| g.seconds * 1e3)
            .unwrap_or(f64::NAN);
        let err = got
            .out
            .iter()
            .zip(&want.out)
            .fold(0.0f64, |m, (g, w)| m.max((*g as f64 - w).abs()));
        let pass = err <= tolerance && got.out.iter().all(|x| x.is_finite());
        ok &= pass;
        println!(
            "{:>6?}: {:8.2} ms on the GPU ({:8.2} ms with transfers), max |error| {:.2e} (tolerance {:.2e}) {}",
            algorithm,
            gpu,
            wall,
            err,
            tolerance,
            if pass { "ok" } else { "FAIL" }
        );
    }
    Ok(ok)
}
