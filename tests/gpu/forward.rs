//! The forward pass of both algorithms matches the f64 reference.

use crate::common;
use common::{cfg, check_forward};

#[test]
fn single_query_and_single_key() {
    check_forward(&cfg(1, 1, 1, 1, 1, 16, false), 1.0);
}

#[test]
fn odd_lengths_match_reference() {
    for s in [17, 113, 203] {
        check_forward(&cfg(1, s, s, 2, 2, 64, false), 1.0);
    }
}

#[test]
fn causal_odd_lengths_match_reference() {
    for s in [1, 17, 113, 203] {
        check_forward(&cfg(1, s, s, 2, 2, 64, true), 1.0);
    }
}

#[test]
fn long_sequence_1000_matches_reference() {
    check_forward(&cfg(1, 1000, 1000, 1, 1, 64, false), 1.0);
    check_forward(&cfg(1, 1000, 1000, 1, 1, 32, true), 1.0);
}

#[test]
fn more_queries_than_keys() {
    check_forward(&cfg(1, 203, 17, 2, 2, 32, false), 1.0);
    check_forward(&cfg(1, 203, 17, 2, 2, 32, true), 1.0);
}

#[test]
fn more_keys_than_queries() {
    check_forward(&cfg(1, 17, 203, 2, 2, 32, false), 1.0);
    check_forward(&cfg(1, 17, 203, 2, 2, 32, true), 1.0);
}

#[test]
fn rows_with_no_visible_key_give_zero_and_neg_inf_lse() {
    // Bottom-right causal with seq_q > seq_kv: the first seq_q - seq_kv rows see nothing.
    check_forward(&cfg(2, 40, 9, 2, 1, 16, true), 1.0);
}

#[test]
fn grouped_query_attention() {
    check_forward(&cfg(2, 113, 113, 8, 2, 64, false), 1.0);
    check_forward(&cfg(1, 113, 77, 6, 3, 32, true), 1.0);
}

#[test]
fn multi_query_attention() {
    check_forward(&cfg(1, 113, 113, 4, 1, 64, true), 1.0);
}

#[test]
fn every_listed_head_dim() {
    for d in [16, 32, 64, 80, 96, 128, 256] {
        check_forward(&cfg(1, 67, 45, 2, 1, d, false), 1.0);
        check_forward(&cfg(1, 45, 67, 2, 2, d, true), 1.0);
    }
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn odd_and_tiny_head_dims() {
    for d in [1, 3, 7, 9, 33, 127, 255] {
        check_forward(&cfg(1, 29, 31, 1, 1, d, true), 1.0);
    }
}

#[test]
fn batch_greater_than_one() {
    check_forward(&cfg(3, 57, 91, 2, 2, 64, false), 1.0);
}

#[test]
fn large_logits_stay_exact() {
    // inputs scaled by 8: logits in the hundreds, exp overflows without the running max
    check_forward(&cfg(1, 113, 113, 2, 2, 64, false), 8.0);
    check_forward(&cfg(1, 113, 113, 2, 2, 64, true), 8.0);
}

#[test]
fn explicit_softmax_scale_is_used() {
    let mut c = cfg(1, 33, 47, 2, 2, 32, false);
    c.softmax_scale = Some(0.37);
    check_forward(&c, 1.0);
}

/// Extreme-but-finite scores in `T`: every score below -1e30. The forward is exact. The
/// backward recomputes P = exp2(s - lse) from an f32 lse whose rounding alone is ~1e24 here, so
/// its P is 0 or 1 where the exact P is one-hot: it can only be required finite (no NaN, no
/// Inf), which it is, P being capped at 1 (docs/PRECISION.md).
fn hugely_negative_scores<T: flash_attn_wgpu::Element>(ctx: &flash_attn_wgpu::Context) {
    use flash_attn_wgpu::dtype::{from_f32_slice, to_f32_vec};
    use flash_attn_wgpu::{unstable::reference, Tuning};
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let mut c = cfg(1, 37, 45, 2, 1, 16, true);
    c.softmax_scale = Some(-1.0e31);
    let seed = common::fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pos = |n: usize| -> Vec<T> {
        from_f32_slice(
            &(0..n)
                .map(|_| rng.random_range(0.1f32..1.0))
                .collect::<Vec<_>>(),
        )
    };
    let (q, k, v, d_out) = (
        pos(37 * 2 * 16),
        pos(45 * 16),
        pos(45 * 16),
        pos(37 * 2 * 16),
    );
    let (qr, kr, vr) = (to_f32_vec(&q), to_f32_vec(&k), to_f32_vec(&v));
    let want = reference::forward(&c, &qr, &kr, &vr);
    assert!(
        want.lse.iter().all(|&l| l < -1.0e30),
        "the test needs every lse below -1e30"
    );
    let tol = common::rel_tol(T::DTYPE);
    let base = ctx.tuning();
    for (algorithm, variant) in common::algorithm_variants() {
        ctx.set_tuning(Tuning { variant, ..base }).unwrap();
        c.algorithm = algorithm;
        let msg = format!("{} {algorithm:?} {variant:?} seed={seed}", T::DTYPE);
        let got = ctx.forward_host(&c, &q, &k, &v).unwrap();
        let out = to_f32_vec(&got.out);
        common::assert_close_tol("out", &out, &want.out, tol, &msg);
        common::assert_lse_close(&got.lse, &want.lse, &msg);
        let g = ctx
            .backward_host(&c, &q, &k, &v, &got.out, &got.lse, &d_out)
            .unwrap();
        for (name, t) in [("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
            assert!(
                to_f32_vec(t).iter().all(|x| x.is_finite()),
                "{name} not finite ({msg})"
            );
        }
    }
    ctx.set_tuning(base).unwrap();
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn rows_whose_every_score_is_hugely_negative_still_get_the_exact_softmax() {
    // q and k positive and softmax_scale = -1e31: every score is finite and below -1e30,
    // far under any finite stand-in for the running max's start. The result is the exact
    // softmax: each row's weight goes (almost) entirely to its least negative key.
    let ctx = flash_attn_wgpu::Context::new().unwrap();
    hugely_negative_scores::<f32>(&ctx);
    hugely_negative_scores::<half::f16>(&ctx);
    hugely_negative_scores::<half::bf16>(&ctx);
}
