//! The same plans on two WebGPU implementations over one adapter: wgpu (naga) here, Dawn
//! (Tint) through `dawn/runner.mjs`, side by side in one run.
//!
//! Both devices get the WebGPU default limits (16 KiB workgroup memory, 256 invocations) and
//! the features f16, subgroups and timestamps, so the tile chooser picks the same tiles and
//! the plans are identical; times are GPU timestamps (median of the repeats after a warm-up).
//! FLOPs: forward 4*B*H*Sq*Sk*D (halved for causal); backward 2.5x forward.
//!
//! Needs `bash scripts/ensure-portability.sh` (Node.js and the pinned webgpu package).
//!
//! cargo run --release --example dawn_compare -- --seq 512,1024 --dtype f32,f16

#[path = "common/device.rs"]
mod device;

use std::path::Path;
use std::process::{Command, ExitCode};

use clap::Parser;
use flash_attn_wgpu::dtype::from_f32_slice;
use flash_attn_wgpu::unstable::kernels::WgslConsumer;
use flash_attn_wgpu::unstable::replay::to_words;
use flash_attn_wgpu::{unstable::plan, AttentionConfig, Context, DType, Element, Tensor};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Parser)]
#[command(about = "wgpu (naga) vs Dawn (Tint) on the same adapter, same plans, one run")]
struct Args {
    /// Sequence lengths N (seq_q = seq_kv), comma list
    #[arg(long, value_delimiter = ',', default_value = "512,1024")]
    seq: Vec<usize>,
    /// Element types, comma list: f32, f16, bf16
    #[arg(long, value_delimiter = ',', default_value = "f32,f16")]
    dtype: Vec<DType>,
    /// Query heads (= kv heads)
    #[arg(long, default_value_t = 8)]
    heads: usize,
    /// Head dimension
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
    /// Causal mask
    #[arg(long)]
    causal: bool,
    /// Timed repeats after one warm-up
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Extra Dawn toggles for the runner, e.g. disable_robustness
    #[arg(long)]
    dawn_toggles: Option<String>,
}

fn default_limits_context() -> Result<Context, Box<dyn std::error::Error>> {
    let ctx = device::context_with_limits(|_| wgpu::Limits::default())?;
    ctx.set_gpu_timing(true);
    Ok(ctx)
}

fn upload(
    ctx: &Context,
    x: &[f32],
    shape: &[usize],
    dtype: DType,
) -> flash_attn_wgpu::Result<(Tensor, Vec<u32>)> {
    fn typed<T: Element>(
        ctx: &Context,
        x: &[f32],
        shape: &[usize],
    ) -> flash_attn_wgpu::Result<(Tensor, Vec<u32>)> {
        let t = from_f32_slice::<T>(x);
        Ok((ctx.upload(&t, shape)?, to_words(&t)))
    }
    match dtype {
        DType::F32 => typed::<f32>(ctx, x, shape),
        DType::F16 => typed::<half::f16>(ctx, x, shape),
        DType::BF16 => typed::<half::bf16>(ctx, x, shape),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    if !root.join("dawn/node_modules/webgpu/package.json").exists() {
        return Err(
            "dawn/node_modules/webgpu is missing: run `bash scripts/ensure-portability.sh`".into(),
        );
    }
    let ctx = default_limits_context()?;
    println!("adapter: {}", ctx.adapter_info());
    println!(
        "tuning: {:?} (both implementations run the same plans)",
        ctx.tuning()
    );
    let mut rng = StdRng::seed_from_u64(7);
    let mut rows = Vec::new();
    let mut cases = Vec::new();
    for &n in &a.seq {
        for &dtype in &a.dtype {
            let mut cfg = AttentionConfig::new(1, n, n, a.heads, a.heads, a.head_dim);
            cfg.causal = a.causal;
            let mut random = |len: usize| -> Vec<f32> {
                (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
            };
            let (nq, nkv) = (
                cfg.q_shape().iter().product(),
                cfg.kv_shape().iter().product(),
            );
            let (q, qw) = upload(&ctx, &random(nq), &cfg.q_shape(), dtype)?;
            let (k, kw) = upload(&ctx, &random(nkv), &cfg.kv_shape(), dtype)?;
            let (v, vw) = upload(&ctx, &random(nkv), &cfg.kv_shape(), dtype)?;
            let (d_out, dow) = upload(&ctx, &random(nq), &cfg.q_shape(), dtype)?;
            let (mut tf, mut tb) = (Vec::new(), Vec::new());
            let mut fwd_out = None;
            for rep in 0..=a.repeats {
                let f = ctx.forward(&cfg, &q, &k, &v)?;
                let t1 = ctx.last_gpu_timing().map_or(f64::NAN, |t| t.seconds * 1e3);
                ctx.backward(&cfg, &q, &k, &v, &f.out, &f.lse, &d_out)?;
                let t2 = ctx.last_gpu_timing().map_or(f64::NAN, |t| t.seconds * 1e3);
                if rep > 0 {
                    tf.push(t1);
                    tb.push(t2);
                }
                fwd_out = Some(f);
            }
            let f = fwd_out.ok_or("no forward ran")?;
            let out_words = match dtype {
                DType::F32 => to_words(&ctx.download::<f32>(&f.out)?),
                DType::F16 => to_words(&ctx.download::<half::f16>(&f.out)?),
                DType::BF16 => to_words(&ctx.download::<half::bf16>(&f.out)?),
            };
            let lse_words = to_words(&ctx.download::<f32>(&f.lse)?);
            let env = ctx.plan_env();
            let name = format!("N={n} {dtype}");
            let pf = plan::forward(&cfg, dtype, &env)?;
            cases.push(pf.replay(
                &format!("fwd {name}"),
                WgslConsumer::Tint,
                vec![qw.clone(), kw.clone(), vw.clone()],
                65535,
            ));
            let pb = plan::backward(&cfg, dtype, &env)?;
            cases.push(pb.replay(
                &format!("bwd {name}"),
                WgslConsumer::Tint,
                vec![qw, kw, vw, out_words, lse_words, dow],
                65535,
            ));
            let flops =
                4.0 * (a.heads * n * n * a.head_dim) as f64 * if a.causal { 0.5 } else { 1.0 };
            rows.push((n, dtype, "fwd", median(tf), flops));
            rows.push((n, dtype, "bwd", median(tb), 2.5 * flops));
        }
    }
    let file = std::env::temp_dir().join("flash-attn-dawn-compare.json");
    std::fs::write(&file, serde_json::json!({ "cases": cases }).to_string())?;
    let mut cmd = Command::new("node");
    cmd.arg(root.join("dawn/runner.mjs"))
        .arg("bench")
        .arg(&file)
        .arg(a.repeats.to_string());
    if let Some(t) = &a.dawn_toggles {
        cmd.env("DAWN_TOGGLES", t);
    }
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!(
            "Dawn runner failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let dawn: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    println!("FLOPs: forward 4*B*H*Sq*Sk*D (halved for causal); backward 2.5x forward. B=1, H={}, D={}, causal={}", a.heads, a.head_dim, a.causal);
    println!(
        "{:>5} {:>6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>9}",
        "N", "dtype", "pass", "wgpu ms", "Dawn ms", "wgpu GF/s", "Dawn GF/s", "Dawn/wgpu"
    );
    for ((n, dtype, pass, wgpu_ms, flops), d) in rows.iter().zip(&dawn) {
        let dawn_ms = d["ms"].as_f64().unwrap_or(f64::NAN);
        println!(
            "{n:>5} {:>6} {pass:>5} {wgpu_ms:>10.1} {dawn_ms:>10.1} {:>10.2} {:>10.2} {:>9.2}",
            dtype.name(),
            flops / wgpu_ms / 1e6,
            flops / dawn_ms / 1e6,
            dawn_ms / wgpu_ms
        );
    }
    Ok(())
}
