//! Criterion benches: forward and forward+backward, tiled and naive, a few sizes, and the
//! tiled kernels in f16 and bf16 beside f32.
//! FLOPs: forward 4*B*H*Sq*Sk*D (halved for causal); backward 2.5x forward.
//! Each call ends with a device sync (the library waits for its submission), so wall time per
//! iteration is GPU time plus submission overhead.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flash_attn_wgpu::dtype::from_f32_slice;
use flash_attn_wgpu::{Algorithm, AttentionConfig, Context, DType, Tensor};

struct Inputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    d_out: Tensor,
}

fn upload(ctx: &Context, x: &[f32], shape: &[usize], dtype: DType) -> Tensor {
    match dtype {
        DType::F32 => ctx.upload(x, shape),
        DType::F16 => ctx.upload(&from_f32_slice::<half::f16>(x), shape),
        DType::BF16 => ctx.upload(&from_f32_slice::<half::bf16>(x), shape),
    }
    .expect("upload")
}

fn inputs(ctx: &Context, cfg: &AttentionConfig, dtype: DType) -> Inputs {
    let fill = |n: usize, salt: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + salt) % 2003) as f32 / 1001.5) - 1.0)
            .collect()
    };
    let nq = cfg.batch * cfg.seq_q * cfg.heads_q * cfg.head_dim;
    let nkv = cfg.batch * cfg.seq_kv * cfg.heads_kv * cfg.head_dim;
    Inputs {
        q: upload(ctx, &fill(nq, 1), &cfg.q_shape(), dtype),
        k: upload(ctx, &fill(nkv, 2), &cfg.kv_shape(), dtype),
        v: upload(ctx, &fill(nkv, 3), &cfg.kv_shape(), dtype),
        d_out: upload(ctx, &fill(nq, 4), &cfg.q_shape(), dtype),
    }
}

fn bench(c: &mut Criterion) {
    let ctx = match Context::new() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("skipping benches: {e}");
            return;
        }
    };
    for backward in [false, true] {
        let mut group = c.benchmark_group(if backward { "fwd+bwd" } else { "fwd" });
        group
            .sample_size(10)
            .measurement_time(Duration::from_secs(5));
        let points = [256usize, 512, 1024].into_iter().flat_map(|seq| {
            [
                (seq, Algorithm::Tiled, DType::F32),
                (seq, Algorithm::Naive, DType::F32),
                (seq, Algorithm::Tiled, DType::F16),
                (seq, Algorithm::Tiled, DType::BF16),
            ]
        });
        for (seq, algorithm, dtype) in points {
            {
                let mut cfg = AttentionConfig::new(1, seq, seq, 4, 4, 64);
                cfg.algorithm = algorithm;
                let fwd_flops = 4.0 * (4 * seq * seq * 64) as f64;
                let flops = if backward { 3.5 * fwd_flops } else { fwd_flops };
                group.throughput(Throughput::Elements(flops as u64));
                let x = inputs(&ctx, &cfg, dtype);
                let name = format!("{}-{dtype}", format!("{algorithm:?}").to_lowercase());
                let id = BenchmarkId::new(name, seq);
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        let start = Instant::now();
                        for _ in 0..iters {
                            let f = ctx.forward(&cfg, &x.q, &x.k, &x.v).expect("forward");
                            if backward {
                                ctx.backward(&cfg, &x.q, &x.k, &x.v, &f.out, &f.lse, &x.d_out)
                                    .expect("backward");
                            }
                        }
                        start.elapsed()
                    })
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
