//! The additive bias (issue 12, item 4): forward and backward, `d_bias` summed over the
//! dimensions it broadcasts, every variant and the naive path, every dtype, with every other
//! score modifier, over packed sequences and split calls, and the typed errors of bad biases.

use crate::common;
use common::{cfg, check_backward, check_dtype_dyn};
use flash_attn_wgpu::{
    unstable::reference, Algorithm, AttentionConfig, Context, DType, Error, ScoreBias, Tuning,
    Variant, Varlen, Window,
};

/// Forward and backward (with d_bias where the bias asks for it) of every variant in every
/// dtype, and of the naive path, against the reference: `check_case` rounds the bias to each
/// dtype and compares d_bias.
fn every_variant_and_dtype(c: &AttentionConfig, amp: f32) {
    // A context of its own: tuning is per context and other test binaries share theirs.
    let ctx = Context::new().expect("context");
    let base = ctx.tuning();
    for variant in Variant::ALL {
        ctx.set_tuning(Tuning {
            variant,
            rows_subgroup: 0,
            ..base
        })
        .unwrap();
        for dtype in DType::ALL {
            check_dtype_dyn(&ctx, dtype, c, amp, &format!("{variant:?}"));
        }
    }
    if base.rows_subgroup != 0 {
        ctx.set_tuning(Tuning {
            variant: Variant::Rows,
            ..base
        })
        .unwrap();
        check_dtype_dyn(&ctx, DType::F32, c, amp, "rows with subgroups");
    }
    ctx.set_tuning(base).unwrap();
    let mut naive = c.clone();
    naive.algorithm = Algorithm::Naive;
    for dtype in DType::ALL {
        check_dtype_dyn(&ctx, dtype, &naive, amp, "naive");
    }
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn a_bias_per_batch_and_head_matches_the_reference_everywhere() {
    // Causal, GQA, odd sizes; a tenth of the entries -inf (hidden pairs) and one row of every
    // grid all -inf (out 0, lse -inf, d_bias 0 there).
    let mut c = cfg(2, 45, 61, 4, 2, 32, true);
    c.bias = Some(common::random_bias(&c, true, true, 0.1, 1));
    every_variant_and_dtype(&c, 2.0);
}

#[test]
fn broadcast_biases_sum_their_gradient_over_the_broadcast_dimensions() {
    // Shared by batches, by heads, and by both: d_bias sums every slice the entry reaches.
    for (per_batch, per_head) in [(false, true), (true, false), (false, false)] {
        let mut c = cfg(3, 33, 40, 3, 1, 16, false);
        c.bias = Some(common::random_bias(&c, per_batch, per_head, 0.05, 0));
        check_backward(&c, 2.0);
    }
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn a_bias_composes_with_every_other_modifier() {
    // A window, softcap (the bias is added after it, so the softcap's slope must leave the
    // bias out), ALiBi, sinks, dropout, key lengths, a block mask and a boolean mask, at once.
    let mut c = cfg(2, 70, 90, 2, 1, 16, false);
    c.window = Window::new(Some(60), Some(20));
    c.softcap = Some(2.5);
    c.alibi_slopes = Some(common::random_alibi(&c, true));
    c.sinks = Some(common::random_sinks(&c));
    c.dropout = Some(common::random_dropout(0.25));
    c.seqlens_kv = Some(common::random_seqlens(&c));
    c.block_mask = Some(common::random_block_mask(&c, (24, 40), false, true, 0.8));
    c.mask = Some(common::random_bool_mask(&c, true, false, 0.8, 1));
    c.bias = Some(common::random_bias(&c, false, true, 0.05, 1));
    every_variant_and_dtype(&c, 2.0);
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn a_bias_over_packed_sequences_indexes_the_packed_rows_and_keys() {
    let v = Varlen::from_lengths(&[37, 0, 21, 9], &[45, 13, 30, 0]);
    let mut c = AttentionConfig::packed(v.cu_seqlens_q, v.cu_seqlens_kv, 2, 2, 24);
    c.causal = true;
    c.bias = Some(common::random_bias(&c, false, true, 0.05, 0));
    check_backward(&c, 2.0);
    let ctx = common::ctx();
    for dtype in [DType::F16, DType::BF16] {
        check_dtype_dyn(ctx, dtype, &c, 2.0, "packed");
    }
}

#[test]
fn without_grad_the_backward_returns_no_d_bias_and_the_same_gradients() {
    let mut c = cfg(1, 20, 24, 2, 2, 8, true);
    let with = common::random_bias(&c, true, true, 0.0, 0);
    let mut without = with.clone();
    without.grad = false;
    c.bias = Some(without);
    let data = common::inputs(&c, 1.0);
    let ctx = common::ctx();
    let f = ctx.forward_host(&c, &data.q, &data.k, &data.v).unwrap();
    let g = ctx
        .backward_host(&c, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out)
        .unwrap();
    assert!(g.d_bias.is_none());
    c.bias = Some(with);
    let g2 = ctx
        .backward_host(&c, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out)
        .unwrap();
    assert_eq!((g.dq, g.dk, g.dv), (g2.dq, g2.dk, g2.dv));
    let want = reference::backward(&c, &data.q, &data.k, &data.v, &data.d_out);
    let msg = common::describe(&c, data.seed);
    common::assert_close(
        "d_bias",
        g2.d_bias.as_ref().unwrap(),
        want.d_bias.as_ref().unwrap(),
        &msg,
    );
}

#[test]
fn bad_biases_are_typed_errors_that_name_the_bias() {
    let c = cfg(2, 10, 7, 4, 2, 8, false);
    let ctx = common::ctx();
    let x = vec![0.5f32; 2 * 10 * 4 * 8];
    let kv = vec![0.5f32; 2 * 7 * 2 * 8];
    for (bias, want) in [
        (
            ScoreBias::new((3, 1, 10, 7), &vec![0.0f32; 210]).unwrap(),
            "bias.batch must be 1 (broadcast) or the call's batch = 2, got 3",
        ),
        (
            ScoreBias::new((1, 2, 10, 7), &vec![0.0f32; 140]).unwrap(),
            "bias.heads must be 1 (broadcast) or the call's heads_q = 4, got 2",
        ),
        (
            ScoreBias::new((1, 1, 9, 7), &vec![0.0f32; 63]).unwrap(),
            "bias.seq_q must be the call's seq_q = 10",
        ),
        (
            ScoreBias::new((1, 1, 10, 8), &vec![0.0f32; 80]).unwrap(),
            "bias.seq_kv must be the call's seq_kv = 7",
        ),
    ] {
        let mut cb = c.clone();
        cb.bias = Some(bias);
        match ctx.forward_host(&cb, &x, &kv, &kv) {
            Err(Error::InvalidConfig(m)) => assert!(m.contains(want), "{m}"),
            other => panic!("expected InvalidConfig naming the bias, got {other:?}"),
        }
    }
    // entries: their count, NaN and +inf
    assert!(matches!(
        ScoreBias::new((1, 1, 10, 7), &[0.0f32; 69]),
        Err(Error::InvalidConfig(m)) if m.contains("= 70 values, got 69")
    ));
    assert!(matches!(
        ScoreBias::new((1, 1, 1, 2), &[0.0f32, f32::NAN]),
        Err(Error::InvalidConfig(m)) if m.contains("finite or -inf") && m.contains("index 1")
    ));
    assert!(ScoreBias::new((1, 1, 1, 2), &[half::f16::INFINITY, half::f16::ZERO]).is_err());
    // a bias in another dtype than the inputs'
    let mut cb = c.clone();
    cb.bias = Some(ScoreBias::new((1, 1, 10, 7), &[half::bf16::ONE; 70]).unwrap());
    match ctx.forward_host(&cb, &x, &kv, &kv) {
        Err(Error::DType {
            tensor,
            expected: DType::F32,
            got: DType::BF16,
        }) => assert_eq!(tensor, "bias"),
        other => panic!("expected a DType error naming the bias, got {other:?}"),
    }
}
