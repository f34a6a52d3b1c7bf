//! What a call split into windows costs: the same attention on the adapter's own limits and on
//! devices of the same adapter that bind at most a few hundred KiB at once, side by side in one
//! run. The tiled algorithm then runs the call as windows of query and key rows merged exactly
//! (src/plan/split.rs); this prints the parts it made, the GPU time of each pass, the time
//! relative to the unsplit call, and the largest difference between the two results.
//!
//! FLOPs: forward 4 * B * H * Sq * Sk * D (halved for causal); backward 2.5x that.
//!
//! cargo run --release --example split_cost -- --seq 2048 --binding-kib 256,1024

#[path = "common/cli.rs"]
mod cli;
#[path = "common/device.rs"]
mod device;

use clap::Parser;
use flash_attn_wgpu::{unstable::plan, AttentionConfig, Context, Tensor};

#[derive(Parser, Debug)]
#[command(about = "GPU time of calls split into windows against the same call unsplit")]
struct Args {
    /// Sequence length (queries and keys)
    #[arg(long, default_value_t = 2048, value_parser = cli::positive)]
    seq: usize,
    /// Query heads (and kv heads)
    #[arg(long, default_value_t = 8, value_parser = cli::positive)]
    heads: usize,
    #[arg(long, default_value_t = 64, value_parser = cli::positive)]
    head_dim: usize,
    /// Storage binding limits to compare, in KiB, comma separated
    #[arg(long, default_value = "256,1024", value_delimiter = ',', value_parser = cli::positive)]
    binding_kib: Vec<usize>,
    #[arg(long)]
    causal: bool,
    /// Timed repetitions per pass (after one warm-up); the median is printed
    #[arg(long, default_value_t = 3, value_parser = cli::positive)]
    reps: usize,
}

/// A context over the default adapter whose device binds at most `binding` bytes (or the
/// adapter's own limit), with the features `Context::new` asks for.
fn context(binding: Option<u64>) -> Result<Context, Box<dyn std::error::Error>> {
    let ctx = match binding {
        None => Context::new()?,
        Some(binding) => device::context_with_limits(|adapter| wgpu::Limits {
            max_storage_buffer_binding_size: binding,
            ..adapter
        })?,
    };
    ctx.set_gpu_timing(true);
    Ok(ctx)
}

struct Timed {
    fwd_ms: f64,
    bwd_ms: f64,
    out: Vec<f32>,
    dq: Vec<f32>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn gpu_ms(ctx: &Context) -> f64 {
    ctx.last_gpu_timing().map_or(f64::NAN, |t| t.seconds * 1e3)
}

fn measure(
    ctx: &Context,
    cfg: &AttentionConfig,
    host: &[Vec<f32>; 4],
    reps: usize,
) -> Result<Timed, Box<dyn std::error::Error>> {
    let up =
        |x: &[f32], s: &[usize]| -> Result<Tensor, flash_attn_wgpu::Error> { ctx.upload(x, s) };
    let (qs, kvs) = (cfg.q_shape(), cfg.kv_shape());
    let (q, k, v, d_out) = (
        up(&host[0], &qs)?,
        up(&host[1], &kvs)?,
        up(&host[2], &kvs)?,
        up(&host[3], &qs)?,
    );
    let mut f = ctx.forward(cfg, &q, &k, &v)?;
    ctx.backward(cfg, &q, &k, &v, &f.out, &f.lse, &d_out)?;
    let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
    let mut g = None;
    for _ in 0..reps {
        f = ctx.forward(cfg, &q, &k, &v)?;
        fwd.push(gpu_ms(ctx));
        g = Some(ctx.backward(cfg, &q, &k, &v, &f.out, &f.lse, &d_out)?);
        bwd.push(gpu_ms(ctx));
    }
    let g = g.ok_or("no repetition ran")?;
    Ok(Timed {
        fwd_ms: median(fwd),
        bwd_ms: median(bwd),
        out: ctx.download(&f.out)?,
        dq: ctx.download(&g.dq)?,
    })
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let mut cfg = AttentionConfig::new(1, a.seq, a.seq, a.heads, a.heads, a.head_dim);
    cfg.causal = a.causal;
    let n = a.seq * a.heads * a.head_dim;
    let mut state = 0x9e3779b97f4a7c15u64;
    let mut rand = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    };
    let host = [rand(n), rand(n), rand(n), rand(n)];
    let flops =
        4.0 * (a.seq * a.seq * a.heads * a.head_dim) as f64 / if a.causal { 2.0 } else { 1.0 };
    println!(
        "B=1 H={} D={} N={} causal={} f32; forward {:.2} GFLOP, backward {:.2} GFLOP; GPU time, median of {}",
        a.heads,
        a.head_dim,
        a.seq,
        a.causal,
        flops * 1e-9,
        2.5 * flops * 1e-9,
        a.reps
    );
    let whole_ctx = context(None)?;
    println!("adapter: {}", whole_ctx.adapter_info());
    println!("| binding | fwd parts | bwd parts | fwd ms | fwd / whole | bwd ms | bwd / whole | max |out - whole| | max |dq - whole| |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let whole = measure(&whole_ctx, &cfg, &host, a.reps)?;
    let parts = |ctx: &Context| -> Result<(usize, usize), flash_attn_wgpu::Error> {
        let env = ctx.plan_env();
        Ok((
            plan::forward(&cfg, flash_attn_wgpu::DType::F32, &env)?
                .steps
                .len(),
            plan::backward(&cfg, flash_attn_wgpu::DType::F32, &env)?
                .steps
                .len(),
        ))
    };
    let (pf, pb) = parts(&whole_ctx)?;
    println!(
        "| adapter's ({} MiB) | {pf} | {pb} | {:.1} | 1.00 | {:.1} | 1.00 | 0 | 0 |",
        whole_ctx.adapter_info().max_storage_binding_bytes >> 20,
        whole.fwd_ms,
        whole.bwd_ms
    );
    drop(whole_ctx);
    for kib in &a.binding_kib {
        let ctx = context(Some(*kib as u64 * 1024))?;
        let (pf, pb) = parts(&ctx)?;
        let t = measure(&ctx, &cfg, &host, a.reps)?;
        println!(
            "| {kib} KiB | {pf} | {pb} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1e} | {:.1e} |",
            t.fwd_ms,
            t.fwd_ms / whole.fwd_ms,
            t.bwd_ms,
            t.bwd_ms / whole.bwd_ms,
            max_diff(&t.out, &whole.out),
            max_diff(&t.dq, &whole.dq)
        );
    }
    Ok(())
}
