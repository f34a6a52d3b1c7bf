//! A small causal transformer trained in burn twice from the same initial weights: once with
//! flash attention (fused forward and backward) and once with burn's own attention (which
//! trains through its unfused composition). Prints the two losses side by side, the time per
//! step and the peak device memory of each.
//!
//! The task: the target at position i is the token at position i - 3, tokens drawn with
//! probability proportional to 1 / (rank + 1). The loss first falls as the model learns that
//! skew, then further only through attention.
//!
//! ```text
//! cargo run --example burn_train -- [--seq 256] [--steps 20] [--batch 4] [--only flash|burn]
//! ```

use std::time::Instant;

use burn::tensor::activation::{log_softmax, relu};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Device, Int, Tensor, TensorData};
use flash_attn_burn::{flash_attention, Options};
use rand::{Rng, SeedableRng};

const VOCAB: usize = 32;
const MODEL: usize = 128;
const HEADS: usize = 4;
const HEAD_DIM: usize = MODEL / HEADS;
const HIDDEN: usize = 256;
const SHIFT: usize = 3;
const LR: f32 = 0.5;

#[derive(Clone, Copy, PartialEq)]
enum Attention {
    Flash,
    Burn,
}

/// Weights as host data, so that both runs start from the same values.
struct Init(Vec<(Vec<f32>, [usize; 2])>);

impl Init {
    fn new(seq: usize, rng: &mut rand::rngs::StdRng) -> Init {
        let mut w = |r: usize, c: usize| {
            let s = (1.0 / r as f32).sqrt();
            (
                (0..r * c).map(|_| rng.random_range(-s..s)).collect(),
                [r, c],
            )
        };
        // embedding, positions, q, k, v, o, ffn in, ffn out, head
        Init(vec![
            w(VOCAB, MODEL),
            w(seq, MODEL),
            w(MODEL, MODEL),
            w(MODEL, MODEL),
            w(MODEL, MODEL),
            w(MODEL, MODEL),
            w(MODEL, HIDDEN),
            w(HIDDEN, MODEL),
            w(MODEL, VOCAB),
        ])
    }

    fn params(&self, dev: &Device) -> Vec<Tensor<2>> {
        self.0
            .iter()
            .map(|(d, s)| {
                Tensor::<2>::from_data(TensorData::new(d.clone(), *s), dev).require_grad()
            })
            .collect()
    }
}

fn attend(kind: Attention, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
    match kind {
        Attention::Flash => flash_attention(
            q,
            k,
            v,
            &Options {
                causal: true,
                ..Options::default()
            },
        )
        .expect("flash attention"),
        Attention::Burn => {
            let opts = AttentionModuleOptions {
                scale: None,
                softcap: None,
                is_causal: true,
            };
            attention(q, k, v, None, None, opts)
        }
    }
}

/// Mean cross-entropy of next-token logits for `tokens` `[batch, seq]`.
fn loss(
    kind: Attention,
    p: &[Tensor<2>],
    tokens: &Tensor<2, Int>,
    targets: &Tensor<3>,
) -> Tensor<1> {
    let [b, s] = tokens.dims();
    let onehot = tokens.clone().one_hot::<3>(VOCAB).float();
    let x = onehot.matmul(p[0].clone().unsqueeze()) + p[1].clone().unsqueeze();
    let heads = |w: &Tensor<2>| {
        x.clone()
            .matmul(w.clone().unsqueeze())
            .reshape([b, s, HEADS, HEAD_DIM])
            .swap_dims(1, 2)
    };
    let a = attend(kind, heads(&p[2]), heads(&p[3]), heads(&p[4]));
    let a = a.swap_dims(1, 2).reshape([b, s, MODEL]);
    let h = x + a.matmul(p[5].clone().unsqueeze());
    let f = relu(h.clone().matmul(p[6].clone().unsqueeze())).matmul(p[7].clone().unsqueeze());
    let logits = (h + f).matmul(p[8].clone().unsqueeze());
    -(log_softmax(logits, 2) * targets.clone()).sum() / (b * s) as f32
}

struct Run {
    losses: Vec<f32>,
    step_ms: Vec<f64>,
    peak_burn: u64,
    peak_ours: u64,
}

fn train(kind: Attention, init: &Init, data: &[(Tensor<2, Int>, Tensor<3>)], dev: &Device) -> Run {
    let mut p = init.params(dev);
    let ctx = flash_attn_burn::context(dev).expect("context");
    ctx.reset_peak_memory();
    let (mut losses, mut step_ms, mut peak_burn) = (Vec::new(), Vec::new(), 0);
    for (tokens, targets) in data {
        let t0 = Instant::now();
        let l = loss(kind, &p, tokens, targets);
        if let Some(u) = dev.memory_pool_usage() {
            peak_burn = peak_burn.max(u.bytes_in_use);
        }
        let grads = l.backward();
        if let Some(u) = dev.memory_pool_usage() {
            peak_burn = peak_burn.max(u.bytes_in_use);
        }
        p = p
            .into_iter()
            .map(|w| {
                let g = w.grad(&grads).expect("every weight has a gradient");
                Tensor::from_inner(w.inner() - g * LR).require_grad()
            })
            .collect();
        losses.push(l.into_scalar::<f32>());
        dev.sync().expect("device");
        step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Run {
        losses,
        step_ms,
        peak_burn,
        peak_ours: ctx.memory_stats().peak_bytes,
    }
}

fn arg(name: &str, default: usize) -> usize {
    let a: Vec<String> = std::env::args().collect();
    a.iter()
        .position(|x| x == name)
        .and_then(|i| a.get(i + 1))
        .map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
}

fn median(x: &[f64]) -> f64 {
    let mut v = x[1.min(x.len() - 1)..].to_vec(); // the first step compiles the pipelines
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> flash_attn_burn::Result<()> {
    let (seq, steps, batch) = (arg("--seq", 256), arg("--steps", 20), arg("--batch", 4));
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    let dev = flash_attn_burn::init()?.autodiff();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let init = Init::new(seq, &mut rng);
    let data: Vec<_> = (0..steps)
        .map(|_| {
            let cdf: Vec<f64> = (0..VOCAB)
                .scan(0.0, |c, r| {
                    *c += 1.0 / (r + 1) as f64;
                    Some(*c)
                })
                .collect();
            let toks: Vec<i64> = (0..batch * seq)
                .map(|_| {
                    let u = rng.random_range(0.0..cdf[VOCAB - 1]);
                    cdf.iter().position(|&c| u < c).unwrap_or(VOCAB - 1) as i64
                })
                .collect();
            let mut tgt = vec![0f32; batch * seq * VOCAB];
            for b in 0..batch {
                for i in 0..seq {
                    let t = toks[b * seq + i.saturating_sub(SHIFT)] as usize;
                    tgt[(b * seq + i) * VOCAB + t] = 1.0;
                }
            }
            (
                Tensor::<2, Int>::from_data(TensorData::new(toks, [batch, seq]), &dev),
                Tensor::<3>::from_data(TensorData::new(tgt, [batch, seq, VOCAB]), &dev),
            )
        })
        .collect();
    println!(
        "adapter: {} | batch {batch}, seq {seq}, {HEADS} heads x {HEAD_DIM}, {steps} steps",
        flash_attn_burn::context(&dev)?.adapter_info().name
    );
    let want = |k: &str| only.as_deref().is_none_or(|o| o == k);
    let flash = want("flash").then(|| train(Attention::Flash, &init, &data, &dev));
    let burn = want("burn").then(|| train(Attention::Burn, &init, &data, &dev));
    println!("step  loss(flash)  loss(burn)");
    for s in 0..steps {
        let l = |r: &Option<Run>| {
            r.as_ref()
                .map_or("-".into(), |r| format!("{:.5}", r.losses[s]))
        };
        println!("{s:4}  {:>11}  {:>10}", l(&flash), l(&burn));
    }
    for (name, r) in [("flash", &flash), ("burn", &burn)] {
        if let Some(r) = r {
            println!(
                "{name:5}: median step {:.1} ms (first {:.0} ms), peak memory burn pool {:.1} MiB + flash-attn {:.1} MiB",
                median(&r.step_ms),
                r.step_ms[0],
                r.peak_burn as f64 / (1 << 20) as f64,
                r.peak_ours as f64 / (1 << 20) as f64
            );
        }
    }
    if let (Some(f), Some(b)) = (&flash, &burn) {
        let d = f
            .losses
            .iter()
            .zip(&b.losses)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        println!("largest loss difference over {steps} steps: {d:.2e}");
    }
    Ok(())
}
