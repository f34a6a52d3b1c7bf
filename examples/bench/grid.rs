//! The grid: every (shape, dtype, causal, algorithm, variant) point the flags ask for, walked
//! cheapest first under the time budget, and the records it yields.

use std::collections::HashMap;
use std::time::Instant;

use flash_attn_wgpu::unstable::kernels::flags;
use flash_attn_wgpu::{
    unstable::plan, Algorithm, AttentionConfig, Context, DType, Error, ScoreBias, Tuning, Variant,
    Window,
};

use crate::args::{AlgArg, Args, PassArg};
use crate::measure::{measure, upload, DeviceInputs, HostInputs, Measured};
use crate::model::{alg_label, bytes_moved_model, flops, mask_label, ModelTiles, Pass};

/// One grid shape (everything but dtype, causal, algorithm and pass).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub seq: usize,
}

impl Shape {
    fn config(
        &self,
        causal: bool,
        window: Window,
        mods: &Mods,
        alg: Algorithm,
        dtype: DType,
    ) -> AttentionConfig {
        let mut cfg = if mods.varlen {
            // the batch's sequences packed end to end: the same pairs in one varlen call
            let cu: Vec<u32> = (0..=self.batch).map(|b| (b * self.seq) as u32).collect();
            AttentionConfig::packed(cu.clone(), cu, self.heads, self.kv_heads, self.head_dim)
        } else {
            AttentionConfig::new(
                self.batch,
                self.seq,
                self.seq,
                self.heads,
                self.kv_heads,
                self.head_dim,
            )
        };
        cfg.causal = causal;
        cfg.window = window;
        cfg.softcap = mods.softcap;
        if mods.user_softcap {
            // the same function as the built-in softcap, as user code (natural-log scores)
            let c = cfg
                .softcap
                .take()
                .expect("--score-mod-both requires --softcap");
            let m = flash_attn_wgpu::ScoreMod::wgsl(&format!(
                "fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {{ \
                 return {c:?} * tanh(s / {c:?}); }}
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {{ \
                 let t = tanh(s / {c:?}); return 1.0 - t * t; }}"
            ))
            .and_then(|m| {
                m.with_cuda(&format!(
                    "__device__ float score_mod(float s, unsigned int b, unsigned int h, \
                     unsigned int i, unsigned int j) {{ return {c:?}f * tanhf(s / {c:?}f); }}
__device__ float score_mod_ds(float s, unsigned int b, unsigned int h, unsigned int i, \
                     unsigned int j) {{ const float t = tanhf(s / {c:?}f); return 1.f - t * t; }}"
                ))
            })
            .expect("the bench's softcap snippet is valid");
            cfg.score_mod = Some(m);
        }
        cfg.alibi_slopes = mods.alibi.then(|| {
            let h = self.heads as f32;
            (0..self.heads)
                .map(|i| (-8.0 * (i as f32 + 1.0) / h).exp2())
                .collect()
        });
        cfg.sinks = mods.sinks.then(|| vec![1.0; self.heads]);
        cfg.seqlens_kv = mods.kv_fill.map(|f| {
            let n = ((self.seq as f64 * f).round() as usize).min(self.seq);
            vec![n; cfg.batch]
        });
        cfg.dropout = mods
            .dropout
            .map(|p| flash_attn_wgpu::Dropout::new(p, 0x5eed, 0));
        cfg.block_mask = mods.blocks.map(|(density, size)| {
            // a fixed pseudo-random pattern: block (r, c) of head h is on when a Philox word
            // of (r, c, h) falls under the density
            let cut = (density as f64 * 4_294_967_296.0) as u64;
            let dims = (1, self.heads, self.seq, self.seq);
            flash_attn_wgpu::BlockMask::from_fn(size, size, dims, |_, h, r, c| {
                let w = flash_attn_wgpu::dropout::philox4x32_10(
                    [r as u32, c as u32, h as u32, 0],
                    [0x5eed, 0],
                );
                (w[0] as u64) < cut
            })
        });
        if let Some(docs) = mods.doc_mask {
            // K equal documents (the last takes the remainder) as a user mask over captured
            // document ids, causal within each with --causal, and its block mask
            let (n, len) = (self.seq, self.seq.div_ceil(docs.max(1)));
            let ids: Vec<f32> = (0..n).map(|i| (i / len) as f32).collect();
            let src = if causal {
                "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool {
    return doc_id(i) == doc_id(j) && j <= i;
}"
            } else {
                "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool {
    return doc_id(i) == doc_id(j);
}"
            };
            let m = flash_attn_wgpu::MaskMod::wgsl_with(src, [("doc_id", ids)])
                .expect("the bench's document mask is valid");
            // on: some pair of the block in one document (and causal: j <= i); full: all
            let corners = |r: usize, c: usize| {
                let (i0, j0) = (r * 64, c * 64);
                (i0, (i0 + 63).min(n - 1), j0, (j0 + 63).min(n - 1))
            };
            let on = |r, c| {
                let (i0, i1, j0, j1) = corners(r, c);
                i0 / len <= j1 / len && j0 / len <= i1 / len && (!causal || j0 <= i1)
            };
            let full = |r, c| {
                let (i0, i1, j0, j1) = corners(r, c);
                let one = i0 / len == i1 / len && j0 / len == j1 / len && i0 / len == j0 / len;
                one && (!causal || j1 <= i0)
            };
            let dims = (1, 1, n, n);
            let mut bm = flash_attn_wgpu::BlockMask::from_fn(64, 64, dims, |_, _, r, c| on(r, c));
            let full = flash_attn_wgpu::BlockMask::from_fn(64, 64, dims, |_, _, r, c| full(r, c));
            bm.full = Some(full.blocks);
            cfg.block_mask = Some(bm);
            cfg.mask_mod = Some(m);
            cfg.causal = false;
        }
        if mods.causal_mask_mod && cfg.causal {
            let shift = cfg.seq_kv as i64 - cfg.seq_q as i64;
            let m = flash_attn_wgpu::MaskMod::wgsl(&format!(
                "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool {{ \
                 return i32(j) <= i32(i) + {shift}; }}"
            ))
            .expect("the bench's causal mask is valid");
            let (sq, skv) = (cfg.seq_q, cfg.seq_kv);
            // on: some pair with j <= i + shift; full: every pair
            let dims = (1, 1, sq, skv);
            let mut bm = flash_attn_wgpu::BlockMask::from_fn(64, 64, dims, |_, _, r, c| {
                (c * 64) as i64 <= ((r * 64 + 63).min(sq - 1)) as i64 + shift
            });
            let full = flash_attn_wgpu::BlockMask::from_fn(64, 64, dims, |_, _, r, c| {
                ((c * 64 + 63).min(skv - 1)) as i64 <= (r * 64) as i64 + shift
            });
            bm.full = Some(full.blocks);
            cfg.block_mask = Some(bm);
            cfg.mask_mod = Some(m);
            cfg.causal = false;
        }
        if mods.window_mask_mod && cfg.window.is_active() && !cfg.causal {
            let shift = cfg.seq_kv as i64 - cfg.seq_q as i64;
            let (lo, hi) = (
                cfg.window.left.map_or(i64::MIN / 4, |l| shift - l as i64),
                cfg.window.right.map_or(i64::MAX / 4, |r| shift + r as i64),
            );
            // the band as the user writes it: i + lo <= j <= i + hi (an unbounded side a
            // number no index difference reaches)
            let m = flash_attn_wgpu::MaskMod::wgsl(&format!(
                "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool {{ \
                 let d = i32(j) - i32(i); return d >= {} && d <= {}; }}",
                lo.max(-(1 << 30)),
                hi.min(1 << 30)
            ))
            .expect("the bench's window mask is valid");
            let (sq, skv) = (cfg.seq_q, cfg.seq_kv);
            let span = |r: usize, c: usize| {
                let (i0, i1) = ((r * 64) as i64, ((r * 64 + 63).min(sq - 1)) as i64);
                let (j0, j1) = ((c * 64) as i64, ((c * 64 + 63).min(skv - 1)) as i64);
                (j0 - i1, j1 - i0) // the least and the most j - i of the block
            };
            let dims = (1, 1, sq, skv);
            let mut bm = flash_attn_wgpu::BlockMask::from_fn(64, 64, dims, |_, _, r, c| {
                let (dmin, dmax) = span(r, c);
                dmax >= lo && dmin <= hi
            });
            let full = flash_attn_wgpu::BlockMask::from_fn(64, 64, dims, |_, _, r, c| {
                let (dmin, dmax) = span(r, c);
                dmin >= lo && dmax <= hi
            });
            bm.full = Some(full.blocks);
            cfg.block_mask = Some(bm);
            cfg.mask_mod = Some(m);
            cfg.window = flash_attn_wgpu::Window::new(None, None);
        }
        cfg.mask = mods.mask.map(|density| {
            // one fixed pseudo-random mask shared by the batches and heads: pair (i, j) is on
            // when a Philox word of (i, j) falls under the density
            let cut = (density as f64 * 4_294_967_296.0) as u64;
            let dims = (1, 1, cfg.seq_q, cfg.seq_kv);
            flash_attn_wgpu::BoolMask::from_fn(dims, |_, _, i, j| {
                let w = flash_attn_wgpu::dropout::philox4x32_10(
                    [i as u32, j as u32, 0, 1],
                    [0x5eed, 0],
                );
                (w[0] as u64) < cut
            })
        });
        cfg.bias = mods.bias.then(|| {
            // one bias per head, fixed pseudo-random values in [-2, 2) from Philox words of
            // (h, i, j), in the point's dtype, with d_bias
            let dims = (1, self.heads, cfg.seq_q, cfg.seq_kv);
            let value = |h: usize, i: usize, j: usize| {
                let w = flash_attn_wgpu::dropout::philox4x32_10(
                    [i as u32, j as u32, h as u32, 2],
                    [0x5eed, 0],
                );
                (w[0] >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
            };
            let bias = match dtype {
                DType::F32 => ScoreBias::from_fn(dims, |_, h, i, j| value(h, i, j)),
                DType::F16 => {
                    ScoreBias::from_fn(dims, |_, h, i, j| half::f16::from_f32(value(h, i, j)))
                }
                DType::BF16 => {
                    ScoreBias::from_fn(dims, |_, h, i, j| half::bf16::from_f32(value(h, i, j)))
                }
            };
            bias.expect("finite bias values").with_grad()
        });
        cfg.algorithm = alg;
        cfg
    }
}

/// The score modifiers of every point: --softcap, --alibi, --sinks, --kv-fill, --dropout,
/// --block-density, --varlen, --mask-density, --bias.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mods {
    pub softcap: Option<f32>,
    pub alibi: bool,
    pub sinks: bool,
    pub kv_fill: Option<f64>,
    pub dropout: Option<f32>,
    /// --block-density and --block-size
    pub blocks: Option<(f32, usize)>,
    /// --varlen
    pub varlen: bool,
    /// --mask-density
    pub mask: Option<f32>,
    /// --bias
    pub bias: bool,
    /// --score-mod-both: the softcap as a user score modifier
    pub user_softcap: bool,
    /// --doc-mask
    pub doc_mask: Option<usize>,
    /// --causal-mask-mod
    pub causal_mask_mod: bool,
    /// --window-mask-mod
    pub window_mask_mod: bool,
}

/// What to measure, resolved from the flags and checked before the GPU is touched.
pub struct Grid {
    /// Cheapest first: under a time budget, the points that do not fit are the largest.
    pub shapes: Vec<Shape>,
    /// f32 first, so that every half-precision point finds its f32 time (vs_f32).
    pub dtypes: Vec<DType>,
    /// Tiled first, so that every naive point finds its tiled time (speedup).
    pub algorithms: Vec<Algorithm>,
    /// The modifier bits compiled into pipelines for each measured build of a tiled point
    /// (`Context::set_compiled_flags`): the library's default, and with --compiled-both every
    /// bit as well.
    pub builds: Vec<u32>,
    /// The tiled algorithm's kernel variants, measured side by side; the first is the one
    /// naive points are compared with. Empty until `main` resolves the adapter's default.
    pub variants: Vec<Variant>,
    pub passes: Vec<Pass>,
    pub causals: Vec<bool>,
    /// The window of every point (none, or --window; with --window-both, none first).
    pub windows: Vec<Window>,
    /// --softcap, --alibi and --sinks, on every point.
    /// The modifiers of every point: none and the flags' (--mods-both), or the flags'.
    pub mods: Vec<Mods>,
    /// The head dimensions, in the order given.
    pub head_dims: Vec<usize>,
    /// Timed calls per point (at least 1).
    pub repeats: usize,
    pub naive_max_seq: Option<usize>,
    pub budget_s: Option<f64>,
    /// When the run began (`--budget-s` counts from here: the context's setup, the coop
    /// self-check and the roofline probe included, as a caller's deadline does).
    pub started: Instant,
}

impl Grid {
    pub fn from_args(a: &Args) -> Result<Self, String> {
        let dtypes = {
            let mut d = dedup(&a.dtype);
            d.sort_by_key(|&t| t != DType::F32);
            d
        };
        let algorithms: Vec<Algorithm> = {
            let mut v: Vec<Algorithm> = dedup(&a.algorithms)
                .into_iter()
                .map(|x| match x {
                    AlgArg::Tiled => Algorithm::Tiled,
                    AlgArg::Naive => Algorithm::Naive,
                })
                .collect();
            v.sort_by_key(|&x| x != Algorithm::Tiled);
            v
        };
        let passes = match a.pass {
            PassArg::Fwd => vec![Pass::Fwd],
            PassArg::Fwdbwd => vec![Pass::FwdBwd],
            PassArg::Both => vec![Pass::Fwd, Pass::FwdBwd],
        };
        let causals = if a.causal_both {
            vec![false, true]
        } else {
            vec![a.causal]
        };
        let windows = match (a.window, a.window_both) {
            (Some(w), true) => vec![Window::default(), w],
            (Some(w), false) => vec![w],
            (None, _) => vec![Window::default()],
        };
        let mods = Mods {
            softcap: a.softcap,
            alibi: a.alibi,
            sinks: a.sinks,
            kv_fill: a.kv_fill,
            dropout: a.dropout,
            blocks: a.block_density.map(|d| (d, a.block_size.max(1))),
            varlen: a.varlen,
            mask: a.mask_density,
            bias: a.bias,
            user_softcap: false,
            doc_mask: a.doc_mask,
            causal_mask_mod: a.causal_mask_mod,
            window_mask_mod: a.window_mask_mod,
        };
        let mods = if a.score_mod_both {
            vec![
                mods,
                Mods {
                    user_softcap: true,
                    ..mods
                },
            ]
        } else if a.mods_both {
            vec![Mods::default(), mods]
        } else {
            vec![mods]
        };
        let mut shapes = Vec::new();
        for &batch in &dedup(&a.batch) {
            for &heads in &dedup(&a.heads) {
                for &head_dim in &dedup(&a.head_dim) {
                    for &seq in &dedup(&a.seqs) {
                        let kv_heads = a.kv_heads.unwrap_or(heads);
                        let s = Shape {
                            batch,
                            heads,
                            kv_heads,
                            head_dim,
                            seq,
                        };
                        s.config(
                            false,
                            windows[windows.len() - 1],
                            &mods[mods.len() - 1],
                            Algorithm::Tiled,
                            DType::F32,
                        )
                        .validate()
                        .map_err(|e| {
                            format!(
                                "B={batch} H={heads} kv-heads={kv_heads} D={head_dim} N={seq}: {e}"
                            )
                        })?;
                        shapes.push(s);
                    }
                }
            }
        }
        shapes.sort_by_key(|s| s.batch * s.heads * s.head_dim * s.seq * s.seq);
        Ok(Grid {
            shapes,
            dtypes,
            algorithms,
            variants: Vec::new(),
            builds: if a.compiled_both {
                vec![flags::COMPILED, flags::parse("all")]
            } else {
                vec![flags::COMPILED]
            },
            passes,
            causals,
            windows,
            mods,
            head_dims: dedup(&a.head_dim),
            repeats: a.repeats.max(1),
            naive_max_seq: a.naive_max_seq,
            budget_s: a.budget_s,
            started: Instant::now(),
        })
    }
}

/// One measured (or skipped) point.
pub struct Record {
    pub algorithm: Algorithm,
    /// The tiled algorithm's kernel variant (None for the naive algorithm).
    pub variant: Option<Variant>,
    pub dtype: DType,
    pub pass: Pass,
    pub cfg: AttentionConfig,
    pub median_ms: Option<f64>,
    /// The fastest and slowest of the timed repeats.
    pub min_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub gflops: Option<f64>,
    pub bytes_allocated: Option<u64>,
    pub bytes_allocated_plan: Option<u64>,
    pub bytes_moved_model: f64,
    /// Naive time over tiled time of the same point (naive rows only).
    pub speedup: Option<f64>,
    /// This point's time over the f32 time of the same point (half dtypes only).
    pub vs_f32: Option<f64>,
    pub timestamps: Option<bool>,
    /// Median GPU milliseconds per kernel of this pass (empty without timestamps).
    pub kernels_ms: Vec<(&'static str, f64)>,
    pub note: String,
}

/// The records of a grid run, and how many points failed (their notes say why).
pub struct Outcome {
    pub records: Vec<Record>,
    pub failures: usize,
}

/// Measures every point of `grid` (each tiled point in each of `grid.variants`, over the tuning
/// `base`), progress on stderr, handing the records so far to `on_record` as each is made (the
/// newest last), so that a run killed part-way has written what it measured. Points predicted
/// to end past the budget (counted from `grid.started`) are recorded as skipped; points over a
/// device limit or failing are recorded with a note.
pub fn run(
    ctx: &Context,
    grid: &Grid,
    base: Tuning,
    mut on_record: impl FnMut(&[Record]),
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let repeats = grid.repeats;
    let need_bwd = grid.passes.contains(&Pass::FwdBwd);
    let naive_runs = |s: &Shape| grid.naive_max_seq.is_none_or(|m| s.seq <= m);
    let total_points: usize = grid
        .shapes
        .iter()
        .map(|s| {
            let algs: usize = grid
                .algorithms
                .iter()
                .map(|&x| match x {
                    Algorithm::Tiled => grid.variants.len(),
                    Algorithm::Naive => usize::from(naive_runs(s)),
                })
                .sum();
            grid.dtypes.len() * grid.causals.len() * grid.windows.len() * grid.mods.len() * algs
        })
        .sum();
    let started = grid.started;
    let mut records: Vec<Record> = Vec::new();
    let mut failures = 0usize;
    // Slowest throughput seen so far per (algorithm, variant, dtype), FLOP/s, for the budget
    // prediction.
    let mut slowest: HashMap<(Algorithm, Option<Variant>, DType), f64> = HashMap::new();
    let first_variant = *grid.variants.first().ok_or("no variant to measure")?;
    let mut point = 0;
    for (si, shape) in grid.shapes.iter().enumerate() {
        // Generated on first use, shared by every dtype, causal and algorithm of this shape.
        let mut host: Option<HostInputs> = None;
        for &dt in &grid.dtypes {
            // uploaded on first use, again where a point's layout differs (--varlen packs the
            // same elements as batch 1)
            let mut device: Option<([usize; 4], DeviceInputs)> = None;
            for (causal, window, mods) in grid.causals.iter().flat_map(|&c| {
                grid.windows
                    .iter()
                    .flat_map(move |&w| grid.mods.iter().map(move |m| (c, w, m)))
            }) {
                for (alg, variant) in grid.algorithms.iter().flat_map(|&alg| match alg {
                    Algorithm::Tiled => grid.variants.iter().map(|&v| (alg, Some(v))).collect(),
                    Algorithm::Naive => vec![(alg, None)],
                }) {
                    // the builds of a tiled point, measured call by call in turn
                    let builds = match alg {
                        Algorithm::Tiled => &grid.builds[..],
                        Algorithm::Naive => &grid.builds[..1],
                    };
                    if alg == Algorithm::Naive && !naive_runs(shape) {
                        continue;
                    }
                    point += 1;
                    let kernels = variant.unwrap_or(first_variant);
                    ctx.set_tuning(Tuning {
                        variant: kernels,
                        ..base
                    })?;
                    let tiles = ModelTiles::new(ctx, kernels, shape.head_dim)?;
                    let cfg = shape.config(causal, window, mods, alg, dt);
                    let heaviest = if need_bwd { Pass::FwdBwd } else { Pass::Fwd };
                    let elapsed = started.elapsed().as_secs_f64();
                    let predicted = slowest
                        .get(&(alg, variant, dt))
                        .map(|rate| (repeats + 1) as f64 * flops(&cfg, heaviest) / rate);
                    let what = format!(
                        "B={} H={} D={} N={} {dt} {} {}",
                        shape.batch,
                        shape.heads,
                        shape.head_dim,
                        shape.seq,
                        mask_label(&cfg),
                        alg_label(alg, variant),
                    );
                    eprintln!(
                        "[{point}/{total_points}] {elapsed:.0}s: {what}{}",
                        predicted.map_or(String::new(), |p| format!(" (predicted {p:.1}s)"))
                    );
                    let result = match (grid.budget_s, predicted) {
                        (Some(budget), Some(p)) if elapsed + p > budget => Err(format!(
                            "skipped: predicted {p:.1} s after {elapsed:.0} s passes --budget-s {budget}"
                        )),
                        (Some(budget), _) if elapsed > budget => Err(format!(
                            "skipped: {elapsed:.0} s passed --budget-s {budget}"
                        )),
                        _ => {
                            let measured = match &device {
                                Some((layout, x)) if *layout == cfg.q_shape() => {
                                    measure(ctx, &cfg, x, repeats, builds)
                                }
                                _ => {
                                    let h = host.get_or_insert_with(|| {
                                        HostInputs::random(&cfg, 0x5eed + si as u64)
                                    });
                                    upload(ctx, dt, h, &cfg, need_bwd).and_then(|x| {
                                        let m = measure(ctx, &cfg, &x, repeats, builds);
                                        device = Some((cfg.q_shape(), x));
                                        m
                                    })
                                }
                            };
                            measured.map_err(|e| match e {
                                Error::DeviceLimit {
                                    what,
                                    needed,
                                    limit,
                                    ..
                                } => format!("device limit: {what} needs {needed} B > {limit} B"),
                                e => {
                                    failures += 1;
                                    eprintln!("error: {what}: {e}");
                                    format!("FAILED: {e}")
                                }
                            })
                        }
                    };
                    if let Some(m) = result.as_ref().ok().and_then(|m| m.first()) {
                        let (ms, pass) = match m.fwdbwd {
                            Some((ms, _)) => (ms, Pass::FwdBwd),
                            None => (m.fwd_ms, Pass::Fwd),
                        };
                        let rate = flops(&cfg, pass) / (ms.median * 1e-3);
                        let e = slowest.entry((alg, variant, dt)).or_insert(rate);
                        *e = e.min(rate);
                    }
                    for (i, &build) in builds.iter().enumerate() {
                        let result = result.as_ref().map(|m| &m[i]).map_err(Clone::clone);
                        for &pass in &grid.passes {
                            let mut rec =
                                record(ctx, &cfg, variant, dt, pass, tiles, &result, &records)?;
                            if i > 0 {
                                rec.note =
                                    format!("compiled: {} {}", flags::names(build), rec.note);
                            }
                            records.push(rec);
                            on_record(&records);
                        }
                    }
                }
            }
        }
    }
    eprintln!(
        "measured {} records in {:.1} s",
        records.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(Outcome { records, failures })
}

/// The record of one pass of a measured (or skipped, or failed) point, with its speedup over
/// the tiled record and its ratio to the f32 record of the same point when those exist.
#[allow(clippy::too_many_arguments)]
fn record(
    ctx: &Context,
    cfg: &AttentionConfig,
    variant: Option<Variant>,
    dt: DType,
    pass: Pass,
    tiles: ModelTiles,
    result: &Result<&Measured, String>,
    earlier: &[Record],
) -> Result<Record, String> {
    let env = ctx.plan_env();
    // What the plans say the calls allocate: the forward's outputs and scratch; for fwdbwd
    // the larger of that and the forward's outputs (still held) plus the backward's.
    let plan_bytes = plan::forward(cfg, dt, &env).and_then(|f| match pass {
        Pass::Fwd => Ok(f.allocated_bytes()),
        Pass::FwdBwd => plan::backward(cfg, dt, &env).map(|b| {
            let fwd_outputs = f.output_bytes();
            f.allocated_bytes()
                .max(fwd_outputs.saturating_add(b.allocated_bytes()))
        }),
    });
    let mut rec = Record {
        algorithm: cfg.algorithm,
        variant,
        dtype: dt,
        pass,
        cfg: cfg.clone(),
        median_ms: None,
        min_ms: None,
        max_ms: None,
        gflops: None,
        bytes_allocated: None,
        bytes_allocated_plan: plan_bytes.ok(),
        bytes_moved_model: bytes_moved_model(cfg, dt, cfg.algorithm, pass, tiles),
        speedup: None,
        vs_f32: None,
        timestamps: None,
        kernels_ms: Vec::new(),
        note: String::new(),
    };
    match result {
        Ok(m) => {
            let (ms, alloc) = match pass {
                Pass::Fwd => (m.fwd_ms, m.fwd_alloc),
                Pass::FwdBwd => m.fwdbwd.ok_or("internal: backward not measured")?,
            };
            rec.median_ms = Some(ms.median);
            rec.min_ms = Some(ms.min);
            rec.max_ms = Some(ms.max);
            rec.gflops = Some(flops(cfg, pass) / (ms.median * 1e-3) / 1e9);
            rec.bytes_allocated = Some(alloc);
            rec.timestamps = Some(m.timestamps);
            rec.kernels_ms = m.fwd_kernels_ms.clone();
            if pass == Pass::FwdBwd {
                rec.kernels_ms.extend(m.bwd_kernels_ms.iter().copied());
            }
        }
        Err(note) => rec.note = note.clone(),
    }
    let same = |r: &&Record| {
        r.pass == pass
            && r.cfg.causal == cfg.causal
            && r.cfg.window == cfg.window
            && same_shape(&r.cfg, cfg)
    };
    if cfg.algorithm == Algorithm::Naive {
        let tiled = earlier
            .iter()
            .filter(same)
            .find(|r| r.algorithm == Algorithm::Tiled && r.dtype == dt);
        rec.speedup = ratio(rec.median_ms, tiled.and_then(|r| r.median_ms));
    }
    if dt != DType::F32 {
        let f32_rec = earlier.iter().filter(same).find(|r| {
            r.algorithm == cfg.algorithm && r.variant == variant && r.dtype == DType::F32
        });
        rec.vs_f32 = ratio(rec.median_ms, f32_rec.and_then(|r| r.median_ms));
    }
    Ok(rec)
}

fn same_shape(a: &AttentionConfig, b: &AttentionConfig) -> bool {
    (
        a.batch, a.seq_q, a.seq_kv, a.heads_q, a.heads_kv, a.head_dim,
    ) == (
        b.batch, b.seq_q, b.seq_kv, b.heads_q, b.heads_kv, b.head_dim,
    )
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    }
}

/// `v` without repeats, in first-seen order.
fn dedup<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for &x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}
