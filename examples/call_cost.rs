//! The Rust side of the Python overhead measurement (scripts/python-overhead.sh): the wall
//! time of the calls python/examples/call_cost.py makes, from Rust, on the same adapter:
//! a forward at N = 1024 from host arrays to host arrays (upload, forward, download), and a
//! decode step over a device-resident KV cache (upload q and the new row, attend after
//! appending, download out). Prints the median of `--reps` calls after one warm-up each.
//!
//! cargo run --release --example call_cost -- [--reps 20]

use std::time::Instant;

use clap::Parser;
use flash_attn_wgpu::{AttentionConfig, Context};

#[path = "common/cli.rs"]
mod cli;
use cli::positive;

/// Median wall time of a forward (N = 1024) and of a decode step, called from Rust.
#[derive(Parser, Debug)]
#[command(name = "call_cost", version)]
struct Args {
    /// Calls timed per shape (the median is printed)
    #[arg(long, default_value_t = 20, value_parser = positive)]
    reps: usize,
}

/// The shapes both sides time (python/examples/call_cost.py has the same).
const FORWARD: (usize, usize, usize) = (1024, 8, 64); // seq, heads, head_dim
const DECODE: (usize, usize, usize, usize, usize) = (8, 2, 64, 4096, 1000); // heads, kv heads, head_dim, cache rows, cached

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time(
    reps: usize,
    mut call: impl FnMut() -> flash_attn_wgpu::Result<()>,
) -> flash_attn_wgpu::Result<f64> {
    call()?; // compiles the pipelines
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        call()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(ms))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let ctx = Context::new()?;
    let filled = |n: usize, salt: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7 + salt) % 23) as f32 - 11.0) / 11.0)
            .collect()
    };

    let (n, h, d) = FORWARD;
    let cfg = AttentionConfig::new(1, n, n, h, h, d);
    let (q, k, v) = (
        filled(n * h * d, 1),
        filled(n * h * d, 2),
        filled(n * h * d, 3),
    );
    let forward = time(a.reps, || ctx.forward_host(&cfg, &q, &k, &v).map(|_| ()))?;

    let (hq, hk, d, rows, cached) = DECODE;
    let mut cfg = AttentionConfig::new(1, 1, rows, hq, hk, d);
    cfg.causal = true;
    let mut kc = ctx.upload(&filled(rows * hk * d, 4), &[1, rows, hk, d])?;
    let mut vc = ctx.upload(&filled(rows * hk * d, 5), &[1, rows, hk, d])?;
    let (qs, ks, vs) = (filled(hq * d, 6), filled(hk * d, 7), filled(hk * d, 8));
    let decode = time(a.reps, || {
        let q = ctx.upload(&qs, &[1, 1, hq, d])?;
        let (k, v) = (
            ctx.upload(&ks, &[1, 1, hk, d])?,
            ctx.upload(&vs, &[1, 1, hk, d])?,
        );
        let f = ctx.forward_with_kvcache(&cfg, &q, &mut kc, &mut vc, &[cached], Some((&k, &v)))?;
        ctx.download::<f32>(&f.out).map(|_| ())
    })?;
    println!("rust forward {forward:.3} ms");
    println!("rust decode {decode:.3} ms");
    Ok(())
}
