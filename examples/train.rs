//! Teacher-student training of one causal multi-head attention layer.
//!
//! A fixed random teacher layer (Wq, Wk, Wv) maps fresh random inputs X to targets; a student of
//! the same shape learns to reproduce them. Attention forward and backward run on the GPU through
//! this library; the projections, their gradients and Adam run on the host.
//!
//! With `--dtype f16` or `--dtype bf16` the student's attention runs in that element type: the
//! projected q, k, v and the loss gradient d_out are rounded to it before upload, and the
//! attention's outputs and gradients come back to f32 for the loss, the projections' gradients
//! and Adam. f16 uses loss scaling (`--loss-scale`).
//!
//! ```text
//! cargo run --release --example train -- --steps 300 --seed 1 --dtype bf16
//! cargo run --release --example train -- --help
//! ```

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

#[path = "common/cli.rs"]
mod cli;
use cli::positive;

use clap::{Parser, ValueEnum};
use flash_attn_wgpu::dtype::{from_f32_slice, to_f32_vec};
use flash_attn_wgpu::{Algorithm, AttentionConfig, Context, DType, Element};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type BoxResult<T> = Result<T, Box<dyn Error>>;

/// Steps averaged for the reported final loss.
const FINAL_WINDOW: usize = 10;
/// The loss must fall at least this much for the run to count as a success.
const REQUIRED_RATIO: f64 = 100.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AlgArg {
    /// FlashAttention (tiled)
    Tiled,
    /// standard attention (S and P in global memory)
    Naive,
}

/// Teacher-student training of one causal multi-head attention layer, attention forward and
/// backward on the GPU. Exits non-zero unless the loss falls at least 100x.
#[derive(Parser, Debug, Clone)]
#[command(name = "train", version)]
struct Options {
    /// Optimisation steps (one fresh random batch each)
    #[arg(long, default_value_t = 300, value_parser = positive)]
    steps: usize,
    /// Sequences per batch
    #[arg(long, default_value_t = 2, value_parser = positive)]
    batch: usize,
    /// Sequence length
    #[arg(long, default_value_t = 64, value_parser = positive)]
    seq: usize,
    /// Model width (heads = d_model / head_dim)
    #[arg(long, default_value_t = 32, value_parser = positive)]
    d_model: usize,
    /// Head dimension (must divide --d-model)
    #[arg(long, default_value_t = 16, value_parser = positive)]
    head_dim: usize,
    /// Adam learning rate (cosine-decayed to 1% over the run)
    #[arg(long, default_value_t = 3e-2)]
    lr: f32,
    /// Seed of the teacher, the student and the data
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Attention algorithm
    #[arg(long, value_enum, default_value = "tiled")]
    algorithm: AlgArg,
    /// Element type of the attention's q, k, v, out, d_out and gradients: f32, f16, bf16
    #[arg(long, default_value = "f32")]
    dtype: DType,
    /// Scale of d_out in the backward, undone in f32: auto (f16: a power of two per step), off,
    /// or a factor
    ///
    /// `auto` scales d_out, for f16 only, by the power of two that brings its largest entry
    /// into [0.5, 1), so that d_out and the gradients stay clear of f16's subnormal range.
    #[arg(long, default_value = "auto", value_parser = parse_loss_scale)]
    loss_scale: LossScale,
    /// Print the loss every this many steps
    #[arg(long, default_value_t = 25, value_parser = positive)]
    print_every: usize,
}

/// How `d_out` is scaled before the attention backward (and the gradients unscaled after).
#[derive(Debug, Clone, Copy, PartialEq)]
enum LossScale {
    /// Per step, for f16 only: the power of two that brings max |d_out| into [0.5, 1).
    Auto,
    Off,
    Fixed(f32),
}

fn parse_loss_scale(s: &str) -> Result<LossScale, String> {
    match s.trim() {
        "auto" => Ok(LossScale::Auto),
        "off" | "none" | "1" => Ok(LossScale::Off),
        v => match v.parse::<f32>() {
            Ok(x) if x.is_finite() && x > 0.0 => Ok(LossScale::Fixed(x)),
            _ => Err(format!(
                "expected auto, off or a positive factor, got {v:?}"
            )),
        },
    }
}

impl Options {
    fn check(&self) -> BoxResult<()> {
        if !self.d_model.is_multiple_of(self.head_dim) {
            return Err(format!(
                "--d-model ({}) must be a multiple of --head-dim ({})",
                self.d_model, self.head_dim
            )
            .into());
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(format!("--lr must be a positive number, got {}", self.lr).into());
        }
        Ok(())
    }

    fn attention_config(&self) -> AttentionConfig {
        let heads = self.d_model / self.head_dim;
        let mut cfg =
            AttentionConfig::new(self.batch, self.seq, self.seq, heads, heads, self.head_dim);
        cfg.causal = true;
        cfg.algorithm = match self.algorithm {
            AlgArg::Tiled => Algorithm::Tiled,
            AlgArg::Naive => Algorithm::Naive,
        };
        cfg
    }

    /// The factor d_out is multiplied by this step.
    fn scale_for(&self, d_out: &[f32]) -> f32 {
        match self.loss_scale {
            LossScale::Off => 1.0,
            LossScale::Fixed(x) => x,
            LossScale::Auto if self.dtype != DType::F16 => 1.0,
            LossScale::Auto => {
                let max = d_out.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                if max > 0.0 && max.is_finite() {
                    // 2^k with max * 2^k in [0.5, 1); exact in every float format.
                    2f32.powi(-(max.log2().floor() as i32) - 1)
                } else {
                    1.0
                }
            }
        }
    }
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

/// One optimisation step on a fresh batch; returns the loss before the update and the loss
/// scale used. The teacher's targets are computed in f32; the student's attention runs in `T`.
#[allow(clippy::too_many_arguments)]
fn train_step<T: Element>(
    ctx: &Context,
    cfg: &AttentionConfig,
    opts: &Options,
    teacher: &Layer,
    student: &mut Layer,
    adam: &mut Adam,
    x: &[f32],
    lr_scale: f32,
) -> BoxResult<(f64, f32)> {
    let d = cfg.heads_q * cfg.head_dim;
    let [tq, tk, tv] = teacher.project(x, d);
    let target = ctx.forward_host(cfg, &tq, &tk, &tv)?.out;

    let [q, k, v] = student.project(x, d).map(|p| from_f32_slice::<T>(&p));
    let f = ctx.forward_host(cfg, &q, &k, &v)?;
    let (loss, d_out) = mse(&to_f32_vec(&f.out), &target);
    let scale = opts.scale_for(&d_out);
    let d_out: Vec<T> = d_out.iter().map(|&g| T::from_f32(g * scale)).collect();
    let g = ctx.backward_host(cfg, &q, &k, &v, &f.out, &f.lse, &d_out)?;

    let grads = [g.dq, g.dk, g.dv].map(|dy| {
        let dy: Vec<f32> = dy.iter().map(|v| v.to_f32() / scale).collect();
        matmul_at_b(x, &dy, d, d)
    });
    if let Some(bad) = grads.iter().flatten().find(|g| !g.is_finite()) {
        return Err(format!("non-finite weight gradient {bad} (loss scale {scale})").into());
    }
    adam.step(&mut student.w, &grads, lr_scale);
    Ok((loss, scale))
}

fn main() -> ExitCode {
    let opts = Options::parse();
    let result = opts.check().and_then(|()| match opts.dtype {
        DType::F32 => train::<f32>(&opts),
        DType::F16 => train::<half::f16>(&opts),
        DType::BF16 => train::<half::bf16>(&opts),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn train<T: Element>(opts: &Options) -> BoxResult<()> {
    let cfg = opts.attention_config();
    cfg.validate()?;

    let ctx = Context::new()?;
    println!("adapter: {}", ctx.adapter_info());
    println!("options: {opts:?}");
    println!("config:  {cfg:?}");
    println!(
        "attention in {} (teacher targets in f32); tuning {:?}",
        T::DTYPE,
        ctx.tuning()
    );

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
        let (loss, scale) = train_step::<T>(
            &ctx,
            &cfg,
            opts,
            &teacher,
            &mut student,
            &mut adam,
            &x,
            lr_scale,
        )?;
        if !loss.is_finite() {
            return Err(format!("loss became {loss} at step {step}").into());
        }
        losses.push(loss);
        if step % opts.print_every == 0 || step + 1 == opts.steps {
            println!(
                "step {step:>5}  loss {loss:.6e}  lr {:.2e}  loss scale {scale}",
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
        return Err(format!(
            "FAILED: loss fell {ratio:.1}x, less than the required {REQUIRED_RATIO}x"
        )
        .into());
    }
    println!("OK: loss fell at least {REQUIRED_RATIO}x");
    Ok(())
}
