//! Property test over configs and input values (issue 9): NaN, +-Inf, +-1e30, subnormals,
//! zeros and ordinary values mixed into q, k and v, extreme softmax scales, every algorithm,
//! variant and dtype. Whatever the input:
//!
//! - nothing panics, and a valid config gives `Ok` (an invalid one a typed error);
//! - a row whose inputs are all finite and whose scores cannot overflow f32 comes back with
//!   no NaN or Inf; if its scores are also well-conditioned (|q| |k| scale small enough that
//!   f32 rounding of the scores cannot reorder the softmax), it matches the f64 reference;
//! - a row that sees a NaN (in its query, or in the key of a visible pair) has a NaN lse;
//! - a row that sees no key gives out 0 and lse -inf;
//! - the backward never invents a NaN: with every input finite and no overflow, every
//!   gradient is finite, and with every row well-conditioned it matches the reference.
//!
//! Each case's algorithm, variant, dtype and head dim are its slot's, fixed per case number,
//! so that every run compiles the same pipelines (`common::pipelines`); shapes, scales and
//! values are drawn afresh each run.

use crate::common;

use common::{ctx, pipelines, rel_tol};
use flash_attn_wgpu::dtype::{from_f32_slice, to_f32_vec};
use flash_attn_wgpu::{
    unstable::{plan, reference},
    Algorithm, AttentionConfig, Context, DType, Element, Error, Tuning, Variant,
};
use proptest::prelude::*;

/// A value: mostly ordinary, sometimes one of the extremes.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        12 => -2.0f32..2.0,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => prop_oneof![Just(1e30f32), Just(-1e30f32)],
        1 => prop_oneof![Just(1e-40f32), Just(-3e-39f32), Just(0.0f32), Just(-0.0f32)],
    ]
}

/// Values for a tensor: ordinary only (most tensors), or with extremes mixed in.
fn tensor(n: usize) -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![
        2 => prop::collection::vec(-2.0f32..2.0, n),
        1 => prop::collection::vec(value(), n),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    cfg: AttentionConfig,
    dtype: DType,
    variant: Variant,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_out: Vec<f32>,
}

/// What decides a case's pipelines: the algorithm and variant, the dtype, the head dim, and
/// whether a tiled call has a decode step's few query rows. Case `n` of a run takes slot `n`,
/// draws its shape and values afresh, and is redrawn until its pipelines are the slot's fixed
/// case's (`common::pipelines`): every run compiles the same pipelines.
#[derive(Debug, Clone, Copy)]
struct Slot {
    alg: (Algorithm, Variant),
    dtype: DType,
    d: usize,
    decode: bool,
}

/// Slot `n`. The CI tier's 6 meet every algorithm and dtype and the decode kernel, on
/// pipelines the other tests compile too (the suite's pipeline budget, docs/TESTING.md); from
/// slot 6 on (the full tier's 32), the choices turn in rotations of different lengths, odd
/// head dims among them.
fn slot(n: usize) -> Slot {
    let algs = common::algorithm_variants();
    // (tiled rows, tiled blocks, naive: algorithm_variants' order)
    let [rows, blocks, naive] = <[_; 3]>::try_from(algs.clone()).expect("three ways to run");
    let ci = [
        (rows, DType::F32, 16, false),
        (blocks, DType::BF16, 64, true),
        (naive, DType::F32, 2, false),
        (rows, DType::F16, 64, false),
        (blocks, DType::F32, 16, false),
        (naive, DType::F16, 64, false),
    ];
    if let Some(&(alg, dtype, d, decode)) = ci.get(n) {
        return Slot {
            alg,
            dtype,
            d,
            decode,
        };
    }
    let alg = algs[n % algs.len()];
    Slot {
        alg,
        dtype: DType::ALL[(n + n / 3) % 3],
        d: [16, 8, 3, 1][(n + n / 4) % 4],
        decode: alg.0 == Algorithm::Tiled && n % 4 == 1,
    }
}

/// The slot's fixed case, whose pipelines each drawn case must have.
fn fixed(s: &Slot) -> AttentionConfig {
    let sq = if s.decode { 2 } else { 20 };
    let mut c = AttentionConfig::new(2, sq, 17, 2, 1, s.d);
    c.algorithm = s.alg.0;
    c
}

fn case(s: Slot) -> impl Strategy<Value = Case> {
    // a decode step's rows (plan::decode::MAX_DECODE_QUERIES), or more
    let rows = if s.decode { 1usize..=4 } else { 5usize..=20 };
    (
        (1usize..=2, rows, 1usize..=20, 1usize..=2, 1usize..=2),
        any::<bool>(),
        prop::sample::select(vec![
            None,
            Some(1e-30f32),
            Some(0.7),
            Some(-3.0),
            Some(1e20),
        ]),
    )
        .prop_flat_map(move |((b, sq, skv, hkv, group), causal, scale)| {
            let d = s.d;
            let mut cfg = AttentionConfig::new(b, sq, skv, hkv * group, hkv, d);
            cfg.causal = causal;
            cfg.softmax_scale = scale;
            cfg.algorithm = s.alg.0;
            let nq = b * sq * hkv * group * d;
            let nkv = b * skv * hkv * d;
            (
                Just(cfg),
                tensor(nq),
                tensor(nkv),
                tensor(nkv),
                prop::collection::vec(-1.0f32..1.0, nq),
            )
        })
        .prop_map(move |(cfg, q, k, v, d_out)| Case {
            cfg,
            dtype: s.dtype,
            variant: s.alg.1,
            q,
            k,
            v,
            d_out,
        })
}

/// What the f64 arithmetic says about one query row.
struct RowFacts {
    /// Sees at least one key.
    any_visible: bool,
    /// Its query or a visible key holds a NaN.
    sees_nan_score: bool,
    /// Every value it touches (q, visible k and v) is finite and no partial dot product can
    /// overflow f32.
    finite: bool,
    /// `finite`, and f32 rounding of its scores is far below 1e-3: the softmax is
    /// well-conditioned and must match the reference.
    conditioned: bool,
    /// Largest |v| over visible keys: the scale of the row's output.
    v_max: f64,
}

fn visible(c: &AttentionConfig, i: usize, j: usize) -> bool {
    !c.causal || (j as i64) <= i as i64 + c.causal_offset()
}

fn row_facts(
    c: &AttentionConfig,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    b: usize,
    h: usize,
    i: usize,
) -> RowFacts {
    let d = c.head_dim;
    let hk = h / c.group();
    let qo = ((b * c.seq_q + i) * c.heads_q + h) * d;
    let qrow = &q[qo..qo + d];
    let scale = c.scale().abs() as f64;
    // kernels may scale q before the dot product: q * scale must stay finite too
    let q_max = qrow.iter().fold(0.0f64, |m, x| m.max((*x as f64).abs()));
    let mut f = RowFacts {
        any_visible: false,
        sees_nan_score: qrow.iter().any(|x| x.is_nan()),
        finite: qrow.iter().all(|x| x.is_finite()),
        conditioned: true,
        v_max: 0.0,
    };
    for j in 0..c.seq_kv {
        if !visible(c, i, j) {
            continue;
        }
        f.any_visible = true;
        let ko = ((b * c.seq_kv + j) * c.heads_kv + hk) * d;
        let (kr, vr) = (&k[ko..ko + d], &v[ko..ko + d]);
        f.sees_nan_score |= kr.iter().any(|x| x.is_nan());
        f.finite &= kr.iter().chain(vr).all(|x| x.is_finite());
        let mag: f64 = qrow
            .iter()
            .zip(kr)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        // the exp2-domain score is scale * log2(e) * q.k: keep every partial sum far from f32::MAX
        f.finite &= mag * scale * 2.0 < 1e37 && q_max * scale * 2.0 < 1e37;
        f.conditioned &= mag * scale < 30.0;
        f.v_max = vr.iter().fold(f.v_max, |m, x| m.max((*x as f64).abs()));
    }
    f.conditioned &= f.finite;
    f
}

fn run<T: Element>(ctx: &Context, case: &Case) -> Result<(), TestCaseError> {
    let c = &case.cfg;
    // the kernels see T-rounded inputs; so does the reference
    let (q, k, v, d_out) = (
        from_f32_slice::<T>(&case.q),
        from_f32_slice::<T>(&case.k),
        from_f32_slice::<T>(&case.v),
        from_f32_slice::<T>(&case.d_out),
    );
    let (qr, kr, vr, dor) = (
        to_f32_vec(&q),
        to_f32_vec(&k),
        to_f32_vec(&v),
        to_f32_vec(&d_out),
    );
    ctx.set_tuning(Tuning {
        variant: case.variant,
        ..ctx.tuning()
    })
    .unwrap();
    let f = match ctx.forward_host(c, &q, &k, &v) {
        Ok(f) => f,
        Err(e) => {
            return Err(TestCaseError::fail(format!(
                "forward of a valid config failed: {e}"
            )))
        }
    };
    let out = to_f32_vec(&f.out);
    let want = reference::forward(c, &qr, &kr, &vr);
    let tol = rel_tol(T::DTYPE);
    let d = c.head_dim;
    let mut all_finite = true;
    let mut all_conditioned = true;
    for b in 0..c.batch {
        for h in 0..c.heads_q {
            for i in 0..c.seq_q {
                let facts = row_facts(c, &qr, &kr, &vr, b, h, i);
                all_finite &= facts.finite;
                all_conditioned &= facts.conditioned;
                let oo = ((b * c.seq_q + i) * c.heads_q + h) * d;
                let li = (b * c.heads_q + h) * c.seq_q + i;
                let (orow, lse) = (&out[oo..oo + d], f.lse[li]);
                let at = format!("row b={b} h={h} i={i}");
                if !facts.any_visible {
                    prop_assert!(
                        orow.iter().all(|&x| x == 0.0),
                        "{at}: sees no key, out {orow:?}"
                    );
                    prop_assert_eq!(lse, f32::NEG_INFINITY, "{}: sees no key", at);
                    continue;
                }
                if facts.sees_nan_score {
                    prop_assert!(lse.is_nan(), "{at}: sees a NaN score, lse {lse}");
                }
                if facts.finite {
                    prop_assert!(
                        orow.iter().all(|x| x.is_finite()) && lse.is_finite(),
                        "{at}: finite inputs, out {orow:?} lse {lse}"
                    );
                }
                if facts.conditioned {
                    let bound = tol * facts.v_max.max(1e-30) + 1e-30;
                    for (x, (&g, &w)) in orow.iter().zip(&want.out[oo..oo + d]).enumerate() {
                        prop_assert!(
                            (g as f64 - w).abs() <= bound,
                            "{at} d={x}: got {g}, want {w} (bound {bound:e})"
                        );
                    }
                    let wl = want.lse[li];
                    prop_assert!(
                        (lse as f64 - wl).abs() <= 1e-4 * wl.abs().max(1.0),
                        "{at}: lse {lse}, want {wl}"
                    );
                }
            }
        }
    }

    let g = match ctx.backward_host(c, &q, &k, &v, &f.out, &f.lse, &d_out) {
        Ok(g) => g,
        Err(e) => return Err(TestCaseError::fail(format!("backward failed: {e}"))),
    };
    let wg = reference::backward_with_out(c, &qr, &kr, &vr, &out, &dor);
    if all_finite {
        // finite inputs: a gradient is finite wherever its true value fits f32 comfortably
        for (name, t, w) in [
            ("dq", &g.dq, &wg.dq),
            ("dk", &g.dk, &wg.dk),
            ("dv", &g.dv, &wg.dv),
        ] {
            for (x, (gx, wx)) in to_f32_vec(t).iter().zip(w).enumerate() {
                prop_assert!(
                    gx.is_finite() || wx.abs() >= 1e36,
                    "{name}[{x}]: finite inputs gave {gx} (true value {wx})"
                );
            }
        }
    }
    if all_conditioned {
        for (name, t, w) in [
            ("dq", &g.dq, &wg.dq),
            ("dk", &g.dk, &wg.dk),
            ("dv", &g.dv, &wg.dv),
        ] {
            let got = to_f32_vec(t);
            let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
            // dq and dk scale with |k| and |q|: measure them against the largest such term too
            let bound = tol * scale.max(1e-6);
            for (x, (&gx, &wx)) in got.iter().zip(w).enumerate() {
                prop_assert!(
                    (gx as f64 - wx).abs() <= bound,
                    "{name}[{x}]: got {gx}, want {wx} (bound {bound:e})"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn any_values_give_a_typed_error_or_rows_that_match_the_reference() {
    // A context of its own: each case sets its variant, which on the shared context would
    // change the kernels of the tests running beside this one mid-test.
    let ctx = &Context::new().expect("context");
    for n in 0..common::prop_cases(6, 32) as usize {
        let s = slot(n);
        pipelines::run_slot(
            ctx,
            (s.alg.1, &fixed(&s), s.dtype),
            case(s),
            |case| &case.cfg,
            |case| match case.dtype {
                DType::F32 => run::<f32>(ctx, &case),
                DType::F16 => run::<half::f16>(ctx, &case),
                DType::BF16 => run::<half::bf16>(ctx, &case),
            },
            &format!("slot {n} {s:?}"),
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn shapes_that_do_not_divide_or_overflow_are_typed_errors(
        dims in prop::collection::vec(prop_oneof![0usize..5, Just(usize::MAX / 3), Just(1usize << 40)], 6),
    ) {
        let c = AttentionConfig::new(dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]);
        let run = |c: &AttentionConfig| {
            let n = |s: &[usize]| s.iter().product::<usize>();
            let q = vec![0.25f32; n(&c.q_shape())];
            let kv = vec![0.5f32; n(&c.kv_shape())];
            ctx().forward_host(c, &q, &kv, &kv).is_ok()
        };
        // a fixed small config runs in every case, drawn valid or not (valid draws are rare:
        // the pipelines must not depend on whether one came up)
        let small = AttentionConfig::new(1, 1, 3, 1, 1, 4);
        prop_assert!(run(&small));
        match c.validate() {
            Ok(()) => {
                // a valid config plans; a small one runs where it compiles the fixed one's
                // pipelines (the same pipelines every run)
                let env = ctx().plan_env();
                prop_assert!(plan::forward(&c, DType::F32, &env).is_ok());
                prop_assert!(plan::backward(&c, DType::F32, &env).is_ok());
                let allowed = pipelines::keys(ctx(), &small, DType::F32);
                if pipelines::keys(ctx(), &c, DType::F32).is_subset(&allowed) {
                    prop_assert!(run(&c));
                }
            }
            Err(Error::InvalidConfig(msg)) => prop_assert!(!msg.is_empty()),
            Err(e) => prop_assert!(false, "validate gave {e:?}"),
        }
    }
}
