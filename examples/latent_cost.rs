//! What an MLA latent cache costs a decode step (issue 53's goal: within 5% of the same keys
//! with the values stored apart, which read the same value bytes): DeepSeek-V3's MLA, 16 query
//! heads over one latent head of 576 dims whose values are its first 512, one query row a
//! sequence, f16, B = 1, caches of 16K and 32K keys by default. Side by side, interleaved round
//! by round on one context: separate k and v caches (`forward_with_kvcache`, 1,088 dims a
//! row) and the latent cache (`forward_with_latent_cache`, 576), dense, and with
//! `--paged` the same in shuffled pages of 64 rows (FlashMLA's page size). Prints each one's
//! best and median milliseconds (wall, each call waiting for its results), the ratio and the
//! cache bytes a token.
//!
//! cargo run --release --example latent_cost -- [--seq 16384,32768] [--rounds 5] [--paged]

use clap::Parser;
use flash_attn_wgpu::{AttentionConfig, Context, DType, PagedKv};
use rand::seq::SliceRandom;
use rand::SeedableRng;

#[path = "common/stats.rs"]
mod stats;
use stats::interleaved_ms;

/// Decode over an MLA cache: values apart, and inside the latent keys.
#[derive(Parser, Debug)]
#[command(name = "latent_cost", version)]
struct Args {
    /// Keys in the cache (comma list)
    #[arg(long, value_delimiter = ',', default_value = "16384,32768")]
    seq: Vec<usize>,
    /// Rounds (each times both calls once)
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Pages of 64 rows in a shuffled block table instead of dense caches
    #[arg(long)]
    paged: bool,
}

const PAGE: usize = 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let ctx = Context::new()?;
    println!("{}", ctx.adapter_info());
    let (h, d, dv) = (16, 576, 512);
    for &n in &a.seq {
        let mut cfg = AttentionConfig::new(1, 1, n, h, 1, d);
        cfg.head_dim_v = Some(dv);
        cfg.softmax_scale = Some(1.0 / (192f32).sqrt());
        if a.paged {
            let pages = n.div_ceil(PAGE);
            let mut table: Vec<u32> = (0..pages as u32).collect();
            table.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
            cfg.paged = Some(PagedKv {
                page_size: PAGE,
                num_pages: pages,
                pages_per_seq: pages,
                block_table: table,
            });
            cfg.seq_kv = pages * PAGE;
        }
        let fill = |len: usize, salt: usize| -> Vec<half::f16> {
            (0..len)
                .map(|i| half::f16::from_f32((((i * 7 + salt * 13) % 29) as f32 - 14.0) / 16.0))
                .collect()
        };
        let q = ctx.upload(&fill(h * d, 1), &cfg.q_shape())?;
        let mut k = ctx.upload(&fill(cfg.kv_shape().iter().product(), 2), &cfg.kv_shape())?;
        let mut v = ctx.upload(&fill(cfg.v_shape().iter().product(), 3), &cfg.v_shape())?;
        let lens = [n];
        let ms = interleaved_ms(a.rounds, 2, |c| {
            let f = if c == 0 {
                ctx.forward_with_kvcache(&cfg, &q, &mut k, &mut v, &lens, None)?
            } else {
                ctx.forward_with_latent_cache(&cfg, &q, &mut k, &lens, None)?
            };
            ctx.download::<f32>(&f.lse).map(|_| ())
        })?;
        let bytes = |latent| cfg.cache_bytes_per_token(DType::F16, None, latent);
        println!(
            "decode, MLA {h} heads over one latent head of {d} ({dv} values), f16, {} cache of \
             {n} keys, {} rounds:",
            if a.paged { "paged" } else { "dense" },
            a.rounds
        );
        for (c, name) in ["values apart", "latent"].iter().enumerate() {
            println!(
                "  {name:13} {:5} B/token  best {:8.2} ms  median {:8.2} ms  / apart: best {:.3}, \
                 median {:.3}",
                bytes(c == 1),
                ms[c].min,
                ms[c].median,
                ms[c].min / ms[0].min,
                ms[c].median / ms[0].median
            );
        }
    }
    Ok(())
}
