//! Your own modifiers (FlexAttention for WebGPU): three the library does not have, each
//! written in a few lines of WGSL, run forward and backward, and checked against the f64 CPU
//! reference (which applies the same functions written in Rust):
//!
//! - a document mask (`MaskMod` over captured document ids) with its block mask made on the
//!   GPU (`Context::create_block_mask`), so blocks across documents are skipped;
//! - prefix-LM (every row sees the prefix, the rest causally);
//! - T5's bucketed relative positions (`ScoreMod` reading a captured table per head).
//!
//! cargo run --release --example flex -- [--seq 512] [--heads 4] [--head-dim 64] [--seed N]

use std::process::ExitCode;

#[path = "common/cli.rs"]
mod cli;
#[path = "common/t5.rs"]
mod t5;
use cli::positive;
use t5::T5_BUCKET;

use clap::Parser;
use flash_attn_wgpu::{unstable::reference, AttentionConfig, Context, MaskMod, ScoreMod};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Three user modifiers, forward and backward, each against the f64 reference.
#[derive(Parser, Debug)]
#[command(name = "flex", version)]
struct Args {
    /// Sequence length N (seq_q = seq_kv)
    #[arg(long, default_value_t = 512, value_parser = positive)]
    seq: usize,
    /// Query heads H (and key/value heads)
    #[arg(long, default_value_t = 4, value_parser = positive)]
    heads: usize,
    /// Head dimension D (1..=256)
    #[arg(long, default_value_t = 64, value_parser = positive)]
    head_dim: usize,
    /// RNG seed [default: from the clock]
    #[arg(long)]
    seed: Option<u64>,
}

fn t5_bucket(i: usize, j: usize) -> usize {
    let rel = j as i64 - i as i64;
    let n = rel.unsigned_abs() as usize;
    (if rel > 0 { 8 } else { 0 })
        + match n {
            0..=3 => n,
            4..=7 => 4,
            8..=15 => 5,
            16..=31 => 6,
            _ => 7,
        }
}

fn main() -> ExitCode {
    let a = Args::parse();
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    match run(&a, seed) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("a result missed the tolerance (seed {seed})");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args, seed: u64) -> flash_attn_wgpu::Result<bool> {
    let ctx = Context::new()?;
    println!("adapter: {}", ctx.adapter_info());
    let (n, h) = (a.seq, a.heads);
    let mut rng = StdRng::seed_from_u64(seed);
    let base = AttentionConfig::new(1, n, n, h, h, a.head_dim);
    let mut cases = Vec::new();

    // 1. documents of random lengths, packed into one sequence
    let mut ids = Vec::with_capacity(n);
    let mut doc = 0;
    while ids.len() < n {
        let len = rng.random_range(n / 8..=n / 3).max(1).min(n - ids.len());
        ids.extend(std::iter::repeat_n(doc as f32, len));
        doc += 1;
    }
    let host_ids = ids.clone();
    let docs = MaskMod::wgsl_with(
        "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return doc_id(i) == doc_id(j); }",
        [("doc_id", ids)],
    )?
    .with_reference(move |_, _, i, j| host_ids[i] == host_ids[j]);
    let mut c = base.clone();
    c.block_mask = Some(ctx.create_block_mask(&docs, (1, 1, n, n), (64, 64))?);
    let skipped = c.block_mask.as_ref().map_or(0.0, |m| 1.0 - m.density());
    c.mask_mod = Some(docs);
    cases.push((
        format!(
            "{doc} documents ({:.0}% of blocks skipped)",
            100.0 * skipped
        ),
        c,
    ));

    // 2. prefix-LM
    let prefix = n / 4;
    let lm = MaskMod::wgsl(&format!(
        "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool {{ return j < {prefix}u || j <= i; }}"
    ))?
    .with_reference(move |_, _, i, j| j < prefix || j <= i);
    let mut c = base.clone();
    c.block_mask = Some(ctx.create_block_mask(&lm, (1, 1, n, n), (64, 64))?);
    c.mask_mod = Some(lm);
    cases.push((format!("prefix-LM, prefix {prefix}"), c));

    // 3. T5 relative positions: a learned bias per (head, bucket); its derivative derived
    //    from the WGSL (src/modifiers/derive.rs), as FlexAttention differentiates score_mod
    let table: Vec<f32> = (0..h * 16).map(|_| rng.random_range(-1.0..1.0)).collect();
    let host_table = table.clone();
    let t5 = ScoreMod::wgsl_with(
        &format!(
            "{T5_BUCKET}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {{
    return s + t5_bias(h * 16u + t5_bucket(i, j));
}}"
        ),
        [("t5_bias", table)],
    )?
    .with_reference(
        move |s, _, h, i, j| s + host_table[h * 16 + t5_bucket(i, j)] as f64,
        |_, _, _, _, _| 1.0,
    );
    let mut c = base.clone();
    c.causal = true;
    c.score_mod = Some(t5);
    cases.push(("T5 relative positions, causal".into(), c));

    let numel = n * h * a.head_dim;
    let mut random = |k: usize| {
        (0..k)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect::<Vec<_>>()
    };
    let (q, k, v, d_out) = (random(numel), random(numel), random(numel), random(numel));
    let mut ok = true;
    for (name, c) in &cases {
        let f = ctx.forward_host(c, &q, &k, &v)?;
        let g = ctx.backward_host(c, &q, &k, &v, &f.out, &f.lse, &d_out)?;
        let want = reference::backward(c, &q, &k, &v, &d_out);
        let fwd = reference::forward(c, &q, &k, &v);
        let err = |got: &[f32], want: &[f64]| {
            got.iter()
                .zip(want)
                .map(|(&x, &y)| (x as f64 - y).abs())
                .fold(0.0, f64::max)
        };
        let errs = [
            err(&f.out, &fwd.out),
            err(&g.dq, &want.dq),
            err(&g.dk, &want.dk),
            err(&g.dv, &want.dv),
        ];
        let worst = errs.iter().copied().fold(0.0, f64::max);
        let pass = worst < 1e-4;
        ok &= pass;
        println!(
            "{name}: max |error| out {:.1e}, dq {:.1e}, dk {:.1e}, dv {:.1e} {}",
            errs[0],
            errs[1],
            errs[2],
            errs[3],
            if pass { "ok" } else { "FAIL" }
        );
    }
    Ok(ok)
}
