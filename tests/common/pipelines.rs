//! Which pipelines a call compiles, read from the planner, so that a property test can draw
//! fresh cases and still compile the same pipeline set every run (issue 46): each case is
//! drawn for a fixed slot (the choices that decide pipelines: algorithm, variant, dtype, head
//! dim, compiled-in modifiers) and redrawn until its pipelines are exactly those of the
//! slot's fixed case. scripts/pipeline-count.sh counts the suite's set against its budget; on
//! lavapipe a pipeline is seconds of LLVM, and a set that moved with the draws made the count
//! (and the time) move with them.

use std::collections::HashSet;

use flash_attn_wgpu::unstable::{kernels::KernelKey, plan};
use flash_attn_wgpu::{AttentionConfig, Context, DType, Tuning, Variant};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};

/// The kernel keys of `cfg`'s forward and backward plans in `dtype` on `ctx`, with the tuning
/// it has now (a plan that fails adds none: the call fails before it compiles anything).
/// A bias is taken in the call's dtype, as `backend::check_case` casts it.
pub fn keys(ctx: &Context, cfg: &AttentionConfig, dtype: DType) -> HashSet<KernelKey> {
    let mut cfg = cfg.clone();
    if let Some(b) = &cfg.bias {
        cfg.bias = Some(
            match dtype {
                DType::F32 => b.cast::<f32>(),
                DType::F16 => b.cast::<half::f16>(),
                DType::BF16 => b.cast::<half::bf16>(),
            }
            .expect("a test's bias is finite or -inf"),
        );
    }
    let env = ctx.plan_env();
    [
        plan::forward(&cfg, dtype, &env),
        plan::backward(&cfg, dtype, &env),
    ]
    .into_iter()
    .flatten()
    .flat_map(|p| p.steps.into_iter().map(|s| s.key))
    .collect()
}

/// One property case for a slot: `ctx`'s variant set to the slot's (a context of the test's
/// own, not the shared one: `common::ctx`), a case drawn by `strategy`
/// and redrawn until its pipelines (its config by `cfg_of`) are those of the slot's `fixed`
/// config in the slot's `dtype`, then `test` on it. A failure panics with `slot` and
/// proptest's minimal case.
pub fn run_slot<S: Strategy>(
    ctx: &Context,
    (variant, fixed, dtype): (Variant, &AttentionConfig, DType),
    strategy: S,
    cfg_of: impl Fn(&S::Value) -> &AttentionConfig,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
    slot: &str,
) {
    ctx.set_tuning(Tuning {
        variant,
        ..ctx.tuning()
    })
    .unwrap();
    // the slot's pipelines, planned once for all its draws
    let want = keys(ctx, fixed, dtype);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 1,
        ..ProptestConfig::default()
    });
    let r = runner.run(&strategy, |case| {
        prop_assume!(keys(ctx, cfg_of(&case), dtype) == want);
        test(case)
    });
    if let Err(e) = r {
        panic!("{slot}: {e}");
    }
}
