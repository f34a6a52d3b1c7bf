//! The backward plan: the delta preprocess, then dK/dV and dQ (tiled), or the naive path's
//! five kernels per chunk.

use super::route::{self, Route};
use super::step::{key, tiled_step, TiledPass};
use super::{split, BufRef, OutputSpec, Plan, PlanEnv, ScratchSpec, Step};
use crate::config::AttentionConfig;
use crate::dtype::DType;
use crate::error::{Result, TensorRole};
use crate::kernels::wgsl::{ELEMENTWISE_WORKGROUP, TABLE_SUM_ENTRIES};
use crate::kernels::{Kernel, Params, Tiles};

use super::backward_buffers::{DK, DQ, DV, D_OUT, D_SINKS, K, LSE, LSE_DELTA, OUT, Q, V};
use BufRef::{Output, Scratch};

/// Plans `dq, dk, dv` (and, with sinks, `d_sinks`; with a bias that asks for it, `d_bias`;
/// with a trainable captured tensor, `d_table`) from q, k, v, out, lse (f32) and d_out. dq,
/// dk, dv and d_bias take the inputs' dtype; d_sinks and d_table are f32.
pub fn backward(cfg: &AttentionConfig, dtype: DType, env: &PlanEnv) -> Result<Plan> {
    let route = route::backward(cfg, dtype, env)?;
    let mut plan = passes(cfg, dtype, env, route)?;
    if cfg.sinks.is_some() {
        plan.outputs.push(OutputSpec {
            role: TensorRole::DSinks,
            shape: vec![cfg.heads_q],
            dtype: DType::F32,
        });
        // lse and delta whole: one workgroup per query head sums its rows over every batch
        let mut params = Params::from_config(cfg);
        params.total_wg = cfg.heads_q as u32;
        plan.steps.push(Step {
            key: key(Kernel::FlashBwdSinks, cfg, Tiles::ONE, dtype, env),
            params,
            buffers: vec![LSE_DELTA, D_SINKS],
            windows: Vec::new(),
            workgroups: cfg.heads_q as u32,
        });
    }
    kept_steps(&mut plan, cfg, dtype, env);
    plan.attach_extras(cfg)?;
    super::block::apply(&mut plan, cfg);
    Ok(plan)
}

/// d_bias and d_table, where the call asks for them: the scratch the keeping kernels fill and
/// the steps that sum it.
fn kept_steps(plan: &mut Plan, cfg: &AttentionConfig, dtype: DType, env: &PlanEnv) {
    let table = cfg
        .score_mod
        .as_ref()
        .and_then(|m| Some((m.trainable_parts()?, m)));
    let bias = cfg.bias.as_ref().filter(|b| b.grad);
    if bias.is_none() && table.is_none() {
        return;
    }
    let len = table.map_or(0, |(t, m)| m.captured()[t.index].1.len());
    // a tensor of a few entries is summed by the tiled dQ kernels as they go (a part per
    // workgroup); a longer one, or on the naive path, from every pair's gradient and score
    // kept in the scratch (`Kernel::FlashBwdTable`)
    let summed = table.is_some()
        && len <= TABLE_SUM_ENTRIES
        && plan
            .steps
            .iter()
            .filter(|s| s.key.kernel.keeps_grads())
            .all(|s| s.key.kernel.sums_table());
    let kept_scores = table.is_some() && !summed;
    // words a pair of the scratch [batch, heads_q, seq_q, seq_kv]: the gradient at the
    // finished score (d_bias, and d_table from kept pairs), and for d_table from kept pairs the
    // score score_mod took beside it
    let pair_words: u64 = if kept_scores {
        2
    } else {
        bias.is_some() as u64
    };
    let pairs = [cfg.batch, cfg.heads_q, cfg.seq_q, cfg.seq_kv]
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .unwrap_or(u64::MAX);
    let pair_part = pairs.saturating_mul(pair_words);
    // the dQ kernels' parts follow the pairs' words, a part per workgroup of each dQ step
    let mut parts = 0u32;
    for s in &mut plan.steps {
        s.key.keeps_grads = pair_words > 0 && s.key.kernel.keeps_grads();
        if let (true, Some((t, _))) = (summed && s.key.kernel.sums_table(), table) {
            s.key.sums_table = true;
            s.key.user_code = t.with_partial(s.key.user_code);
            s.params.total_items = len as u32;
            s.params.splits = parts;
            s.params.slice_base = pair_part as u32;
            parts += s.params.total_wg;
        }
    }
    let grads = plan.scratch.len();
    plan.scratch.push(ScratchSpec {
        label: match (kept_scores, summed) {
            (true, _) => "kept gradients and scores (f32, 2 x batch x heads_q x seq_q x seq_kv)",
            (false, true) if bias.is_some() => {
                "bias gradients (f32, batch x heads_q x seq_q x seq_kv), then the trainable \
                 tensor's gradient in parts (f32, dQ workgroups x entries)"
            }
            (false, true) => "trainable tensor's gradient in parts (f32, dQ workgroups x entries)",
            (false, false) => "bias gradients (f32, batch x heads_q x seq_q x seq_kv)",
        },
        bytes: pair_part
            .saturating_add(parts as u64 * len as u64)
            .saturating_mul(4),
    });
    plan.kept_grads = Some(grads);
    if let Some(bias) = bias {
        // one invocation per bias entry sums the slices it reaches into d_bias
        let d_bias = Output(plan.outputs.len());
        plan.outputs.push(OutputSpec {
            role: TensorRole::DBias,
            shape: bias.shape().to_vec(),
            dtype,
        });
        let mut params = Params::from_config(cfg);
        params.total_items = bias.len() as u32;
        plan.steps.push(Step {
            key: key(Kernel::FlashBwdBias, cfg, Tiles::ONE, dtype, env),
            params,
            buffers: vec![Scratch(grads), d_bias],
            windows: Vec::new(),
            workgroups: bias.len().div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
        });
    }
    if let Some((t, _)) = table {
        // the parts to add, in order: where, how many, from which word
        let (parts_buf, parts, first) = if summed {
            (grads, parts as usize, pair_part)
        } else {
            let (buf, n) = table_steps(plan, cfg, env, (t, len), grads);
            (buf, n, 0)
        };
        let d_table = Output(plan.outputs.len());
        plan.outputs.push(OutputSpec {
            role: TensorRole::DTable,
            shape: vec![len],
            dtype: DType::F32,
        });
        let mut params = Params::from_config(cfg);
        params.total_items = len as u32;
        params.splits = parts as u32;
        params.slice_base = first as u32;
        plan.steps.push(Step {
            key: key(Kernel::FlashBwdTableSum, cfg, Tiles::ONE, DType::F32, env),
            params,
            buffers: vec![Scratch(parts_buf), d_table],
            windows: Vec::new(),
            workgroups: len.div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
        });
    }
    // every step that binds the scratch reads its words a pair (`KEPT_WORDS`)
    for s in &mut plan.steps {
        s.key.keeps_scores = kept_scores && (s.key.keeps_grads || s.key.kernel.reads_kept_grads());
    }
}

/// Pairs a workgroup of the trainable tensor's gradient sums at most: with fewer, up to
/// `TABLE_PARTS` parts (a fixed count for a shape, so the sums' order is too).
const TABLE_PAIRS_PER_PART: usize = 4096;
/// Parts of a trainable tensor's gradient at most, and their words at most in all.
const TABLE_PARTS: usize = 256;
const TABLE_PART_WORDS: usize = 1 << 22;
/// Entries a workgroup holds (`SLAB` in shaders/flash_bwd_table.wgsl).
const TABLE_SLAB: usize = 2048;

/// d_table from the kept pairs: a part per workgroup of the pairs into each slab of entries
/// (`Kernel::FlashBwdTable`, which runs `score_mod_dt` on the kept gradient and score of each
/// pair), into a parts buffer: returns it and its parts (`Kernel::FlashBwdTableSum` then adds
/// them in order).
fn table_steps(
    plan: &mut Plan,
    cfg: &AttentionConfig,
    env: &PlanEnv,
    (table, len): (&crate::modifiers::score_mod::Trainable, usize),
    grads: usize,
) -> (usize, usize) {
    let pairs = cfg.batch * cfg.heads_q * cfg.seq_q * cfg.seq_kv;
    let parts = pairs
        .div_ceil(TABLE_PAIRS_PER_PART)
        .min(TABLE_PARTS)
        .min((TABLE_PART_WORDS / len).max(1))
        .max(1);
    let per_part = pairs.div_ceil(parts).next_multiple_of(64);
    let slabs = len.div_ceil(TABLE_SLAB);
    let parts_buf = plan.scratch.len();
    plan.scratch.push(ScratchSpec {
        label: "trainable tensor's gradient in parts (f32, parts x entries)",
        bytes: (parts * len * 4) as u64,
    });
    let mut params = Params::from_config(cfg);
    params.total_items = len as u32;
    params.splits = parts as u32;
    params.split_keys = per_part as u32;
    params.total_wg = (parts * slabs) as u32;
    let mut k = key(Kernel::FlashBwdTable, cfg, Tiles::ONE, DType::F32, env);
    // this kernel's pipelines take the derivative in the tensor
    k.user_code = table.with_partial(k.user_code);
    plan.steps.push(Step {
        key: k,
        params,
        buffers: vec![Scratch(grads), Scratch(parts_buf)],
        windows: Vec::new(),
        workgroups: params.total_wg,
    });
    (parts_buf, parts)
}

/// The preprocess (delta) and the dq, dk, dv passes, on the route's path.
fn passes(cfg: &AttentionConfig, dtype: DType, env: &PlanEnv, route: Route) -> Result<Plan> {
    let mut plan = Plan {
        inputs: vec![
            TensorRole::Q,
            TensorRole::K,
            TensorRole::V,
            TensorRole::Out,
            TensorRole::Lse,
            TensorRole::DOut,
        ],
        outputs: vec![
            OutputSpec {
                role: TensorRole::Dq,
                shape: cfg.q_shape().to_vec(),
                dtype,
            },
            OutputSpec {
                role: TensorRole::Dk,
                shape: cfg.kv_shape().to_vec(),
                dtype,
            },
            OutputSpec {
                role: TensorRole::Dv,
                shape: cfg.v_shape().to_vec(),
                dtype,
            },
        ],
        scratch: vec![ScratchSpec {
            label: "lse and delta",
            bytes: cfg.lse_len() as u64 * 8,
        }],
        steps: Vec::new(),
        extras: Vec::new(),
        pairs: Vec::new(),
        kept_grads: None,
        copies: Vec::new(),
    };
    let preprocess = |plan: &mut Plan| {
        let rows = cfg.lse_len();
        let mut pre = Params::from_config(cfg);
        pre.total_items = rows as u32;
        plan.steps.push(Step {
            key: key(Kernel::FlashBwdPreprocess, cfg, Tiles::ONE, dtype, env),
            params: pre,
            buffers: vec![OUT, D_OUT, LSE, LSE_DELTA],
            windows: Vec::new(),
            workgroups: rows.div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
        });
    };
    match route {
        Route::Split(s, passes) => split::backward_steps(cfg, dtype, env, (s, &passes), &mut plan)?,
        Route::Tiled(passes) => {
            preprocess(&mut plan);
            tiled(cfg, dtype, env, &passes, &mut plan);
        }
        Route::Naive { chunk } => {
            preprocess(&mut plan);
            naive_steps(cfg, dtype, env, chunk, &mut plan);
        }
        Route::Decode { .. } => {
            return Err(crate::Error::Device(
                "internal: a decode route for a backward".into(),
            ))
        }
    }
    Ok(plan)
}

/// dK/dV, then dQ (the route's two passes).
fn tiled(
    cfg: &AttentionConfig,
    dtype: DType,
    env: &PlanEnv,
    passes: &[TiledPass],
    plan: &mut Plan,
) {
    let (dkdv, dq) = (passes[0], passes[1]);
    let dkdv_buffers = vec![Q, K, V, D_OUT, LSE_DELTA, DK, DV];
    plan.steps
        .push(tiled_step(dkdv, (cfg, cfg), dtype, env, dkdv_buffers));
    let dq_buffers = vec![Q, K, V, D_OUT, LSE_DELTA, DQ];
    plan.steps
        .push(tiled_step(dq, (cfg, cfg), dtype, env, dq_buffers));
}

/// The naive path's five kernels per chunk of `chunk` slices (whole GQA groups: the route's).
fn naive_steps(cfg: &AttentionConfig, dtype: DType, env: &PlanEnv, chunk: usize, plan: &mut Plan) {
    let group = cfg.group();
    let slices = cfg.batch * cfg.heads_q;
    let chunk_bytes = (chunk * cfg.seq_q * cfg.seq_kv) as u64 * 4;
    plan.scratch.push(ScratchSpec {
        label: "naive probs",
        bytes: chunk_bytes,
    });
    plan.scratch.push(ScratchSpec {
        label: "naive dP / dS",
        bytes: chunk_bytes,
    });
    let (probs, ds) = (Scratch(1), Scratch(2));
    let base = Params::from_config(cfg);
    for first in (0..slices).step_by(chunk) {
        let count = chunk.min(slices - first);
        let n_scores = count * cfg.seq_q * cfg.seq_kv;
        let mut push = |kernel, items: usize, buffers| {
            plan.steps.push(Step {
                key: key(kernel, cfg, Tiles::ONE, dtype, env),
                params: Params {
                    slice_base: first as u32,
                    slice_count: count as u32,
                    total_items: items as u32,
                    ..base
                },
                buffers,
                windows: Vec::new(),
                workgroups: items.div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
            })
        };
        push(Kernel::NaiveBwdProbs, n_scores, vec![Q, K, LSE, probs]);
        push(Kernel::NaiveBwdDp, n_scores, vec![D_OUT, V, ds]);
        push(
            Kernel::NaiveBwdDs,
            n_scores,
            vec![probs, LSE_DELTA, ds, Q, K],
        );
        push(
            Kernel::NaiveBwdDkDv,
            // one item per (dK, dV) element pair: the wider of the two rows
            (count / group) * cfg.seq_kv * cfg.head_dim.max(cfg.dv()),
            vec![probs, ds, Q, D_OUT, DK, DV],
        );
        push(
            Kernel::NaiveBwdDq,
            count * cfg.seq_q * cfg.head_dim,
            vec![ds, K, DQ],
        );
    }
}
