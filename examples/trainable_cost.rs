//! What a trainable captured tensor costs (issue 52's goal: forward + backward at most 1.3x
//! the same call with the tensor frozen): T5's relative buckets as a user modifier, its
//! [H, 16] table frozen and trainable (`ScoreMod::with_trainable`, which adds `d_table`: 128
//! entries, which the dQ kernel sums as it goes, a part per workgroup, and one kernel adds the
//! parts), causal, B = 1, H = 8, D = 64, N = 1024 by default, the two calls interleaved round
//! by round on one context. Prints each one's best and median milliseconds and the ratio.
//!
//! cargo run --release --example trainable_cost -- [--seq 1024] [--rounds 5]

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

/// Forward + backward time of a T5 table, frozen and trainable.
#[derive(Parser, Debug)]
#[command(name = "trainable_cost", version)]
struct Args {
    /// Queries and keys
    #[arg(long, default_value_t = 1024, value_parser = positive)]
    seq: usize,
    /// Rounds (each times both calls once)
    #[arg(long, default_value_t = 5, value_parser = positive)]
    rounds: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let ctx = Context::new()?;
    let (n, h, d) = (a.seq, 8, 64);
    let frozen = ScoreMod::wgsl_with(&t5_score_mod(), [("table", t5_table(h))])?;
    let trainable = frozen.clone().with_trainable("table")?;
    let [q, k, v, dout] = uploaded(&ctx, [1, n, h, d])?;
    let calls: Vec<(&str, AttentionConfig)> = [("frozen", frozen), ("trainable", trainable)]
        .into_iter()
        .map(|(name, m)| {
            let mut cfg = AttentionConfig::new(1, n, n, h, h, d);
            cfg.causal = true;
            cfg.score_mod = Some(m);
            (name, cfg)
        })
        .collect();
    let ms = interleaved_ms(a.rounds, calls.len(), |c| {
        let cfg = &calls[c].1;
        let f = ctx.forward(cfg, &q, &k, &v)?;
        let g = ctx.backward(cfg, &q, &k, &v, &f.out, &f.lse, &dout)?;
        ctx.download::<f32>(&g.dq)?; // waits
        match &g.d_table {
            Some(dt) => ctx.download::<f32>(dt).map(|_| ()),
            None => Ok(()),
        }
    })?;
    println!("{}", ctx.adapter_info());
    println!(
        "forward + backward, causal, T5 buckets, B = 1, H = {h}, D = {d}, N = {n}, {} rounds:",
        a.rounds
    );
    let frozen = ms[0];
    for (c, (name, _)) in calls.iter().enumerate() {
        let (best, median) = (ms[c].min, ms[c].median);
        println!(
            "  {name:10} best {best:8.1} ms  median {median:8.1} ms  / frozen: best {:.3}, median {:.3}",
            best / frozen.min,
            median / frozen.median
        );
    }
    Ok(())
}
