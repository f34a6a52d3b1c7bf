//! What a derived `score_mod_ds` costs beside a hand-written one (issue 52's goal: at most 5%
//! on the backward): T5's relative buckets and a softcap as user modifiers, each with its
//! WGSL derivative written by hand and derived by the crate (src/modifiers/derive.rs), the
//! backward at B = 1, H = 8, D = 64, N = 2048 by default, the four calls interleaved round
//! by round on one context. Prints each one's best and median milliseconds and the derived
//! one's ratio to the hand-written.
//!
//! cargo run --release --example derive_cost -- [--seq 2048] [--rounds 5]

use clap::Parser;
use flash_attn_wgpu::{AttentionConfig, Context, ScoreMod};

#[path = "common/cli.rs"]
mod cli;
#[path = "common/stats.rs"]
mod stats;
#[path = "common/t5.rs"]
mod t5;
use cli::positive;
use stats::interleaved_ms;
use t5::{t5_score_mod, t5_table, uploaded};

/// Backward time of user score modifiers with hand-written and derived derivatives.
#[derive(Parser, Debug)]
#[command(name = "derive_cost", version)]
struct Args {
    /// Queries and keys
    #[arg(long, default_value_t = 2048, value_parser = positive)]
    seq: usize,
    /// Rounds (each times every modifier once)
    #[arg(long, default_value_t = 5, value_parser = positive)]
    rounds: usize,
}

const T5_DS: &str = "
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return 1.0; }
";
const SOFTCAP: &str = "
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    return 2.5 * tanh(s / 2.5);
}
";
const SOFTCAP_DS: &str = "
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    let t = tanh(s / 2.5);
    return 1.0 - t * t;
}
";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let ctx = Context::new()?;
    let (n, h, d) = (a.seq, 8, 64);
    let t5 = |src: String| ScoreMod::wgsl_with(&src, [("table", t5_table(h))]);
    let mods = [
        (
            "T5 buckets, hand-written",
            t5(format!("{}{T5_DS}", t5_score_mod()))?,
        ),
        ("T5 buckets, derived", t5(t5_score_mod())?),
        (
            "softcap, hand-written",
            ScoreMod::wgsl(&format!("{SOFTCAP}{SOFTCAP_DS}"))?,
        ),
        ("softcap, derived", ScoreMod::wgsl(SOFTCAP)?),
    ];
    let [q, k, v, dout] = uploaded(&ctx, [1, n, h, d])?;
    let mut calls = Vec::new();
    for (name, m) in &mods {
        let mut cfg = AttentionConfig::new(1, n, n, h, h, d);
        cfg.causal = true;
        cfg.score_mod = Some(m.clone());
        let f = ctx.forward(&cfg, &q, &k, &v)?;
        calls.push((*name, cfg, f));
    }
    let ms = interleaved_ms(a.rounds, calls.len(), |c| {
        let (_, cfg, f) = &calls[c];
        let g = ctx.backward(cfg, &q, &k, &v, &f.out, &f.lse, &dout)?;
        ctx.download::<f32>(&g.dq).map(|_| ()) // waits
    })?;
    println!("{}", ctx.adapter_info());
    println!(
        "backward, causal, B = 1, H = {h}, D = {d}, N = {n}, {} rounds:",
        a.rounds
    );
    for (c, (name, _, _)) in calls.iter().enumerate() {
        let (best, median) = (ms[c].min, ms[c].median);
        let ratio = if c % 2 == 1 {
            let hand = ms[c - 1];
            format!(
                "  derived / hand-written: best {:.3}, median {:.3}",
                best / hand.min,
                median / hand.median
            )
        } else {
            String::new()
        };
        println!("  {name:26} best {best:8.1} ms  median {median:8.1} ms{ratio}");
    }
    Ok(())
}
