//! Sharded attention: one long sequence's keys split across two `Context`s (two adapters where
//! the machine has them, else two contexts on the default adapter). Each context computes
//! attention over its shard of the keys; the partial results (out, lse) travel through the
//! host, as they would over any transport; one context merges them (`Context::merge`) and the
//! result is checked against attention over all the keys on one context.
//!
//! cargo run --release --example sharded -- [--seq-q 256] [--seq-kv 4096] [--heads 8]
//!     [--kv-heads 2] [--head-dim 64] [--seed N]   (--help lists the flags)

use std::process::ExitCode;
use std::time::Instant;

#[path = "common/cli.rs"]
mod cli;
use cli::positive;

use clap::Parser;
use flash_attn_wgpu::{AttentionConfig, Context, Forward, HostForward};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Keys split across two contexts, merged on one, checked against unsharded attention.
/// Exits non-zero if the merged result differs from it past f32 rounding.
#[derive(Parser, Debug)]
#[command(name = "sharded", version)]
struct Args {
    /// Query rows
    #[arg(long, default_value_t = 256, value_parser = positive)]
    seq_q: usize,
    /// Keys, split in two shards (the first gets the larger half)
    #[arg(long, default_value_t = 4096, value_parser = positive)]
    seq_kv: usize,
    /// Query heads
    #[arg(long, default_value_t = 8, value_parser = positive)]
    heads: usize,
    /// Key/value heads (must divide --heads)
    #[arg(long, default_value_t = 2, value_parser = positive)]
    kv_heads: usize,
    /// Head dimension (1..=256)
    #[arg(long, default_value_t = 64, value_parser = positive)]
    head_dim: usize,
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

/// Two contexts: on the first two adapters the machine lists, or both on the default one.
fn two_contexts() -> Result<[Context; 2], Box<dyn std::error::Error>> {
    let adapters = pollster::block_on(async {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        instance.enumerate_adapters(wgpu::Backends::all()).await
    });
    if adapters.len() >= 2 {
        let mut ctxs = Vec::new();
        for adapter in adapters.into_iter().take(2) {
            let wanted = wgpu::Features::SHADER_F16
                | wgpu::Features::SUBGROUP
                | wgpu::Features::TIMESTAMP_QUERY;
            let (device, queue) =
                pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
                    label: Some("shard device"),
                    required_features: adapter.features() & wanted,
                    required_limits: adapter.limits(),
                    ..Default::default()
                }))?;
            ctxs.push(Context::from_wgpu(device, queue)?);
        }
        let [a, b]: [Context; 2] = ctxs.try_into().map_err(|_| "two contexts")?;
        Ok([a, b])
    } else {
        Ok([Context::new()?, Context::new()?])
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let a = Args::parse();
    if a.seq_kv < 2 {
        return Err("--seq-kv must be at least 2 to split the keys in two".into());
    }
    let seed = a.seed.unwrap_or_else(|| rand::rng().random());
    let cfg = AttentionConfig::new(1, a.seq_q, a.seq_kv, a.heads, a.kv_heads, a.head_dim);
    cfg.validate()?;
    let ctxs = two_contexts()?;
    for (i, c) in ctxs.iter().enumerate() {
        println!("context {i}: {}", c.adapter_info());
    }
    println!(
        "seq_q {} seq_kv {} heads {}/{} head_dim {} f32, seed {seed}",
        cfg.seq_q, cfg.seq_kv, cfg.heads_q, cfg.heads_kv, cfg.head_dim
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut random =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let row = cfg.heads_kv * cfg.head_dim;
    let (q, k, v) = (
        random(cfg.seq_q * cfg.heads_q * cfg.head_dim),
        random(cfg.seq_kv * row),
        random(cfg.seq_kv * row),
    );

    // each context attends over its half of the keys (batch 1: a shard is a contiguous range)
    let cut = cfg.seq_kv.div_ceil(2);
    let t = Instant::now();
    let mut shards: Vec<HostForward> = Vec::new();
    for (ctx, (j0, j1)) in ctxs.iter().zip([(0, cut), (cut, cfg.seq_kv)]) {
        let mut shard = cfg.clone();
        shard.seq_kv = j1 - j0;
        shards.push(ctx.forward_host(
            &shard,
            &q,
            &k[j0 * row..j1 * row],
            &v[j0 * row..j1 * row],
        )?);
    }
    // the partial results reach context 0 (here through the host) and merge there
    let on_device = shards
        .iter()
        .map(|s| {
            Ok(Forward {
                out: ctxs[0].upload(&s.out, &cfg.q_shape())?,
                lse: ctxs[0].upload(&s.lse, &cfg.lse_shape())?,
            })
        })
        .collect::<flash_attn_wgpu::Result<Vec<_>>>()?;
    let merged = ctxs[0].merge(&on_device)?;
    let out: Vec<f32> = ctxs[0].download(&merged.out)?;
    let lse: Vec<f32> = ctxs[0].download(&merged.lse)?;
    let sharded_ms = t.elapsed().as_secs_f64() * 1e3;

    let t = Instant::now();
    let whole = ctxs[0].forward_host(&cfg, &q, &k, &v)?;
    let whole_ms = t.elapsed().as_secs_f64() * 1e3;

    let scale = whole.out.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let out_err = out
        .iter()
        .zip(&whole.out)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    let lse_err = lse
        .iter()
        .zip(&whole.lse)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs() / b.abs().max(1.0)));
    // both results are within 1e-4 of exact attention (the f32 tests' bound); they may differ
    // by the sum of the two
    let ok = out_err <= 2e-4 * scale && lse_err <= 2e-4;
    println!(
        "two shards ({cut} + {} keys) merged: {sharded_ms:.1} ms with transfers and first-call \
         pipeline compiles; one context, all keys: {whole_ms:.1} ms",
        cfg.seq_kv - cut
    );
    println!(
        "max |out difference| {out_err:.2e} (of max |out| {scale:.2e}), max relative lse \
         difference {lse_err:.2e}: {}",
        if ok { "ok" } else { "FAIL" }
    );
    Ok(ok)
}
