//! Quickstart: random Q, K, V; the tiled (FlashAttention) and naive algorithms side by side;
//! each one's time and max error against the f64 CPU reference.
//!
//! cargo run --release --example quickstart -- [--batch 2] [--seq 1024] [--heads 8]
//!     [--kv-heads H] [--head-dim 64] [--causal] [--seed N]

use std::process::ExitCode;
use std::time::Instant;

use flash_attn_wgpu::{reference, Algorithm, AttentionConfig, Context};
use rand::{rngs::StdRng, Rng, SeedableRng};

struct Args {
    batch: usize,
    seq: usize,
    heads: usize,
    kv_heads: Option<usize>,
    head_dim: usize,
    causal: bool,
    seed: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        batch: 2,
        seq: 1024,
        heads: 8,
        kv_heads: None,
        head_dim: 64,
        causal: false,
        seed: rand::rng().random(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            it.next()
                .ok_or(format!("{name} needs a value"))?
                .parse::<u64>()
                .map_err(|e| format!("{name}: {e}"))
        };
        match flag.as_str() {
            "--batch" => a.batch = value("--batch")? as usize,
            "--seq" => a.seq = value("--seq")? as usize,
            "--heads" => a.heads = value("--heads")? as usize,
            "--kv-heads" => a.kv_heads = Some(value("--kv-heads")? as usize),
            "--head-dim" => a.head_dim = value("--head-dim")? as usize,
            "--seed" => a.seed = value("--seed")?,
            "--causal" => a.causal = true,
            "--help" | "-h" => return Err(
                "flags: --batch N --seq N --heads N --kv-heads N --head-dim N --causal --seed N"
                    .into(),
            ),
            other => return Err(format!("unknown flag {other}; try --help")),
        }
    }
    Ok(a)
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
    let a = parse_args()?;
    let ctx = Context::new()?;
    println!("adapter: {}", ctx.adapter_info());
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

    let mut rng = StdRng::seed_from_u64(a.seed);
    let mut random =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let n_q = cfg.batch * cfg.seq_q * cfg.heads_q * cfg.head_dim;
    let n_kv = cfg.batch * cfg.seq_kv * cfg.heads_kv * cfg.head_dim;
    let (q, k, v) = (random(n_q), random(n_kv), random(n_kv));
    println!(
        "batch {} seq {} heads {}/{} head_dim {} causal {} seed {}",
        cfg.batch, cfg.seq_q, cfg.heads_q, cfg.heads_kv, cfg.head_dim, cfg.causal, a.seed
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
