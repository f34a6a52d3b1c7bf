//! Criterion benches: forward and forward+backward, tiled and naive, a few sizes.
//! FLOPs: forward 4*B*H*Sq*Sk*D (halved for causal); backward 2.5x forward.
//! Each call ends with a device sync (the library waits for its submission), so wall time per
//! iteration is GPU time plus submission overhead.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flash_attn_wgpu::{Algorithm, AttentionConfig, Context, Tensor};

struct Inputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    d_out: Tensor,
}

fn inputs(ctx: &Context, cfg: &AttentionConfig) -> Inputs {
    let fill = |n: usize, salt: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + salt) % 2003) as f32 / 1001.5) - 1.0)
            .collect()
    };
    let nq = cfg.batch * cfg.seq_q * cfg.heads_q * cfg.head_dim;
    let nkv = cfg.batch * cfg.seq_kv * cfg.heads_kv * cfg.head_dim;
    Inputs {
        q: ctx.upload(&fill(nq, 1), &cfg.q_shape()).expect("upload"),
        k: ctx.upload(&fill(nkv, 2), &cfg.kv_shape()).expect("upload"),
        v: ctx.upload(&fill(nkv, 3), &cfg.kv_shape()).expect("upload"),
        d_out: ctx.upload(&fill(nq, 4), &cfg.q_shape()).expect("upload"),
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
        for seq in [256usize, 512, 1024] {
            for algorithm in [Algorithm::Tiled, Algorithm::Naive] {
                let mut cfg = AttentionConfig::new(1, seq, seq, 4, 4, 64);
                cfg.algorithm = algorithm;
                let fwd_flops = 4.0 * (4 * seq * seq * 64) as f64;
                let flops = if backward { 3.5 * fwd_flops } else { fwd_flops };
                group.throughput(Throughput::Elements(flops as u64));
                let x = inputs(&ctx, &cfg);
                let id = BenchmarkId::new(format!("{algorithm:?}").to_lowercase(), seq);
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
