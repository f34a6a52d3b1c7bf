//! Teacher-student training of one causal multi-head attention layer.
//!
//! A fixed random teacher layer (Wq, Wk, Wv) maps fresh random inputs X to targets; a student of
//! the same shape learns to reproduce them. Attention forward and backward run on the GPU through
//! this library; the projections, their gradients and Adam run on the host.
//!
//! ```text
//! cargo run --release --example train -- --steps 300 --seed 1
//! ```

use std::error::Error;
use std::time::Instant;

use flash_attn_wgpu::{Algorithm, AttentionConfig, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type BoxResult<T> = Result<T, Box<dyn Error>>;

/// Steps averaged for the reported final loss.
const FINAL_WINDOW: usize = 10;
/// The loss must fall at least this much for the run to count as a success.
const REQUIRED_RATIO: f64 = 100.0;

#[derive(Debug, Clone)]
struct Options {
    steps: usize,
    batch: usize,
    seq: usize,
    d_model: usize,
    head_dim: usize,
    lr: f32,
    seed: u64,
    algorithm: Algorithm,
    print_every: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            steps: 300,
            batch: 2,
            seq: 64,
            d_model: 32,
            head_dim: 16,
            lr: 3e-2,
            seed: 0,
            algorithm: Algorithm::Tiled,
            print_every: 25,
        }
    }
}

const USAGE: &str = "usage: train [--steps N] [--batch N] [--seq N] [--d-model N] [--head-dim N] \
                     [--lr F] [--seed N] [--algorithm tiled|naive] [--print-every N]";

impl Options {
    fn parse(args: impl IntoIterator<Item = String>) -> BoxResult<Self> {
        let mut o = Self::default();
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            if flag == "--help" || flag == "-h" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            let mut value = || {
                args.next()
                    .ok_or_else(|| format!("{flag} needs a value (try --help)"))
            };
            match flag.as_str() {
                "--steps" => o.steps = parse(&flag, &value()?)?,
                "--batch" => o.batch = parse(&flag, &value()?)?,
                "--seq" => o.seq = parse(&flag, &value()?)?,
                "--d-model" => o.d_model = parse(&flag, &value()?)?,
                "--head-dim" => o.head_dim = parse(&flag, &value()?)?,
                "--lr" => o.lr = parse(&flag, &value()?)?,
                "--seed" => o.seed = parse(&flag, &value()?)?,
                "--print-every" => o.print_every = parse(&flag, &value()?)?,
                "--algorithm" => {
                    o.algorithm = match value()?.as_str() {
                        "tiled" => Algorithm::Tiled,
                        "naive" => Algorithm::Naive,
                        other => {
                            return Err(
                                format!("--algorithm must be tiled or naive, got {other}").into()
                            )
                        }
                    }
                }
                _ => return Err(format!("unknown flag {flag} (try --help)").into()),
            }
        }
        if o.steps == 0 || o.print_every == 0 {
            return Err("--steps and --print-every must be at least 1".into());
        }
        if o.head_dim == 0 || o.d_model % o.head_dim != 0 {
            return Err(format!(
                "--d-model ({}) must be a positive multiple of --head-dim ({})",
                o.d_model, o.head_dim
            )
            .into());
        }
        Ok(o)
    }

    fn attention_config(&self) -> AttentionConfig {
        let heads = self.d_model / self.head_dim;
        let mut cfg =
            AttentionConfig::new(self.batch, self.seq, self.seq, heads, heads, self.head_dim);
        cfg.causal = true;
        cfg.algorithm = self.algorithm;
        cfg
    }
}

fn parse<T: std::str::FromStr>(flag: &str, value: &str) -> BoxResult<T>
where
    T::Err: std::fmt::Display,
{
    value
        .parse()
        .map_err(|e| format!("bad value {value:?} for {flag}: {e}").into())
}

/// `a [n, k] * b [k, m] -> [n, m]`, all row-major.
fn matmul(a: &[f32], b: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut c = vec![0.0; n * m];
    for (a_row, c_row) in a.chunks_exact(k).zip(c.chunks_exact_mut(m)) {
        for (&a_ip, b_row) in a_row.iter().zip(b.chunks_exact(m)) {
            for (c_ij, &b_pj) in c_row.iter_mut().zip(b_row) {
                *c_ij += a_ip * b_pj;
            }
        }
    }
    c
}

/// `a^T * b` with `a [n, k]` and `b [n, m]` -> `[k, m]`: the weight gradient `X^T dY`,
/// summed over all rows (batch and sequence).
fn matmul_at_b(a: &[f32], b: &[f32], k: usize, m: usize) -> Vec<f32> {
    let mut c = vec![0.0; k * m];
    for (a_row, b_row) in a.chunks_exact(k).zip(b.chunks_exact(m)) {
        for (&a_ri, c_row) in a_row.iter().zip(c.chunks_exact_mut(m)) {
            for (c_ij, &b_rj) in c_row.iter_mut().zip(b_row) {
                *c_ij += a_ri * b_rj;
            }
        }
    }
    c
}

/// Uniform values with the given standard deviation.
fn random_vec(rng: &mut StdRng, len: usize, std: f32) -> Vec<f32> {
    let a = std * 3f32.sqrt();
    (0..len).map(|_| rng.random_range(-a..a)).collect()
}

/// Query, key and value projections, each `[d_model, d_model]`.
struct Layer {
    w: [Vec<f32>; 3],
}

impl Layer {
    /// Entries of variance `1 / d_model`, so projections of unit-variance inputs stay unit-variance.
    fn random(rng: &mut StdRng, d_model: usize) -> Self {
        let std = (d_model as f32).sqrt().recip();
        Self {
            w: std::array::from_fn(|_| random_vec(rng, d_model * d_model, std)),
        }
    }

    /// Q, K and V for `x [rows, d_model]`; `[rows, d_model]` is the library's
    /// `[batch, seq, heads, head_dim]` layout.
    fn project(&self, x: &[f32], d_model: usize) -> [Vec<f32>; 3] {
        let rows = x.len() / d_model;
        std::array::from_fn(|i| matmul(x, &self.w[i], rows, d_model, d_model))
    }
}

struct Adam {
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    t: i32,
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl Adam {
    fn new(lr: f32, shapes: &[usize]) -> Self {
        Self {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            t: 0,
            m: shapes.iter().map(|&n| vec![0.0; n]).collect(),
            v: shapes.iter().map(|&n| vec![0.0; n]).collect(),
        }
    }

    /// One update of every parameter tensor, with the step size scaled by `lr_scale`.
    fn step(&mut self, params: &mut [Vec<f32>], grads: &[Vec<f32>], lr_scale: f32) {
        self.t += 1;
        let bias1 = 1.0 - self.beta1.powi(self.t);
        let bias2 = 1.0 - self.beta2.powi(self.t);
        let lr = self.lr * lr_scale;
        for (((p, g), m), v) in params
            .iter_mut()
            .zip(grads)
            .zip(&mut self.m)
            .zip(&mut self.v)
        {
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                *m = self.beta1 * *m + (1.0 - self.beta1) * g;
                *v = self.beta2 * *v + (1.0 - self.beta2) * g * g;
                *p -= lr * (*m / bias1) / ((*v / bias2).sqrt() + self.eps);
            }
        }
    }
}

/// Cosine decay from 1 to 0.01 over the run: large early steps, fine ones at the end.
fn lr_schedule(step: usize, steps: usize) -> f32 {
    let progress = step as f32 / steps.max(1) as f32;
    0.01 + 0.99 * 0.5 * (1.0 + (std::f32::consts::PI * progress).cos())
}

/// Mean squared error and its gradient `2 (student - teacher) / N`.
fn mse(student: &[f32], teacher: &[f32]) -> (f64, Vec<f32>) {
    let n = student.len() as f32;
    let mut sum = 0.0f64;
    let grad = student
        .iter()
        .zip(teacher)
        .map(|(&s, &t)| {
            let diff = s - t;
            sum += f64::from(diff * diff);
            2.0 * diff / n
        })
        .collect();
    (sum / f64::from(n), grad)
}

/// One optimisation step on a fresh batch; returns the loss before the update.
fn train_step(
    ctx: &Context,
    cfg: &AttentionConfig,
    teacher: &Layer,
    student: &mut Layer,
    adam: &mut Adam,
    x: &[f32],
    lr_scale: f32,
) -> BoxResult<f64> {
    let d = cfg.heads_q * cfg.head_dim;
    let [tq, tk, tv] = teacher.project(x, d);
    let target = ctx.forward_host(cfg, &tq, &tk, &tv)?.out;

    let [q, k, v] = student.project(x, d);
    let f = ctx.forward_host(cfg, &q, &k, &v)?;
    let (loss, d_out) = mse(&f.out, &target);
    let g = ctx.backward_host(cfg, &q, &k, &v, &f.out, &f.lse, &d_out)?;

    let grads = [g.dq, g.dk, g.dv].map(|dy| matmul_at_b(x, &dy, d, d));
    adam.step(&mut student.w, &grads, lr_scale);
    Ok(loss)
}

fn main() -> Result<(), Box<dyn Error>> {
    let opts = Options::parse(std::env::args().skip(1))?;
    let cfg = opts.attention_config();
    cfg.validate()?;

    let ctx = Context::new()?;
    println!("adapter: {}", ctx.adapter_info());
    println!("options: {opts:?}");
    println!("config:  {cfg:?}");

    let d = opts.d_model;
    let teacher = Layer::random(&mut StdRng::seed_from_u64(opts.seed), d);
    let mut student = Layer::random(
        &mut StdRng::seed_from_u64(opts.seed.wrapping_add(1_000_003)),
        d,
    );
    let mut data_rng = StdRng::seed_from_u64(opts.seed.wrapping_add(2_000_003));
    let mut adam = Adam::new(opts.lr, &[d * d; 3]);
    let x_len = opts.batch * opts.seq * d;

    let mut losses = Vec::with_capacity(opts.steps);
    let started = Instant::now();
    for step in 0..opts.steps {
        let x = random_vec(&mut data_rng, x_len, 1.0);
        let lr_scale = lr_schedule(step, opts.steps);
        let loss = train_step(&ctx, &cfg, &teacher, &mut student, &mut adam, &x, lr_scale)?;
        if !loss.is_finite() {
            return Err(format!("loss became {loss} at step {step}").into());
        }
        losses.push(loss);
        if step % opts.print_every == 0 || step + 1 == opts.steps {
            println!(
                "step {step:>5}  loss {loss:.6e}  lr {:.2e}",
                opts.lr * lr_scale
            );
        }
    }
    let ms_per_step = started.elapsed().as_secs_f64() * 1e3 / opts.steps as f64;

    let initial = losses[0];
    let tail = &losses[losses.len().saturating_sub(FINAL_WINDOW)..];
    let final_loss = tail.iter().sum::<f64>() / tail.len() as f64;
    let ratio = initial / final_loss;
    println!("initial loss:   {initial:.6e}");
    println!(
        "final loss:     {final_loss:.6e} (mean of last {} steps)",
        tail.len()
    );
    println!("ratio:          {ratio:.1}x");
    println!("time per step:  {ms_per_step:.1} ms");

    if ratio < REQUIRED_RATIO {
        // Returning the error makes the process exit with a non-zero status.
        return Err(format!(
            "FAILED: loss fell {ratio:.1}x, less than the required {REQUIRED_RATIO}x"
        )
        .into());
    }
    println!("OK: loss fell at least {REQUIRED_RATIO}x");
    Ok(())
}
