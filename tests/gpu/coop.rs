//! The coop family (the forward, dK/dV and dQ kernels' matrix products on cooperative
//! matrices) against the f64 reference, forward and backward, with the coop variant forced:
//! every modifier and mask, a user `score_mod` and `mask_mod`, GQA, odd lengths that are no
//! multiple of any tile, causal and not, dropout, the head dims the kernels take, and NaN
//! planted in key rows no query sees. Each case first checks that the plan runs the coop
//! kernels (not the blocks kernels they fall back to), so a pass is the coop kernels' pass.
//!
//! They run where the adapter offers cooperative matrices: lavapipe from Mesa 26 (8x8x8) in
//! the README test command's Mesa 26 tier (scripts/run-tests.sh), which sets
//! `FLASH_ATTN_EXPECT_COOP` so that an adapter without them fails there rather than skips;
//! elsewhere without them each test says so and passes (the errors module checks the typed
//! refusal). The kernels round P and dS to f16 before their products (`ROUNDED_P`).

use crate::common;

use common::backend::{bias_in, check_rounded_allowing, Gap, ROUNDED_P};
use common::{cfg, rounded_inputs};
use flash_attn_wgpu::unstable::kernels::{Kernel, Pass};
use flash_attn_wgpu::unstable::plan;
use flash_attn_wgpu::{
    AttentionConfig, BoolMask, Context, DType, HalfStorage, Tuning, Variant, Varlen, Window,
};

/// A context running the coop variant on native f16, or `None` (with the reason printed)
/// where the adapter offers no cooperative matrices and `FLASH_ATTN_EXPECT_COOP` is unset.
fn coop_ctx() -> Option<Context> {
    let ctx = Context::new().expect("context");
    let coop = Tuning {
        variant: Variant::Coop,
        half_storage: HalfStorage::Native,
        ..ctx.tuning()
    };
    match ctx.set_tuning(coop) {
        Ok(()) => Some(ctx),
        Err(e) if std::env::var_os("FLASH_ATTN_EXPECT_COOP").is_none() => {
            eprintln!("coop: skipped on {}: {e}", ctx.adapter_info().name);
            None
        }
        Err(e) => panic!("FLASH_ATTN_EXPECT_COOP is set and the coop variant is refused: {e}"),
    }
}

/// The plan of `c` in f16 runs the coop kernels: the forward's, and the backward's dK/dV and
/// dQ.
fn assert_planned_on_coop(ctx: &Context, c: &AttentionConfig) {
    let env = ctx.plan_env();
    let kernels = |p: plan::Plan| p.steps.iter().map(|s| s.key.kernel).collect::<Vec<_>>();
    let fwd = kernels(plan::forward(c, DType::F16, &env).expect("forward plan"));
    let bwd = kernels(plan::backward(c, DType::F16, &env).expect("backward plan"));
    for (pass, planned) in [(Pass::Forward, &fwd), (Pass::DkDv, &bwd), (Pass::Dq, &bwd)] {
        assert!(
            planned.contains(&Kernel::Flash(Variant::Coop, pass)),
            "{pass:?} is not planned on the coop kernels: {planned:?}"
        );
    }
}

/// One case in f16 on the coop kernels, with NaN planted in the k and v of `hidden` key rows
/// (batch, kv head, key) that no query row may read.
fn check_hiding(
    ctx: &Context,
    c: &AttentionConfig,
    amp: f32,
    hidden: &[(usize, usize, usize)],
    what: &str,
) {
    let c = &bias_in::<half::f16>(c);
    assert_planned_on_coop(ctx, c);
    let r = rounded_inputs::<half::f16>(c, amp);
    let (k, v) = common::nan_in_key_rows(c, &r, hidden);
    let msg = format!("coop: {what}");
    check_rounded_allowing(ctx, c, &r, (&k, &v), &msg, Gap::None, ROUNDED_P);
}

fn check(ctx: &Context, c: &AttentionConfig, amp: f32, what: &str) {
    check_hiding(ctx, c, amp, &[], what);
}

#[test]
fn the_coop_kernels_match_the_reference_at_odd_lengths_and_head_dims() {
    let Some(ctx) = coop_ctx() else { return };
    // odd lengths (no multiple of a tile or a fragment), GQA, causal and not, both ways of
    // seq_q against seq_kv; a head dim padded to whole fragments (3) and whole ones (64, 128;
    // 80, padded at 16 only, is the self-check's on a GPU)
    for (sq, skv, d, causal) in [
        (77, 61, 64, false),
        (61, 77, 64, true),
        (37, 45, 3, true),
        (33, 70, 128, true),
    ] {
        let c = cfg(2, sq, skv, 4, 2, d, causal);
        check(&ctx, &c, 1.0, &format!("{sq}x{skv} d={d} causal {causal}"));
    }
}

#[test]
fn the_coop_kernels_match_the_reference_with_every_modifier() {
    let Some(ctx) = coop_ctx() else { return };
    // a window, softcap, ALiBi per batch and head, sinks, key lengths (every key, none, a
    // random count: rows that see no key get the sink's lse) and dropout, causal, GQA
    let mut c = cfg(3, 77, 100, 4, 2, 32, true);
    c.window = Window::new(Some(30), Some(6));
    c.softcap = Some(1.5);
    c.alibi_slopes = Some(common::random_alibi(&c, true));
    c.sinks = Some(common::random_sinks(&c));
    c.seqlens_kv = Some(common::random_seqlens(&c));
    c.dropout = Some(common::random_dropout(0.3));
    check(
        &ctx,
        &c,
        2.0,
        "window, softcap, ALiBi, sinks, key lengths, dropout",
    );
    // a user score_mod after the built-in ones, and a block mask smaller than the tiles
    let mut c = cfg(2, 70, 90, 2, 1, 32, false);
    c.score_mod = Some(common::score_mods::rational());
    c.block_mask = Some(common::random_block_mask(&c, (7, 5), true, true, 0.6));
    check(&ctx, &c, 2.0, "user score_mod and a block mask");
    // a boolean mask per (batch, head) and an additive bias, over packed sequences of odd
    // lengths (one with no keys: its rows see nothing)
    let v = Varlen::from_lengths(&[37, 0, 21, 9], &[45, 13, 0, 30]);
    // (head dim 32: the pipelines of the hidden-rows test's boolean mask)
    let mut c = AttentionConfig::packed(v.cu_seqlens_q, v.cu_seqlens_kv, 2, 2, 32);
    c.causal = true;
    c.mask = Some(common::random_bool_mask(&c, false, true, 0.6, 1));
    check(&ctx, &c, 2.0, "boolean mask over packed sequences");
    let mut c = cfg(2, 40, 56, 2, 1, 16, false);
    c.bias = Some(common::random_bias(&c, true, true, 0.2, 1));
    check(&ctx, &c, 1.0, "additive bias and its gradient");
}

#[test]
fn the_coop_kernels_never_read_key_rows_no_query_sees() {
    let Some(ctx) = coop_ctx() else { return };
    // a user mask_mod (documents) hiding the second document's keys from the first's rows
    // and the reverse, key lengths, and a boolean mask: NaN in every key row no query row
    // of the head group sees, causal and not; the results must equal the reference over the
    // clean inputs
    for causal in [false, true] {
        let mut c = cfg(2, 40, 40, 2, 1, 32, causal);
        let ids: Vec<f32> = (0..40).map(|j| if j < 19 { 0.0 } else { 1.0 }).collect();
        c.mask_mod = Some(common::score_mods::documents(ids));
        // key lengths 25 and 33: keys past them are hidden from every row
        c.seqlens_kv = Some(vec![25, 33]);
        let hidden: Vec<(usize, usize, usize)> = (0..2)
            .flat_map(|b| {
                let len = [25, 33][b];
                (len..40).map(move |j| (b, 0, j))
            })
            .collect();
        check_hiding(
            &ctx,
            &c,
            1.0,
            &hidden,
            &format!("mask_mod and key lengths, causal {causal}"),
        );

        let mut c = cfg(1, 30, 50, 2, 2, 32, causal);
        c.mask = Some(BoolMask::from_fn((1, 2, 30, 50), |_, _, _, j| {
            ![7, 31, 49].contains(&j)
        }));
        let hidden: Vec<(usize, usize, usize)> = (0..2)
            .flat_map(|hk| [7, 31, 49].map(|j| (0, hk, j)))
            .collect();
        check_hiding(
            &ctx,
            &c,
            1.0,
            &hidden,
            &format!("boolean mask, causal {causal}"),
        );
    }
}
