//! The forward plan: one tiled dispatch, or the naive path's three kernels per chunk.

use super::route::{self, Route};
use super::step::{key, tiled_step};
use super::{decode, split, BufRef, OutputSpec, Plan, PlanEnv, ScratchSpec, Step};
use crate::config::AttentionConfig;
use crate::dtype::DType;
use crate::error::{Result, TensorRole};
use crate::kernels::wgsl::ELEMENTWISE_WORKGROUP;
use crate::kernels::{Kernel, Params, Tiles};

use BufRef::{Input, Output, Scratch};

/// Plans `out, lse = attention(q, k, v)`. Inputs: q, k, v. Outputs: out (dtype), lse (f32).
/// The route first ([`route::forward`]), then its steps.
pub fn forward(cfg: &AttentionConfig, dtype: DType, env: &PlanEnv) -> Result<Plan> {
    let route = route::forward(cfg, dtype, env)?;
    let mut plan = Plan {
        inputs: vec![TensorRole::Q, TensorRole::K, TensorRole::V],
        outputs: vec![
            OutputSpec {
                role: TensorRole::Out,
                shape: cfg.out_shape().to_vec(),
                dtype,
            },
            OutputSpec {
                role: TensorRole::Lse,
                shape: cfg.lse_shape().to_vec(),
                dtype: DType::F32,
            },
        ],
        scratch: Vec::new(),
        steps: Vec::new(),
        extras: Vec::new(),
        pairs: Vec::new(),
        kept_grads: None,
        copies: Vec::new(),
    };
    match route {
        Route::Decode { batches, shape } => {
            decode::steps(cfg, dtype, env, (&batches, shape), &mut plan)?
        }
        Route::Tiled(passes) => plan.steps.push(tiled_step(
            passes[0],
            (cfg, cfg),
            dtype,
            env,
            vec![Input(0), Input(1), Input(2), Output(0), Output(1)],
        )),
        Route::Split(s, passes) => {
            split::forward_steps(cfg, dtype, env, (s, passes[0]), &mut plan)?
        }
        Route::Naive { chunk } => {
            let slices = cfg.batch * cfg.heads_q;
            let chunk_bytes = (chunk * cfg.seq_q * cfg.seq_kv) as u64 * 4;
            plan.scratch = vec![
                ScratchSpec {
                    label: "naive scores",
                    bytes: chunk_bytes,
                },
                ScratchSpec {
                    label: "naive probs",
                    bytes: chunk_bytes,
                },
            ];
            let base = Params::from_config(cfg);
            let k = |kernel| key(kernel, cfg, Tiles::ONE, dtype, env);
            for first in (0..slices).step_by(chunk) {
                let count = chunk.min(slices - first);
                let rows = count * cfg.seq_q;
                let with = |items: usize, wg: usize| Params {
                    slice_base: first as u32,
                    slice_count: count as u32,
                    total_items: items as u32,
                    total_wg: wg as u32,
                    ..base
                };
                let n_scores = rows * cfg.seq_kv;
                let n_out = rows * cfg.dv();
                plan.steps.extend([
                    Step {
                        key: k(Kernel::NaiveScores),
                        params: with(n_scores, n_scores.div_ceil(ELEMENTWISE_WORKGROUP as usize)),
                        buffers: vec![Input(0), Input(1), Scratch(0)],
                        windows: Vec::new(),
                        workgroups: n_scores.div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
                    },
                    Step {
                        key: k(Kernel::NaiveSoftmax),
                        params: with(rows, rows),
                        buffers: vec![Scratch(0), Scratch(1), Output(1)],
                        windows: Vec::new(),
                        workgroups: rows as u32,
                    },
                    Step {
                        key: k(Kernel::NaivePv),
                        params: with(n_out, n_out.div_ceil(ELEMENTWISE_WORKGROUP as usize)),
                        buffers: vec![Scratch(1), Input(2), Output(0)],
                        windows: Vec::new(),
                        workgroups: n_out.div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
                    },
                ]);
            }
        }
    }
    plan.attach_extras(cfg)?;
    super::block::apply(&mut plan, cfg);
    Ok(plan)
}
