//! Values a row cannot see never reach it (issue 9, class 2). NaN and Inf written into the keys
//! and values that causal masking hides from some rows, and a NaN query row: every other row
//! must match the f64 reference exactly as if those values were ordinary, in both algorithms,
//! both tiled variants and every dtype, forward and backward; the rows that do see a NaN carry
//! it, and a NaN query row gives NaN (never -inf) in its lse.

mod common;

use common::{assert_close_nan, cfg, poisoned_inputs, rel_tol, Rounded};
use flash_attn_wgpu::dtype::to_f32_vec;
use flash_attn_wgpu::{reference, AttentionConfig, Context, Element, Tuning};

/// One poisoned case in `T` on every algorithm and variant: forward and backward against the
/// reference on the same (poisoned, T-rounded) inputs.
fn poisoned_case<T: Element>(ctx: &Context, base: &AttentionConfig) {
    let Rounded {
        seed,
        q,
        k,
        v,
        d_out,
        qr,
        kr,
        vr,
        dor,
    } = poisoned_inputs::<T>(base);
    let want = reference::forward(base, &qr, &kr, &vr);
    let tol = rel_tol(T::DTYPE);
    let tuning = ctx.tuning();
    for (algorithm, variant) in common::algorithm_variants() {
        ctx.set_tuning(Tuning { variant, ..tuning }).unwrap();
        let mut c = base.clone();
        c.algorithm = algorithm;
        let msg = format!("{} {}", T::DTYPE, common::describe(&c, seed));
        let f = ctx.forward_host(&c, &q, &k, &v).unwrap();
        let out = to_f32_vec(&f.out);
        let nans = assert_close_nan("out", &out, &want.out, tol, &msg);
        assert!(nans > 0, "the poisoned rows must carry NaN ({msg})");
        for (i, (&g, &w)) in f.lse.iter().zip(&want.lse).enumerate() {
            if w.is_nan() {
                assert!(g.is_nan(), "lse[{i}] = {g}, want NaN ({msg})");
            } else {
                assert!(
                    (g as f64 - w).abs() <= 1e-4 * w.abs().max(1.0),
                    "lse[{i}]: {g} vs {w} ({msg})"
                );
            }
        }
        assert!(
            f.lse[3].is_nan(),
            "the NaN query row's lse is NaN, not -inf ({msg})"
        );
        // The backward takes the forward's own out (NaN rows included) and an lse whose NaN
        // rows the host check would refuse: run it on device tensors, which take any lse.
        let (qs, kvs) = (c.q_shape(), c.kv_shape());
        let g = ctx.backward(
            &c,
            &ctx.upload(&q, &qs).unwrap(),
            &ctx.upload(&k, &kvs).unwrap(),
            &ctx.upload(&v, &kvs).unwrap(),
            &ctx.upload(&f.out, &qs).unwrap(),
            &ctx.upload(&f.lse, &c.lse_shape()).unwrap(),
            &ctx.upload(&d_out, &qs).unwrap(),
        );
        let wg = reference::backward_with_out(&c, &qr, &kr, &vr, &out, &dor);
        match g {
            Ok(g) => {
                for (name, got, want) in [
                    ("dq", &g.dq, &wg.dq),
                    ("dk", &g.dk, &wg.dk),
                    ("dv", &g.dv, &wg.dv),
                ] {
                    let got = to_f32_vec(&ctx.download::<T>(got).unwrap());
                    assert_close_nan(name, &got, want, tol, &msg);
                }
            }
            Err(e) => panic!("backward failed: {e} ({msg})"),
        }
    }
    ctx.set_tuning(tuning).unwrap();
}

fn every_dtype(base: &AttentionConfig) {
    let ctx = Context::new().unwrap();
    poisoned_case::<f32>(&ctx, base);
    poisoned_case::<half::f16>(&ctx, base);
    poisoned_case::<half::bf16>(&ctx, base);
}

#[test]
fn nan_and_inf_in_keys_a_row_cannot_see_never_reach_it() {
    every_dtype(&cfg(1, 40, 40, 2, 1, 16, true));
}

#[test]
fn the_same_across_several_key_tiles_and_gqa_groups() {
    every_dtype(&cfg(1, 150, 150, 4, 2, 32, true));
}
