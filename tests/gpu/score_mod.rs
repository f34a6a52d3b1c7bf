//! User score modifiers (`AttentionConfig::score_mod`, FlexAttention's `score_mod`): the
//! built-in softcap re-expressed as one gives the built-in's results, and one no built-in
//! expresses matches the f64 reference (its host definition) forward and backward, tiled and
//! naive, in every dtype, composed with the built-in score modifiers. The decode path and
//! every kernel family take one in `decode.rs` and `variants.rs`; the snippet checks are the
//! library's unit tests; the CUDA C compiles in `cuda_compile.rs`.

use crate::common;
use common::{assert_close_tol, cfg, check_backward, ctx, inputs, score_mods};
use flash_attn_wgpu::{Algorithm, DType, Window};

#[test]
fn a_user_softcap_gives_the_built_in_softcaps_results() {
    // the shape of backends.rs's softcap case (its built-in pipelines are the suite's already)
    let mut builtin = cfg(1, 77, 93, 4, 2, 64, false);
    builtin.softcap = Some(1.5);
    let mut user = cfg(1, 77, 93, 4, 2, 64, false);
    user.score_mod = Some(score_mods::softcap());
    // against the reference (from the host definition), tiled and naive, forward and backward
    check_backward(&user, 2.0);
    let data = inputs(&user, 2.0);
    let run = |c: &flash_attn_wgpu::AttentionConfig| {
        let f = ctx().forward_host(c, &data.q, &data.k, &data.v).unwrap();
        let g = ctx()
            .backward_host(c, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out)
            .unwrap();
        (f, g)
    };
    let ((fb, gb), (fu, gu)) = (run(&builtin), run(&user));
    let msg = common::describe(&user, data.seed);
    let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    // the same function, computed in another order (natural-log units): f32 rounding apart
    for (what, got, want) in [
        ("out", &fu.out, &fb.out),
        ("lse", &fu.lse, &fb.lse),
        ("dq", &gu.dq, &gb.dq),
        ("dk", &gu.dk, &gb.dk),
        ("dv", &gu.dv, &gb.dv),
    ] {
        assert_close_tol(what, got, &f64s(want), 1e-5, &msg);
    }
}

#[test]
fn a_modifier_no_built_in_expresses_matches_the_reference_in_every_dtype() {
    // with GQA, causal, ALiBi and a bias before it in the chain (the user's acts last)
    let mut c = cfg(2, 70, 90, 4, 2, 32, true);
    c.alibi_slopes = Some(common::random_alibi(&c, true));
    c.bias = Some(common::random_bias(&c, true, false, 0.2, 3));
    c.score_mod = Some(score_mods::rational());
    check_backward(&c, 1.5);
    // and with a window, per-batch key lengths and sinks, in the half dtypes
    let mut c = cfg(2, 61, 83, 4, 1, 32, false);
    c.window = Window::new(Some(40), Some(7));
    c.seqlens_kv = Some(common::random_seqlens(&c));
    c.sinks = Some(common::random_sinks(&c));
    c.score_mod = Some(score_mods::rational());
    for dtype in [DType::F16, DType::BF16] {
        let e = common::check_dtype_dyn(ctx(), dtype, &c, 1.5, "score_mod");
        eprintln!("{dtype:?}: {e:?}");
    }
    c.algorithm = Algorithm::Naive;
    common::check_dtype_dyn(ctx(), DType::F32, &c, 1.5, "score_mod naive");
}

#[test]
fn a_t5_relative_position_table_is_read_from_captured_tensors() {
    // a learned bias per (head, bucket of j - i) in a captured table, the buckets computed in
    // the snippet; with GQA and causal, tiled and naive, forward and backward
    let c0 = cfg(2, 75, 90, 4, 2, 32, true);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(common::fresh_seed());
    let table = common::random(&mut rng, c0.heads_q * 16, 1.0);
    let mut c = c0.clone();
    c.score_mod = Some(score_mods::t5(c.heads_q, table.clone()));
    check_backward(&c, 1.0);
    // the table reaches the kernels: another table, another result
    let other: Vec<f32> = table.iter().map(|x| x + 0.5 * (x * 7.0).sin()).collect();
    let mut d = c0.clone();
    d.score_mod = Some(score_mods::t5(d.heads_q, other));
    let data = inputs(&c, 1.0);
    let a = ctx().forward_host(&c, &data.q, &data.k, &data.v).unwrap();
    let b = ctx().forward_host(&d, &data.q, &data.k, &data.v).unwrap();
    assert!(a.out.iter().zip(&b.out).any(|(x, y)| (x - y).abs() > 1e-3));
}

#[test]
fn bad_captured_tensors_are_user_code_errors() {
    use flash_attn_wgpu::{Error, ScoreMod};
    let src = "
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return s + t(i); }
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return 1.0; }";
    for (name, values, expect) in [
        ("t", vec![], "at least one value"),
        ("t", vec![1.0, f32::NAN], "finite"),
        ("2t", vec![1.0], "identifier"),
        ("visible", vec![1.0], "kernels define"),
    ] {
        match ScoreMod::wgsl_with(src, [(name, values)]) {
            Err(Error::UserCode { what, message, .. }) => {
                assert!(what.contains(name), "{what}");
                assert!(message.contains(expect), "{message}");
            }
            other => panic!("{name}: expected UserCode, got {other:?}"),
        }
    }
    // a snippet that reads a tensor it did not capture
    assert!(matches!(
        ScoreMod::wgsl(src),
        Err(Error::UserCode { line: Some(2), .. })
    ));
    assert!(ScoreMod::wgsl_with(src, [("t", vec![0.5; 8])]).is_ok());
}
