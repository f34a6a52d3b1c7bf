//! Measuring one point: random inputs, their upload in each dtype, and the timed calls.

use flash_attn_wgpu::{dtype, AttentionConfig, Context, DType, Element, Error, Tensor};
use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::stats::Stats;

/// The inputs of one shape, in f32, shared by every dtype, algorithm and pass.
pub struct HostInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_out: Vec<f32>,
}

impl HostInputs {
    pub fn random(cfg: &AttentionConfig, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut random =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
        let nq = cfg.batch * cfg.seq_q * cfg.heads_q * cfg.head_dim;
        let nkv = cfg.batch * cfg.seq_kv * cfg.heads_kv * cfg.head_dim;
        HostInputs {
            q: random(nq),
            k: random(nkv),
            v: random(nkv),
            d_out: random(nq),
        }
    }
}

/// Device copies of the inputs in one dtype.
pub struct DeviceInputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    d_out: Option<Tensor>,
}

fn upload_as<T: Element>(
    ctx: &Context,
    host: &HostInputs,
    cfg: &AttentionConfig,
    with_d_out: bool,
) -> Result<DeviceInputs, Error> {
    let up = |x: &[f32], shape: &[usize]| ctx.upload(&dtype::from_f32_slice::<T>(x), shape);
    Ok(DeviceInputs {
        q: up(&host.q, &cfg.q_shape())?,
        k: up(&host.k, &cfg.kv_shape())?,
        v: up(&host.v, &cfg.kv_shape())?,
        d_out: if with_d_out {
            Some(up(&host.d_out, &cfg.q_shape())?)
        } else {
            None
        },
    })
}

pub fn upload(
    ctx: &Context,
    dt: DType,
    host: &HostInputs,
    cfg: &AttentionConfig,
    with_d_out: bool,
) -> Result<DeviceInputs, Error> {
    match dt {
        DType::F32 => upload_as::<f32>(ctx, host, cfg, with_d_out),
        DType::F16 => upload_as::<half::f16>(ctx, host, cfg, with_d_out),
        DType::BF16 => upload_as::<half::bf16>(ctx, host, cfg, with_d_out),
    }
}

/// Times (ms: median, min, max) and allocations of one (shape, dtype, causal, algorithm)
/// point.
pub struct Measured {
    pub fwd_ms: Stats,
    pub fwd_alloc: u64,
    /// Forward + backward, when the backward ran.
    pub fwdbwd: Option<(Stats, u64)>,
    pub timestamps: bool,
    /// Median GPU milliseconds per kernel (timestamps only): the forward's, then with the
    /// backward the backward's.
    pub fwd_kernels_ms: Vec<(&'static str, f64)>,
    pub bwd_kernels_ms: Vec<(&'static str, f64)>,
}

/// Warm-up, then `repeats` timed calls: the forward, then (with `d_out`) the backward on its
/// output, once per build (`Context::set_compiled_flags`: which modifier bits are compiled
/// into the pipelines) in turn, call by call and in alternating order, so that each build
/// meets the machine's drift alike; one result per build. Allocated bytes are the peak of the library's device memory
/// beyond the inputs.
pub fn measure(
    ctx: &Context,
    cfg: &AttentionConfig,
    x: &DeviceInputs,
    repeats: usize,
    builds: &[u32],
) -> Result<Vec<Measured>, Error> {
    let gpu_seconds = || {
        ctx.last_gpu_timing()
            .ok_or_else(|| Error::Device("no GPU timing recorded for the last call".into()))
    };
    let inputs = ctx.memory_stats().live_bytes;
    let mut runs: Vec<Run> = builds.iter().map(|_| Run::default()).collect();
    for rep in 0..=repeats {
        // ABBA: a build's place in the turn alternates, so that neither is always the one
        // that follows the other (a place costs lavapipe ~10%, measured with two equal builds)
        let mut order: Vec<usize> = (0..builds.len()).collect();
        if rep % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (build, r) = (builds[i], &mut runs[i]);
            ctx.set_compiled_flags(build);
            ctx.reset_peak_memory();
            let f = ctx.forward(cfg, &x.q, &x.k, &x.v)?;
            let tf = gpu_seconds()?;
            r.timestamps &= tf.from_timestamps;
            r.fwd_alloc = ctx.memory_stats().peak_bytes.saturating_sub(inputs);
            let mut tb = None;
            if let Some(d_out) = &x.d_out {
                let g = ctx.backward(cfg, &x.q, &x.k, &x.v, &f.out, &f.lse, d_out)?;
                let t = gpu_seconds()?;
                r.timestamps &= t.from_timestamps;
                tb = Some(t.seconds);
                if rep > 0 {
                    r.bwd_kernels.push(t.per_kernel);
                }
                r.fb_alloc = ctx.memory_stats().peak_bytes.saturating_sub(inputs);
                drop(g);
            }
            drop(f);
            if rep > 0 {
                r.fwd_kernels.push(tf.per_kernel);
                r.fwd_times.push(tf.seconds);
                if let Some(tb) = tb {
                    r.fb_times.push(tf.seconds + tb);
                }
            }
        }
    }
    ctx.set_compiled_flags(builds[0]);
    Ok(runs.into_iter().map(Run::finish).collect())
}

/// What one build's calls of a point gathered.
struct Run {
    fwd_times: Vec<f64>,
    fb_times: Vec<f64>,
    fwd_alloc: u64,
    fb_alloc: u64,
    timestamps: bool,
    fwd_kernels: Vec<Vec<(&'static str, f64)>>,
    bwd_kernels: Vec<Vec<(&'static str, f64)>>,
}

impl Default for Run {
    fn default() -> Self {
        Run {
            fwd_times: Vec::new(),
            fb_times: Vec::new(),
            fwd_alloc: 0,
            fb_alloc: 0,
            timestamps: true,
            fwd_kernels: Vec::new(),
            bwd_kernels: Vec::new(),
        }
    }
}

impl Run {
    fn finish(self) -> Measured {
        Measured {
            fwd_ms: Stats::of(&self.fwd_times).scaled(1e3),
            fwd_alloc: self.fwd_alloc,
            fwdbwd: (!self.fb_times.is_empty())
                .then(|| (Stats::of(&self.fb_times).scaled(1e3), self.fb_alloc)),
            timestamps: self.timestamps,
            fwd_kernels_ms: median_per_kernel(&self.fwd_kernels),
            bwd_kernels_ms: median_per_kernel(&self.bwd_kernels),
        }
    }
}

/// Per kernel, the median of its milliseconds over the runs (kernels in first-run order).
fn median_per_kernel(runs: &[Vec<(&'static str, f64)>]) -> Vec<(&'static str, f64)> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|&(name, _)| {
            let times: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.iter().find(|(n, _)| *n == name).map(|(_, s)| *s))
                .collect();
            (name, Stats::of(&times).median * 1e3)
        })
        .collect()
}
