//! f16 and bf16, forward and backward, in every algorithm and variant and in both storage
//! modes (native `array<f16>` and packed u32 pairs: forced through the tuning override, since
//! lavapipe has SHADER_F16), against the f64 reference computed from the rounded inputs.
//! Tolerance: `common::rel_tol` (f32 accumulation plus one output rounding).

use crate::common;
use common::{cfg, check_dtype_dyn, Errors};
use flash_attn_wgpu::{Algorithm, AttentionConfig, Context, DType, HalfStorage, Tuning, Variant};

/// (dtype, storage) pairs this adapter can run: native f16 only with SHADER_F16.
fn formats(ctx: &Context) -> Vec<(DType, HalfStorage)> {
    let mut f = vec![
        (DType::F16, HalfStorage::Packed),
        (DType::BF16, HalfStorage::Packed),
    ];
    if ctx.adapter_info().shader_f16 {
        f.insert(0, (DType::F16, HalfStorage::Native));
    }
    f
}

/// Every algorithm and tiled variant: lanes, rows without and with subgroup sharing, naive.
fn algorithms(ctx: &Context) -> Vec<(Algorithm, Variant, u32)> {
    let sg = ctx.tuning().rows_subgroup;
    let mut a: Vec<(Algorithm, Variant, u32)> = common::algorithm_variants()
        .into_iter()
        .map(|(alg, v)| (alg, v, 0))
        .collect();
    if sg != 0 {
        a.insert(2, (Algorithm::Tiled, Variant::Rows, sg));
    }
    a
}

/// Runs `check` for (format, algorithm) pairs on a context of its own (tuning is per
/// context): in the CI tier each algorithm in one format in turns and every format at least
/// once, the turns starting where the shape says (tier.rs); in the full tier every pair.
fn for_every_combination(c: &AttentionConfig, amp: f32) -> Errors {
    let ctx = Context::new().expect("context");
    let mut worst = Errors::default();
    let salt = c.seq_q + c.seq_kv + c.head_dim + c.heads_kv;
    let mut algorithms = algorithms(&ctx);
    let n = algorithms.len();
    algorithms.rotate_left(salt % n);
    for ((algorithm, variant, rows_subgroup), (dtype, half_storage)) in
        common::tier::pairs(&algorithms, &formats(&ctx), |_, _| true)
    {
        ctx.set_tuning(Tuning {
            variant,
            rows_subgroup,
            half_storage,
            ..ctx.tuning()
        })
        .unwrap();
        let mut c = c.clone();
        c.algorithm = algorithm;
        let msg = format!("{half_storage:?} {variant:?} sg={rows_subgroup}");
        let e = check_dtype_dyn(&ctx, dtype, &c, amp, &msg);
        eprintln!("{dtype} {msg} {algorithm:?}: {e:?}");
        worst = worst.max(e);
    }
    worst
}

#[test]
fn half_dtypes_match_reference_at_odd_lengths() {
    for_every_combination(&cfg(2, 77, 61, 4, 2, 64, false), 1.0);
    for_every_combination(&cfg(1, 61, 77, 2, 1, 64, true), 1.0);
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn half_dtypes_give_zero_and_neg_inf_lse_for_rows_that_see_no_key() {
    // bottom-right causal with seq_q > seq_kv, and large logits (inputs up to 8)
    for_every_combination(&cfg(2, 40, 9, 2, 1, 16, true), 8.0);
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn half_dtypes_handle_gqa_and_mqa() {
    for_every_combination(&cfg(1, 45, 67, 4, 1, 32, true), 1.0);
    for_every_combination(&cfg(2, 33, 33, 6, 3, 16, false), 1.0);
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn half_dtypes_handle_odd_element_counts_and_head_dims() {
    // One head and odd head_dim: every tensor has an odd element count and neighbouring rows
    // share a packed word, so a packed store that clobbered its neighbour would show here.
    // (head_dim 1 and 128 in f32 run in tests/variants.rs and tests/forward.rs; each head
    // dim here is a dozen lavapipe compiles)
    for d in [3, 80, 256] {
        for_every_combination(&cfg(1, 19, 23, 1, 1, d, true), 1.0);
    }
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn half_dtypes_keep_large_logits_exact() {
    for_every_combination(&cfg(1, 70, 70, 2, 2, 64, false), 8.0);
}

/// Values that exercise every branch of the device's rounding: zeros, f16 subnormals and
/// their halfway points, ties to even, the largest finite halves, overflow, inf, NaN, and
/// random values over many binades.
fn rounding_probe_values() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        1.0 + f32::powi(2.0, -11),       // f16 tie: to even (1.0)
        1.0 + 3.0 * f32::powi(2.0, -11), // f16 tie: to even (up)
        1.0 + f32::powi(2.0, -8),        // bf16 tie
        1.0 + 3.0 * f32::powi(2.0, -8),
        f32::powi(2.0, -24), // smallest f16 subnormal
        f32::powi(2.0, -25), // tie with zero
        1.5 * f32::powi(2.0, -25),
        3.0 * f32::powi(2.0, -25), // subnormal tie
        f32::powi(2.0, -14),       // smallest f16 normal
        f32::powi(2.0, -14) * (1.0 - f32::powi(2.0, -12)),
        65504.0,
        65519.0,
        65520.0, // f16 tie between 65504 and infinity
        1.0e5,
        3.3895314e38, // largest bf16
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
    ];
    let mut x = 0x1234_5678u32;
    for _ in 0..1999 {
        x = x.wrapping_mul(1664525).wrapping_add(1013904223);
        let exp = (x >> 24) as i32 % 60 - 30;
        let mant = 1.0 + (x & 0xffff) as f32 / 65536.0;
        v.push(if x & 0x100 != 0 { -mant } else { mant } * f32::powi(2.0, exp));
    }
    v.extend(v.clone().iter().map(|x| x + f32::EPSILON * x.abs()));
    v.push(0.25); // an odd count
    assert!(v.len() % 2 == 1);
    v
}

fn assert_same_bits<T: flash_attn_wgpu::Element + PartialEq + std::fmt::Debug>(
    got: &[T],
    src: &[f32],
    what: &str,
) {
    assert_eq!(got.len(), src.len());
    for (i, (g, &x)) in got.iter().zip(src).enumerate() {
        let want = T::from_f32(x);
        let g32 = g.to_f32();
        if x.is_nan() {
            assert!(g32.is_nan(), "{what}: [{i}] {x} -> {g32}, want NaN");
        } else {
            assert_eq!(
                bytemuck::bytes_of(g),
                bytemuck::bytes_of(&want),
                "{what}: [{i}] {x:e} -> {g32:e}, want {:e}",
                want.to_f32()
            );
        }
    }
}

#[test]
fn device_rounding_to_half_matches_the_host_bit_for_bit() {
    let ctx = Context::new().expect("context");
    let base = ctx.tuning();
    let src = rounding_probe_values();
    let t = ctx.upload(&src, &[src.len()]).unwrap();
    for (dtype, half_storage) in formats(&ctx) {
        ctx.set_tuning(Tuning {
            half_storage,
            ..base
        })
        .unwrap();
        let cast = ctx.cast(&t, dtype).unwrap();
        assert_eq!(cast.dtype(), dtype);
        let what = format!("{dtype} {half_storage:?}");
        match dtype {
            DType::F16 => assert_same_bits(&ctx.download::<half::f16>(&cast).unwrap(), &src, &what),
            DType::BF16 => {
                assert_same_bits(&ctx.download::<half::bf16>(&cast).unwrap(), &src, &what)
            }
            DType::F32 => unreachable!(),
        }
    }
}

#[test]
fn half_tensors_round_trip_bit_exactly_at_odd_counts() {
    let ctx = common::ctx();
    let src: Vec<f32> = (0..7).map(|i| i as f32 * 0.37 - 1.0).collect();
    let h: Vec<half::f16> = flash_attn_wgpu::dtype::from_f32_slice(&src);
    let t = ctx.upload(&h, &[7]).unwrap();
    assert_eq!(t.dtype(), DType::F16);
    assert_eq!(t.size_bytes(), 16, "7 halves pad to 4 words");
    assert_eq!(ctx.download::<half::f16>(&t).unwrap(), h);
    let b: Vec<half::bf16> = flash_attn_wgpu::dtype::from_f32_slice(&src);
    let t = ctx.upload(&b, &[7]).unwrap();
    assert_eq!(ctx.download::<half::bf16>(&t).unwrap(), b);
}

#[test]
fn half_tensors_hold_half_the_bytes_of_f32() {
    let ctx = common::ctx();
    let c = cfg(1, 256, 256, 4, 4, 64, false);
    let data = common::inputs(&c, 1.0);
    let q32 = ctx.upload(&data.q, &c.q_shape()).unwrap();
    let f32_fwd = ctx.forward(&c, &q32, &q32, &q32).unwrap();
    let qh: Vec<half::bf16> = flash_attn_wgpu::dtype::from_f32_slice(&data.q);
    let qh = ctx.upload(&qh, &c.q_shape()).unwrap();
    let h_fwd = ctx.forward(&c, &qh, &qh, &qh).unwrap();
    assert_eq!(q32.size_bytes(), 2 * qh.size_bytes());
    assert_eq!(f32_fwd.out.size_bytes(), 2 * h_fwd.out.size_bytes());
    assert_eq!(h_fwd.out.dtype(), DType::BF16);
    assert_eq!(h_fwd.lse.dtype(), DType::F32, "lse stays f32");
}

/// NaN, +inf, -inf or finite, per element.
fn classes(x: &[f32]) -> Vec<u8> {
    x.iter()
        .map(|v| match v {
            v if v.is_nan() => 0,
            v if *v == f32::INFINITY => 1,
            v if *v == f32::NEG_INFINITY => 2,
            _ => 3,
        })
        .collect()
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn nan_and_inf_inputs_behave_in_half_dtypes_as_in_f32() {
    // A NaN in one query row, and an infinity in v (what an f16 overflow becomes): the
    // pattern of NaN / inf / finite outputs must be the f32 one, and the NaN must stay in
    // the rows that read it. (Non-causal: what masked keys holding inf or NaN do to the rows
    // that cannot see them is the reliability issue's, for every dtype alike.)
    let c = cfg(1, 24, 20, 2, 1, 8, false);
    let data = common::inputs(&c, 1.0);
    let (mut q, mut v) = (data.q.clone(), data.v.clone());
    let row = 5; // query row 5 of head 0
    for x in &mut q[(row * 2) * 8..(row * 2) * 8 + 8] {
        *x = f32::NAN;
    }
    v[3 * 8 + 2] = f32::INFINITY; // key 3, dim 2
    let ctx = Context::new().expect("context");
    let base = ctx.tuning();
    for (algorithm, variant, rows_subgroup) in algorithms(&ctx) {
        let mut c = c.clone();
        c.algorithm = algorithm;
        let f32_out = {
            ctx.set_tuning(Tuning {
                variant,
                rows_subgroup,
                ..base
            })
            .unwrap();
            ctx.forward_host(&c, &q, &data.k, &v).unwrap().out
        };
        let want = classes(&f32_out);
        // the NaN row is NaN everywhere, and rows that cannot see it have no NaN
        for (i, cl) in want.iter().enumerate() {
            let (r, h) = (i / 16, (i / 8) % 2);
            if r == row && h == 0 {
                assert_eq!(
                    *cl, 0,
                    "f32 {algorithm:?} {variant:?}: [{i}] of the NaN row"
                );
            } else {
                assert_ne!(*cl, 0, "f32 {algorithm:?} {variant:?}: NaN leaked to [{i}]");
            }
        }
        for (dtype, half_storage) in formats(&ctx) {
            ctx.set_tuning(Tuning {
                variant,
                rows_subgroup,
                half_storage,
                ..ctx.tuning()
            })
            .unwrap();
            let got = match dtype {
                DType::F16 => {
                    let cv = |x: &[f32]| flash_attn_wgpu::dtype::from_f32_slice::<half::f16>(x);
                    flash_attn_wgpu::dtype::to_f32_vec(
                        &ctx.forward_host(&c, &cv(&q), &cv(&data.k), &cv(&v))
                            .unwrap()
                            .out,
                    )
                }
                _ => {
                    let cv = |x: &[f32]| flash_attn_wgpu::dtype::from_f32_slice::<half::bf16>(x);
                    flash_attn_wgpu::dtype::to_f32_vec(
                        &ctx.forward_host(&c, &cv(&q), &cv(&data.k), &cv(&v))
                            .unwrap()
                            .out,
                    )
                }
            };
            assert_eq!(
                classes(&got),
                want,
                "{dtype} {half_storage:?} {algorithm:?} {variant:?} sg={rows_subgroup}"
            );
        }
    }
}
