//! KV caches: attention aligned to each batch's key length (`align_to_seqlens`) in every
//! variant, forward and backward, against the reference; appending to a dense cache then
//! attending (`forward_with_kvcache`), prefill then decode, equal to attention over exactly
//! the keys each batch holds; bad arguments as typed errors.

use crate::common;

use common::backend::{check_case, Gap};
use common::kv::{append_and_attend, quantized_append_and_attend, random_paged, Rope};
use common::{cfg, ctx};
use flash_attn_wgpu::{AttentionConfig, Context, DType, Error, Tuning, Window};

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn attention_aligned_to_each_batch_length_matches_the_reference_everywhere() {
    // causal with a window, ALiBi per batch, sinks; lengths 0 (no key), short and full; on
    // every tiled variant and the naive path (many rows), and on the decode path (two rows)
    let x = Context::new().unwrap();
    let mut c = cfg(3, 19, 80, 4, 2, 24, true);
    c.seqlens_kv = Some(vec![80, 33, 0]);
    c.align_to_seqlens = true;
    c.window = Window::new(Some(20), None);
    c.alibi_slopes = Some(common::random_alibi(&c, true));
    c.sinks = Some(common::random_sinks(&c));
    for (algorithm, variant) in common::algorithm_variants() {
        x.set_tuning(Tuning {
            variant,
            ..x.tuning()
        })
        .unwrap();
        let mut c = c.clone();
        c.algorithm = algorithm;
        check_case::<_, f32>(
            &x,
            &c,
            2.0,
            &format!("{algorithm:?} {variant:?}"),
            Gap::None,
        );
    }
    let mut d = c.clone();
    d.seq_q = 2;
    d.window = Window::default();
    check_case::<_, half::f16>(ctx(), &d, 2.0, "decode", Gap::None);
    d.kv_splits = Some(5);
    check_case::<_, half::bf16>(ctx(), &d, 2.0, "decode split", Gap::None);
}

#[test]
fn appending_then_attending_equals_attention_over_each_batch_keys() {
    // lengths 0, partial and nearly full; prefill of 5 rows then a decode step; GQA
    let mut c = cfg(3, 1, 96, 8, 2, 32, true);
    append_and_attend::<_, f32>(ctx(), &c, &[0, 40, 90], 5);
    c.alibi_slopes = Some(common::random_alibi(&c, true));
    c.window = Window::new(Some(30), None);
    append_and_attend::<_, half::f16>(ctx(), &c, &[7, 0, 64], 3);
    let c = cfg(2, 1, 200, 4, 4, 16, true);
    append_and_attend::<_, half::bf16>(ctx(), &c, &[150, 1], 2);
}

#[test]
fn eight_bit_caches_append_on_the_gpu_and_attend_as_the_reference_over_their_values() {
    use flash_attn_wgpu::CacheFormat;
    use rand::SeedableRng;
    // q8_0 dense: lengths 0, partial and nearly full, GQA, a prefill of 5 rows (the tiled
    // kernels) then a decode step; ALiBi
    let mut c = cfg(3, 1, 96, 8, 2, 64, true);
    c.alibi_slopes = Some(common::random_alibi(&c, true));
    // the decode step in three key splits (the split kernel and the merge)
    c.kv_splits = Some(3);
    let e = quantized_append_and_attend::<_, f32>(
        ctx(),
        &c,
        &[0, 40, 90],
        5,
        (CacheFormat::Q8_0, None),
    );
    eprintln!("q8_0 f32: largest |out - reference over the unquantized cache| / max|out| {e:.2e}");
    // E4M3 paged, left padded, f16, head_dim 96 (three q8 blocks: an odd count of scales);
    // a prefill of 5 rows (the tiled kernels), then one split
    let mut c = cfg(2, 1, 96, 4, 2, 96, true);
    c.paged = Some(random_paged(
        &mut rand::rngs::StdRng::seed_from_u64(common::fresh_seed()),
        2,
        12,
        8,
    ));
    c.leftpad_kv = Some(vec![3, 0]);
    let e = quantized_append_and_attend::<_, half::f16>(
        ctx(),
        &c,
        &[50, 70],
        5,
        (CacheFormat::E4M3, None),
    );
    eprintln!("e4m3 f16: largest |out - reference over the unquantized cache| / max|out| {e:.2e}");
    // with a rotary embedding fused in (half the dims, interleaved pairs)
    let rope = Rope {
        rotary_dim: 48,
        interleaved: true,
    };
    let q8 = (CacheFormat::Q8_0, Some(rope));
    let e = quantized_append_and_attend::<_, half::bf16>(ctx(), &c, &[9, 33], 2, q8);
    eprintln!(
        "q8_0 bf16 paged: largest |out - reference over the unquantized cache| / max|out| {e:.2e}"
    );
}

/// The q8_0 append on the GPU writes exactly the bytes and scales of the host codec
/// (`CacheFormat::quantize`, ggml's rule: ties away from zero, the f32 scale): blocks of
/// exact ties at several scales, ties of x (1 / d) where d is not an f16, a subnormal f16
/// scale, zeros, the smallest block that is not zeros (with subnormal inputs), and random
/// blocks from 1e-3 to 1e3 (the scale's and its inverse's rounding). Compared as the values
/// the cache holds, bit for bit: a byte times its block's f16 scale, which gives back the byte
/// and the scale wherever the scale is finite and not 0 (every block here but the zero ones,
/// whose values are 0 whatever the bytes). The shape and modifiers of the q8_0 f32 case of
/// `eight_bit_caches_append_on_the_gpu_and_attend_as_the_reference_over_their_values` (its
/// decode step's pipelines: no pipeline of its own).
#[test]
fn the_q8_0_append_writes_the_host_codecs_bytes_ties_included() {
    use flash_attn_wgpu::CacheFormat;
    use rand::{Rng, SeedableRng};
    let x = ctx();
    let mut c = cfg(3, 1, 96, 8, 2, 64, true);
    c.alibi_slopes = Some(common::random_alibi(&c, true));
    c.kv_splits = Some(3);
    let seed = common::fresh_seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // 12 blocks of 32 a tensor: [3 batches, 1 row, 2 kv heads, 64 dims]. The first: d = 1,
    // ties of the values themselves, whose bytes (its values: the scale is 1) are written out
    #[rustfmt::skip]
    let ties: Vec<f32> = vec![
        127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 126.5, -126.5, 0.49999997, -0.49999997, 3.5,
        -3.5, 64.5, -64.5, 0.0, -0.0, 1.0, 100.49999, 100.50001, -127.0, 0.25, -0.75, 10.5,
        -11.5, 12.5, 99.5, -100.5, 0.5000001, 2.4999998, 63.5, -63.5,
    ];
    #[rustfmt::skip]
    let ties_bytes: [i8; 32] = [
        127, 3, -3, 1, -1, 2, -2, 127, -127, 0, 0, 4, -4, 65, -65, 0, 0, 1, 100, 101, -127, 0,
        -1, 11, -12, 13, 100, -101, 1, 2, 64, -64,
    ];
    // amax 2^e: d = 2^e f32(1 / 127), 1 / d = 127 / 2^e, (k + 0.5) / 127 x 2^e an exact tie
    let product_ties = |e: i32| -> Vec<f32> {
        let p = 2f32.powi(e);
        (0..32)
            .map(|i| match i {
                0 => p,
                1 => -p,
                _ => {
                    ((i as f32 * 4.0 - 3.0) + 0.5) / 127.0 * p * if i % 2 == 0 { 1.0 } else { -1.0 }
                }
            })
            .collect()
    };
    let subnormal_scale: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) * 6.4e-5).collect();
    let smallest = {
        let mut b = vec![0f32; 32];
        b[0] = f32::from_bits(0x03FE0000); // 127 x 2^-126
        b[1] = f32::from_bits(0x0040_0000); // 2^-127, subnormal: counts as 0
        b[2] = -2.5 * f32::MIN_POSITIVE;
        b
    };
    let mut random =
        |amp: f32| -> Vec<f32> { (0..32).map(|_| rng.random_range(-amp..amp)).collect() };
    let mut k_new: Vec<f32> = Vec::new();
    for b in [
        ties.clone(),
        product_ties(0),
        product_ties(-3),
        product_ties(6),
        subnormal_scale,
        vec![0.0; 32],
        smallest,
    ] {
        k_new.extend(b);
    }
    for amp in [1e-3, 0.07, 1.5, 9.0, 1e3] {
        k_new.extend(random(amp));
    }
    let mut v_new: Vec<f32> = ties.iter().map(|v| -v).collect();
    for e in [-9, -1, 3, 9] {
        v_new.extend(product_ties(e).iter().map(|v| -v));
    }
    for n in 0..7 {
        v_new.extend(random(10f32.powi(n - 3)));
    }
    let shape = c.kv_shape();
    let new_shape = [c.batch, 1, c.heads_kv, c.head_dim];
    let zeros = vec![0f32; shape.iter().product()];
    let lens = [5, 45, 95];
    let mut caches =
        [CacheFormat::Q8_0; 2].map(|f| x.quantized_cache(f, &zeros, shape, None).unwrap());
    let [kd, vd] = &mut caches;
    let q = x.zeros(&c.q_shape()).unwrap();
    let (kn, vn) = (
        x.upload(&k_new, &new_shape).unwrap(),
        x.upload(&v_new, &new_shape).unwrap(),
    );
    x.forward_with_quantized_kvcache(&c, &q, (kd, vd), &lens, Some((&kn, &vn)))
        .unwrap();
    // the ties block, at batch 0's row 5, kv head 0: away from zero, not to even
    let held = x.dequantize_cache(kd).unwrap();
    let at = 5 * c.heads_kv * c.head_dim;
    let bytes: Vec<i8> = held[at..at + 32].iter().map(|&v| v as i8).collect();
    assert_eq!(bytes, ties_bytes, "the ties block's bytes (seed {seed})");
    for (what, cache, new) in [("k", &*kd, &k_new), ("v", &*vd, &v_new)] {
        // the host codec over the same cache: the new rows at each batch's length
        let mut host = zeros.clone();
        let row = c.heads_kv * c.head_dim;
        for (b, &n) in lens.iter().enumerate() {
            let at = (b * c.seq_kv + n) * row;
            host[at..at + row].copy_from_slice(&new[b * row..(b + 1) * row]);
        }
        let words = CacheFormat::Q8_0.quantize(&host, shape, None).unwrap();
        let want = CacheFormat::Q8_0.dequantize(&words, shape).unwrap();
        let got = x.dequantize_cache(cache).unwrap();
        for (e, (g, w)) in got.iter().zip(&want).enumerate() {
            let (b, d) = (e / (c.seq_kv * row), e % c.head_dim);
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{what} cache element {e} (batch {b}, dim {d}, block {}): GPU {g}, host {w}, \
                 the new value {} (seed {seed})",
                d / 32,
                host[e]
            );
        }
    }
}

#[test]
fn every_forward_family_reads_an_8_bit_cache_as_the_reference() {
    // a prefill-sized call (6 query rows: the tiled kernels) over q8_0 and E4M3 caches on
    // every tiled family the adapter runs and the naive path, no append: out and lse against
    // the f64 reference over the values the cache holds
    use flash_attn_wgpu::{CacheFormat, Variant};
    use rand::{Rng, SeedableRng};
    let x = Context::new().unwrap();
    let seed = common::fresh_seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut c = cfg(2, 6, 40, 4, 2, 32, true);
    c.alibi_slopes = Some(common::random_alibi(&c, false));
    let lens = [40, 17];
    let shape = c.kv_shape();
    let n: usize = shape.iter().product();
    let mut values = || -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.5..1.5)).collect() };
    let (k, v) = (values(), values());
    let q: Vec<f32> = (0..c.q_shape().iter().product::<usize>())
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
        .collect();
    let qd = x.upload(&q, &c.q_shape()).unwrap();
    let fmts = [
        (CacheFormat::Q8_0, None),
        (CacheFormat::E4M3, Some(vec![0.01f32; 2])),
    ];
    for (algorithm, variant) in common::algorithm_variants() {
        if variant == Variant::Coop {
            continue; // f16 tensors in native storage only; no adapter here has it
        }
        x.set_tuning(Tuning {
            variant,
            ..x.tuning()
        })
        .unwrap();
        let mut cc = c.clone();
        cc.algorithm = algorithm;
        for (f, scales) in &fmts {
            let mut kq = x.quantized_cache(*f, &k, shape, scales.as_deref()).unwrap();
            let mut vq = x.quantized_cache(*f, &v, shape, scales.as_deref()).unwrap();
            let r = x
                .forward_with_quantized_kvcache(&cc, &qd, (&mut kq, &mut vq), &lens, None)
                .unwrap();
            let (kh, vh) = (
                x.dequantize_cache(&kq).unwrap(),
                x.dequantize_cache(&vq).unwrap(),
            );
            let mut want_cfg = cc.clone();
            want_cfg.seqlens_kv = Some(lens.to_vec());
            want_cfg.align_to_seqlens = true;
            let want = flash_attn_wgpu::unstable::reference::forward(&want_cfg, &q, &kh, &vh);
            let m = format!("{algorithm:?} {variant:?} {f} seed {seed}");
            let out: Vec<f32> = x.download(&r.out).unwrap();
            common::assert_close_tol("out", &out, &want.out, 1e-4, &m);
            common::assert_lse_close(&x.download::<f32>(&r.lse).unwrap(), &want.lse, &m);
        }
    }
}

#[test]
fn eight_bit_caches_decode_in_narrow_columns_where_the_gpu_takes_them() {
    // NVIDIA's, Apple's and wave64 GPUs read K and V in half-word columns of an 8-bit cache
    // (GpuClass::decode_max_words: half the sums a row in registers); planned so here, rows
    // past each length NaN: a decode step appended and attended as the reference, on the
    // subgroup path (where the adapter has one) and on the one without lanes
    use flash_attn_wgpu::unstable::kernels::GpuClass;
    use flash_attn_wgpu::unstable::plan;
    use flash_attn_wgpu::CacheFormat;
    let x = Context::new().unwrap();
    x.plan_as_gpu(Some(GpuClass::Nvidia));
    let base = x.tuning();
    let mut c = cfg(2, 1, 80, 8, 2, 128, true);
    c.kv_splits = Some(2);
    let cases = [(CacheFormat::Q8_0, [0, 61]), (CacheFormat::E4M3, [37, 76])];
    for rows_subgroup in [base.rows_subgroup, 0] {
        x.set_tuning(Tuning {
            rows_subgroup,
            ..base
        })
        .unwrap();
        for (f, lens) in cases {
            let e = quantized_append_and_attend::<_, f32>(&x, &c, &lens, 1, (f, None));
            eprintln!("{f} narrow, subgroup tuning {rows_subgroup}: largest |out - reference| / max|out| {e:.2e}");
            // the plan took the narrow columns: 2 vec4s (8 bytes) a column
            let env = x.plan_env();
            let mut p = plan::forward(&c, DType::F32, &env).unwrap();
            plan::quantized::read_cache(&mut p, f, &c, &env).unwrap();
            let decode = p.steps.iter().find(|s| s.key.kernel.is_decode()).unwrap();
            assert_eq!((decode.key.wide, decode.key.wide_vec4s()), (1, 2), "{f}");
            if rows_subgroup == 0 {
                assert_eq!(decode.key.subgroup, 0, "{f}: the path without lanes");
            }
        }
    }
}

#[test]
fn bad_8_bit_cache_arguments_are_typed_errors() {
    use flash_attn_wgpu::CacheFormat;
    let x = ctx();
    let c = cfg(2, 1, 10, 2, 1, 32, true);
    let zeros = vec![0f32; 2 * 10 * 32];
    let shape = c.kv_shape();
    let q = x.upload(&[0.5f32; 2 * 2 * 32], &c.q_shape()).unwrap();
    let mut k = x
        .quantized_cache(CacheFormat::Q8_0, &zeros, shape, None)
        .unwrap();
    let mut v = x
        .quantized_cache(CacheFormat::Q8_0, &zeros, shape, None)
        .unwrap();
    let mut e4 = x
        .quantized_cache(CacheFormat::E4M3, &zeros, shape, Some(&[0.5]))
        .unwrap();
    let new = x.zeros(&[2, 1, 1, 32]).unwrap();
    let wrong = |r: flash_attn_wgpu::Result<flash_attn_wgpu::Forward>, want: &str| match r {
        Err(e @ (Error::InvalidConfig(_) | Error::Unsupported { .. })) => {
            assert!(e.to_string().contains(want), "{e}")
        }
        other => panic!("expected a typed error with {want:?}, got {other:?}"),
    };
    // k and v in two formats, a cache of another shape, an overflow, a strided append
    wrong(
        x.forward_with_quantized_kvcache(&c, &q, (&mut k, &mut e4), &[3, 3], None),
        "the v cache must be q8_0 (the k cache's format",
    );
    let wide = AttentionConfig {
        seq_kv: 12,
        ..c.clone()
    };
    wide.validate().unwrap();
    // a cache of another shape is a shape error naming the cache (SEMANTICS.md)
    common::kv::assert_shape_error(
        x.forward_with_quantized_kvcache(&wide, &q, (&mut k, &mut v), &[3, 3], None),
        flash_attn_wgpu::TensorRole::K,
        &[2, 12, 1, 32],
        &[2, 10, 1, 32],
    );
    wrong(
        x.forward_with_quantized_kvcache(&c, &q, (&mut k, &mut v), &[3, 10], Some((&new, &new))),
        "cache overflow: batch 1 holds 10 keys",
    );
    // every other row of a [2, 2, 1, 32] buffer: a strided view
    let base = x.zeros(&[2, 2, 1, 32]).unwrap();
    let view = x
        .tensor_from_buffer(
            base.buffer(),
            0,
            &[2, 1, 1, 32],
            Some(&[64, 32, 32, 1]),
            DType::F32,
        )
        .unwrap();
    wrong(
        x.forward_with_quantized_kvcache(&c, &q, (&mut k, &mut v), &[3, 3], Some((&view, &new))),
        "a quantizing append (k_new)",
    );
    // the formats' own checks: head_dim, scales
    for (f, scales, want) in [
        (CacheFormat::Q8_0, None, "head_dim 48"),
        (CacheFormat::E4M3, None, "needs a scale per kv head"),
        (
            CacheFormat::E4M3,
            Some(&[0.0f32][..]),
            "finite positive scales",
        ),
        (
            CacheFormat::Q8_0,
            Some(&[1.0f32][..]),
            "head_scales must be None",
        ),
    ] {
        let d = if want == "head_dim 48" { 48 } else { 32 };
        let r = x.quantized_cache(f, &vec![0f32; 10 * d], [1, 10, 1, d], scales);
        assert!(
            matches!(&r, Err(e) if e.to_string().contains(want)),
            "{f} {want}: {r:?}"
        );
    }
}

#[test]
fn left_padded_caches_attend_past_their_padding() {
    // flash-attn's cache_leftpad: rows before each batch's padding hold NaN and are never
    // read into a result; a padding that covers every cached row leaves the new rows alone
    let mut c = cfg(3, 1, 96, 8, 2, 32, true);
    c.leftpad_kv = Some(vec![17, 0, 40]);
    c.alibi_slopes = Some(common::random_alibi(&c, true));
    append_and_attend::<_, f32>(ctx(), &c, &[60, 33, 40], 5);
    c.window = Window::new(Some(30), None);
    append_and_attend::<_, half::f16>(ctx(), &c, &[70, 0, 41], 3);
}

#[test]
fn bad_cache_arguments_are_typed_errors() {
    let x = ctx();
    let c = cfg(2, 1, 10, 2, 1, 8, true);
    let q = x.upload(&[0.5f32; 2 * 2 * 8], &c.q_shape()).unwrap();
    let mut k = x.zeros(&c.kv_shape()).unwrap();
    let mut v = x.zeros(&c.kv_shape()).unwrap();
    let new = |rows: usize| x.zeros(&[2, rows, 1, 8]).unwrap();
    let (k1, v1) = (new(1), new(1));
    let invalid = |r: flash_attn_wgpu::Result<flash_attn_wgpu::Forward>, want: &str| match r {
        Err(Error::InvalidConfig(m)) => assert!(m.contains(want), "{m}"),
        other => panic!("expected InvalidConfig with {want:?}, got {other:?}"),
    };
    // an append past the capacity names the batch
    invalid(
        x.forward_with_kvcache(&c, &q, &mut k, &mut v, &[3, 10], Some((&k1, &v1))),
        "cache overflow: batch 1 holds 10 keys, appending 1 would make 11",
    );
    invalid(
        x.forward_with_kvcache(&c, &q, &mut k, &mut v, &[11, 0], None),
        "cache overflow: batch 0",
    );
    invalid(
        x.forward_with_kvcache(&c, &q, &mut k, &mut v, &[1], None),
        "cache_seqlens must hold one length per batch",
    );
    let mut with_lens = c.clone();
    with_lens.seqlens_kv = Some(vec![1, 1]);
    invalid(
        x.forward_with_kvcache(&with_lens, &q, &mut k, &mut v, &[1, 1], None),
        "cfg.seqlens_kv must be None",
    );
    // new rows of the wrong shape or dtype
    let wrong = x.zeros(&[2, 1, 2, 8]).unwrap();
    assert!(matches!(
        x.forward_with_kvcache(&c, &q, &mut k, &mut v, &[1, 1], Some((&wrong, &v1))),
        Err(Error::Shape { .. })
    ));
    let half_new = x.zeros_of(&[2, 1, 1, 8], DType::F16).unwrap();
    assert!(matches!(
        x.forward_with_kvcache(&c, &q, &mut k, &mut v, &[1, 1], Some((&half_new, &v1))),
        Err(Error::DType { .. })
    ));
    // a cache of another shape
    let mut short = x.zeros(&[2, 9, 1, 8]).unwrap();
    assert!(matches!(
        x.forward_with_kvcache(&c, &q, &mut short, &mut v, &[1, 1], None),
        Err(Error::Shape { .. })
    ));
    // half caches with an odd row: the wgpu append copies whole words
    let odd = cfg(1, 1, 4, 1, 1, 3, false);
    let qh = x.zeros_of(&odd.q_shape(), DType::F16).unwrap();
    let mut kh = x.zeros_of(&odd.kv_shape(), DType::F16).unwrap();
    let mut vh = x.zeros_of(&odd.kv_shape(), DType::F16).unwrap();
    let nh = x.zeros_of(&[1, 1, 1, 3], DType::F16).unwrap();
    assert!(matches!(
        x.forward_with_kvcache(&odd, &qh, &mut kh, &mut vh, &[0], Some((&nh, &nh))),
        Err(Error::Unsupported { .. })
    ));
    // align_to_seqlens without lengths
    let mut a: AttentionConfig = c.clone();
    a.align_to_seqlens = true;
    assert!(matches!(a.validate(), Err(Error::InvalidConfig(_))));
}

#[test]
fn a_decode_loop_writes_in_place_and_matches_the_reference_each_step() {
    // three one-row steps over a dense cache, GQA, lengths 0, partial and nearly full: the
    // query, the new rows and the results are tensors made once and written in place
    use flash_attn_wgpu::{unstable::reference, Forward};
    let x = ctx();
    let c = cfg(3, 1, 96, 8, 2, 32, true);
    let seed = common::fresh_seed();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let row = c.heads_kv * c.head_dim;
    let mut lens = vec![0usize, 40, 90];
    let mut kc = common::random(&mut rng, c.batch * c.seq_kv * row, 1.5);
    let mut vc = common::random(&mut rng, c.batch * c.seq_kv * row, 1.0);
    let (mut kd, mut vd) = (
        x.upload(&kc, &c.kv_shape()).unwrap(),
        x.upload(&vc, &c.kv_shape()).unwrap(),
    );
    let new_shape = [c.batch, 1, c.heads_kv, c.head_dim];
    let (qd, knd, vnd) = (
        x.zeros(&c.q_shape()).unwrap(),
        x.zeros(&new_shape).unwrap(),
        x.zeros(&new_shape).unwrap(),
    );
    let dst = Forward {
        out: x.zeros(&c.q_shape()).unwrap(),
        lse: x.zeros(&c.lse_shape()).unwrap(),
    };
    for step in 0..3 {
        let q = common::random(&mut rng, c.batch * c.heads_q * c.head_dim, 1.5);
        let kn = common::random(&mut rng, c.batch * row, 1.5);
        let vn = common::random(&mut rng, c.batch * row, 1.0);
        x.write(&qd, &q).unwrap();
        x.write(&knd, &kn).unwrap();
        x.write(&vnd, &vn).unwrap();
        x.forward_with_kvcache_into(&c, &qd, (&mut kd, &mut vd), &lens, Some((&knd, &vnd)), &dst)
            .unwrap();
        let out = x.download::<f32>(&dst.out).unwrap();
        let lse = x.download::<f32>(&dst.lse).unwrap();
        for (bi, n) in lens.iter_mut().enumerate() {
            let at = (bi * c.seq_kv + *n) * row;
            kc[at..at + row].copy_from_slice(&kn[bi * row..(bi + 1) * row]);
            vc[at..at + row].copy_from_slice(&vn[bi * row..(bi + 1) * row]);
            *n += 1;
            let mut one = c.clone();
            one.batch = 1;
            one.seq_kv = *n;
            let qs = c.heads_q * c.head_dim;
            let base = bi * c.seq_kv * row;
            let want = reference::forward(
                &one,
                &q[bi * qs..(bi + 1) * qs],
                &kc[base..base + *n * row],
                &vc[base..base + *n * row],
            );
            let m = format!("batch {bi} step {step} seed {seed}");
            common::assert_close("out", &out[bi * qs..(bi + 1) * qs], &want.out, &m);
            let ls = c.heads_q;
            common::assert_lse_close(&lse[bi * ls..(bi + 1) * ls], &want.lse, &m);
        }
    }
}

#[test]
fn a_rotary_embedding_fused_into_the_kvcache_call_matches_the_host_rotation() {
    use common::kv::{append_and_attend_with, rope_tables, Rope};
    use flash_attn_wgpu::{Positions, Rotary};
    // GPT-NeoX halves over part of the head, causal (queries at their own positions), GQA
    let c = cfg(3, 1, 96, 8, 2, 32, true);
    let neox = Rope {
        rotary_dim: 16,
        interleaved: false,
    };
    append_and_attend_with::<_, f32>(ctx(), &c, &[0, 40, 90], 5, Some(neox));
    // GPT-J pairs over the whole head, not causal (a batch's queries all at its length)
    let c = cfg(2, 1, 64, 4, 4, 16, false);
    let gptj = Rope {
        rotary_dim: 16,
        interleaved: true,
    };
    append_and_attend_with::<_, half::f16>(ctx(), &c, &[10, 33], 3, Some(gptj));
    // bf16, a quarter of the head turned (the shape of the plain bf16 case above)
    let c = cfg(2, 1, 200, 4, 4, 16, true);
    let quarter = Rope {
        rotary_dim: 4,
        interleaved: true,
    };
    append_and_attend_with::<_, half::bf16>(ctx(), &c, &[150, 1], 2, Some(quarter));

    // bad tables and positions: typed errors before any GPU work, the caches untouched
    let x = ctx();
    let c = cfg(2, 1, 10, 2, 1, 8, true);
    let q = x.upload(&[0.5f32; 2 * 2 * 8], &c.q_shape()).unwrap();
    let mut k = x.zeros(&c.kv_shape()).unwrap();
    let mut v = x.zeros(&c.kv_shape()).unwrap();
    let k1 = x.upload(&[0.25f32; 2 * 8], &[2, 1, 1, 8]).unwrap();
    let (cos, sin) = rope_tables::<f32>(10, 8);
    let table =
        |t: &[f32], rows: usize, cols: usize| x.upload(&t[..rows * cols], &[rows, cols]).unwrap();
    let rot = |cos, sin| Rotary {
        cos,
        sin,
        interleaved: false,
    };
    let (c10, s10) = (table(&cos, 10, 4), table(&sin, 10, 4));
    // batch 1 holds 9 keys: its new key sits at position 9, the last the tables hold; its
    // query too (causal)
    x.forward_with_kvcache_rotary(
        &c,
        &q,
        &mut k,
        &mut v,
        &[3, 9],
        Some((&k1, &k1)),
        rot(&c10, &s10),
    )
    .unwrap();
    let (c9, s9) = (table(&cos, 9, 4), table(&sin, 9, 4));
    let before = x.download::<f32>(&k).unwrap();
    match x.forward_with_kvcache_rotary(
        &c,
        &q,
        &mut k,
        &mut v,
        &[3, 9],
        Some((&k1, &k1)),
        rot(&c9, &s9),
    ) {
        Err(Error::InvalidConfig(m)) => {
            assert!(m.contains("batch 1") && m.contains("position 9"), "{m}")
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    assert_eq!(x.download::<f32>(&k).unwrap(), before);
    // tables wider than half the head, sin shaped otherwise, another dtype
    let wide = x.zeros(&[10, 5]).unwrap();
    assert!(matches!(
        x.forward_with_kvcache_rotary(&c, &q, &mut k, &mut v, &[1, 1], None, rot(&wide, &wide)),
        Err(Error::InvalidConfig(m)) if m.contains("rotary_cos")
    ));
    assert!(matches!(
        x.forward_with_kvcache_rotary(&c, &q, &mut k, &mut v, &[1, 1], None, rot(&c10, &s9)),
        Err(Error::Shape {
            tensor: flash_attn_wgpu::TensorRole::RotarySin,
            ..
        })
    ));
    let half_cos = x.zeros_of(&[10, 4], DType::F16).unwrap();
    assert!(matches!(
        x.forward_with_kvcache_rotary(
            &c,
            &q,
            &mut k,
            &mut v,
            &[1, 1],
            None,
            rot(&half_cos, &half_cos)
        ),
        Err(Error::DType { .. })
    ));
    // apply_rotary alone: one start per batch
    assert!(matches!(
        x.apply_rotary(&q, rot(&c10, &s10), &Positions::from_starts(vec![0])),
        Err(Error::InvalidConfig(m)) if m.contains("one start per batch")
    ));
}
