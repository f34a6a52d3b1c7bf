//! Values narrower or wider than queries and keys (`AttentionConfig::head_dim_v`: DeepSeek's
//! 192/128 prefill, MLA's 576/512 decode) and query/key heads past 256, on the paths that run
//! them (`plan::head_dims`): the naive path forward and backward, the blocks forward (every
//! adapter's tiled prefill for such calls), the decode kernel over dense, paged and appended
//! caches (8-bit ones too) and over an MLA latent cache whose values are the first 512 dims of its keys (one
//! buffer, read in place) - against the f64 reference on fresh random data; and the typed
//! refusals of the paths that do not.

use crate::common;

use common::backend::{check_case, Gap};
use common::{assert_close_tol, assert_lse_close, cfg, ctx, rel_tol, rounded_inputs};
use flash_attn_wgpu::dtype::to_f32_vec;
use flash_attn_wgpu::{
    unstable::plan, unstable::reference, Algorithm, AttentionConfig, CacheFormat, Context, DType,
    Error,
};

fn with_dv(mut c: AttentionConfig, dv: usize) -> AttentionConfig {
    c.head_dim_v = Some(dv);
    c
}

#[test]
fn naive_path_runs_values_of_their_own_head_dim_forward_and_backward() {
    // values narrower than q and k, odd sizes, GQA; a softcap and a sink (the backward's
    // score chain and d_sinks through the narrower rows)
    let mut b = with_dv(cfg(1, 29, 45, 6, 3, 40, false), 24);
    b.algorithm = Algorithm::Naive;
    b.softcap = Some(4.0);
    b.sinks = Some(common::random_sinks(&b));
    check_case::<_, half::f16>(ctx(), &b, 2.0, "naive dv < d", Gap::None);
}

/// Values wider than q and k on the naive path, causal, GQA (the CI tier has wider values on
/// the blocks kernels and the decode kernel: its own pipelines here, the suite's budget).
#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn naive_path_runs_values_wider_than_the_keys() {
    let mut a = with_dv(cfg(2, 37, 53, 4, 2, 24, true), 40);
    a.algorithm = Algorithm::Naive;
    check_case::<_, f32>(ctx(), &a, 2.0, "naive dv > d", Gap::None);
}

#[test]
fn tiled_calls_run_values_of_their_own_head_dim_on_the_blocks_kernels() {
    // DeepSeek's 192/128 (f16), and odd dims with values narrower and wider than the keys
    // (36/20 and 20/44, f32: rows of no whole vec4; GQA, causal, a window and ALiBi), on the
    // blocks kernels whatever the adapter's variant, forward and backward
    let x = ctx();
    let deepseek = with_dv(cfg(1, 70, 70, 2, 1, 192, true), 128);
    let mut narrow = with_dv(cfg(2, 45, 61, 4, 2, 36, true), 20);
    narrow.window = flash_attn_wgpu::Window::new(Some(30), Some(0));
    narrow.alibi_slopes = Some(common::random_alibi(&narrow, false));
    let wide = with_dv(cfg(1, 33, 40, 2, 2, 20, false), 44);
    for (c, half) in [(deepseek, true), (narrow, false), (wide, false)] {
        let dtype = if half { DType::F16 } else { DType::F32 };
        let p = plan::forward(&c, dtype, &x.plan_env()).unwrap();
        assert!(p.steps[0].key.kernel.is_blocks_variant(), "{c:?}");
        if half {
            check_case::<_, half::f16>(x, &c, 2.0, "blocks dv", Gap::None);
        } else {
            check_case::<_, f32>(x, &c, 2.0, "blocks dv", Gap::None);
        }
    }
}

#[test]
fn tiled_calls_past_256_dims_run_on_the_blocks_kernels() {
    // MLA's 576/512 as a prefill (f16, causal, 2 query heads over 1), odd lengths, forward and
    // backward, on the tiles the adapter's workgroup memory gives (small ones: docs/SEMANTICS.md,
    // "Head dims", lists them for 16 KiB); a wide head of equal dims (320) is planned on them
    // too, whatever the adapter's variant, and run in the full tier (the next test: its 4
    // pipelines are past the CI tier's budget)
    let x = ctx();
    let mla = with_dv(cfg(1, 9, 13, 2, 1, 576, true), 512);
    let p = plan::forward(&mla, DType::F16, &x.plan_env()).unwrap();
    assert!(p.steps[0].key.kernel.is_blocks_variant(), "{mla:?}");
    check_case::<_, half::f16>(x, &mla, 2.0, "blocks past 256", Gap::None);
    let p = plan::forward(&wide_equal_dims(), DType::F32, &x.plan_env()).unwrap();
    assert!(p.steps[0].key.kernel.is_blocks_variant());
}

/// A head of equal dims past 256 (320), odd lengths.
fn wide_equal_dims() -> AttentionConfig {
    cfg(1, 7, 11, 2, 2, 320, false)
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn tiled_calls_of_equal_dims_past_256_run_forward_and_backward() {
    check_case::<_, f32>(ctx(), &wide_equal_dims(), 2.0, "blocks at 320", Gap::None);
}

#[test]
fn decode_runs_values_of_their_own_head_dim_split_and_unsplit() {
    // 40/24 in f32 (element reads) and 96/64 in bf16 (wide reads), one split and several, then
    // a paged cache of odd page size with per-batch lengths (the backward of such a call is the
    // blocks kernels', tested above)
    for (c, splits) in [
        (
            with_dv(cfg(2, 3, 301, 8, 2, 40, true), 24),
            [Some(1), Some(5)],
        ),
        (
            with_dv(cfg(1, 1, 257, 16, 2, 96, false), 64),
            [Some(1), None],
        ),
    ] {
        for n in splits {
            let c = AttentionConfig {
                kv_splits: n,
                ..c.clone()
            };
            let x = ctx();
            let dtype = if c.head_dim == 40 {
                DType::F32
            } else {
                DType::BF16
            };
            let p = plan::forward(&c, dtype, &x.plan_env()).unwrap();
            assert!(p.steps[0].key.kernel.is_decode(), "{c:?}");
            if dtype == DType::F32 {
                forward_against_reference::<f32>(&c, "decode dv");
            } else {
                forward_against_reference::<half::bf16>(&c, "decode dv");
            }
        }
    }
    let paged = common::kv::paged_cfg(&with_dv(cfg(2, 2, 90, 4, 1, 40, true), 24), 7, 5);
    forward_against_reference::<f32>(&paged, "paged decode dv");
}

/// Forward only (a paged call has no backward), in `T`, against the reference.
fn forward_against_reference<T: flash_attn_wgpu::Element>(c: &AttentionConfig, what: &str) {
    let r = rounded_inputs::<T>(c, 2.0);
    let msg = format!("{what} {} seed {}", T::DTYPE, r.seed);
    let f = ctx()
        .forward_host(c, &r.q, &r.k, &r.v)
        .unwrap_or_else(|e| panic!("{e} ({msg})"));
    let want = reference::forward(c, &r.qr, &r.kr, &r.vr);
    assert_close_tol(
        "out",
        &to_f32_vec(&f.out),
        &want.out,
        rel_tol(T::DTYPE),
        &msg,
    );
    assert_lse_close(&f.lse, &want.lse, &msg);
}

#[test]
fn kv_cache_appends_values_of_their_own_head_dim() {
    // two decode-shaped steps (4 new rows, then 1) on a dense cache whose values are 16 wide
    // against keys of 32
    let c = with_dv(cfg(2, 1, 40, 4, 2, 32, true), 16);
    common::kv::append_and_attend::<_, half::f16>(ctx(), &c, &[9, 30], 4);
}

#[test]
fn mla_decode_reads_values_as_the_first_512_dims_of_the_latent_keys() {
    // MLA: 64 query heads over one latent kv head of 576 dims (512 latent + 64 rotary), the
    // values its first 512 dims, read in place from the one cache buffer through a view;
    // workgroups of as many heads as hold q whole (CPU drivers' default), and of up to 64 with
    // q held a chunk at a time (GPUs')
    for q_chunks in [false, true] {
        let x = Context::new().unwrap();
        x.set_tuning(flash_attn_wgpu::Tuning {
            decode_q_chunks: q_chunks,
            ..x.tuning()
        })
        .unwrap();
        mla_decode_on(&x, q_chunks);
    }
}

fn mla_decode_on(x: &Context, q_chunks: bool) {
    let mut c = with_dv(cfg(1, 1, 150, 64, 1, 576, false), 512);
    c.softmax_scale = Some(1.0 / (192f32).sqrt());
    c.kv_splits = Some(3);
    let tiles = plan::decode::shape(&c, &x.plan_env()).unwrap().tiles;
    assert_eq!(tiles.rpt < 144, q_chunks, "{tiles:?}");
    let r = rounded_inputs::<half::f16>(&c, 1.0);
    let q = x.upload(&r.q, &c.q_shape()).unwrap();
    let k = x.upload(&r.k, &c.kv_shape()).unwrap();
    let v = x
        .tensor_from_buffer(
            k.buffer(),
            0,
            &c.v_shape(),
            Some(&[c.seq_kv * 576, 576, 576, 1]),
            DType::F16,
        )
        .unwrap();
    let f = x.forward(&c, &q, &k, &v).unwrap();
    let vr: Vec<f32> =
        r.kr.chunks(576)
            .flat_map(|row| row[..512].to_vec())
            .collect();
    let want = reference::forward(&c, &r.qr, &r.kr, &vr);
    let msg = format!("mla (q chunks {q_chunks}) seed {}", r.seed);
    let out = to_f32_vec(&x.download::<half::f16>(&f.out).unwrap());
    assert_close_tol("out", &out, &want.out, rel_tol(DType::F16), &msg);
    assert_lse_close(&x.download::<f32>(&f.lse).unwrap(), &want.lse, &msg);
}

#[test]
fn eight_bit_caches_hold_values_of_their_own_head_dim() {
    // q8_0 at 64/32 in f32 (a prefill of 5 rows on the blocks forward, then a decode step),
    // E4M3 at 96/64 in f16 (decode steps): each cache's records its own dim wide, appended on
    // the GPU and read back within the format's rounding, out against the reference over the
    // dequantized caches
    let c = with_dv(cfg(2, 1, 40, 4, 2, 64, true), 32);
    common::kv::quantized_append_and_attend::<_, f32>(
        ctx(),
        &c,
        &[7, 20],
        5,
        (CacheFormat::Q8_0, None),
    );
    let c = with_dv(cfg(1, 1, 50, 8, 1, 96, false), 64);
    common::kv::quantized_append_and_attend::<_, half::f16>(
        ctx(),
        &c,
        &[30],
        2,
        (CacheFormat::E4M3, None),
    );
}

#[test]
fn paths_without_separate_value_dims_refuse_them_with_typed_errors() {
    let x = ctx();
    let unsupported = |r: Result<(), Error>, what: &str| match r {
        Err(Error::Unsupported { feature, .. }) => {
            assert!(feature.contains("head_dim_v"), "{what}: {feature}")
        }
        other => panic!("{what}: expected Unsupported, got {other:?}"),
    };
    // tiled calls cut into binding windows (a 64 KiB binding limit), forward and backward:
    // the windows place q's and k's rows, v's and out's differ
    let mut env = x.plan_env();
    env.max_binding_bytes = 64 << 10;
    let mla = with_dv(cfg(1, 64, 64, 2, 1, 576, false), 512);
    unsupported(
        plan::forward(&mla, DType::F16, &env).map(drop),
        "576/512 prefill in windows",
    );
    unsupported(
        plan::backward(&mla, DType::F16, &env).map(drop),
        "576/512 backward in windows",
    );
    // wider heads alike, also with equal dims
    let wide = cfg(1, 64, 64, 2, 2, 320, false);
    unsupported(
        plan::forward(&wide, DType::F32, &env).map(drop),
        "head_dim 320 in windows",
    );
    // out of range: a typed invalid config
    for bad in [
        with_dv(cfg(1, 1, 8, 1, 1, 64, false), 513),
        cfg(1, 1, 8, 1, 1, 577, false),
    ] {
        assert!(matches!(
            x.forward_host(&bad, &[0f32; 0], &[], &[]),
            Err(Error::InvalidConfig(_))
        ));
    }
}
