//! The decode path (split-KV with GQA packing: `plan::decode`): calls of a few query rows
//! against many keys, in every split count (splits of one key, empty splits), every dtype and
//! storage, and with every mask and score modifier, forward (and the backward from its out
//! and lse) against the f64 reference.

use crate::common;

use common::backend::{check_case, Gap};
use common::{assert_close_tol, assert_lse_close, cfg, ctx, rounded_inputs};
use flash_attn_wgpu::dtype::to_f32_vec;
use flash_attn_wgpu::unstable::kernels::Kernel;
use flash_attn_wgpu::{
    unstable::plan, unstable::reference, AttentionConfig, Context, DType, Element, Window,
};

/// The call takes the decode path on this context.
fn assert_decode(ctx: &Context, c: &AttentionConfig, dtype: DType) {
    let p = plan::forward(c, dtype, &ctx.plan_env()).unwrap();
    assert!(
        p.steps[0].key.kernel.is_decode(),
        "{}",
        common::describe(c, 0)
    );
}

/// Forward in `T` for each split count, against the reference and against one split.
fn splits_agree<T: Element>(c: &AttentionConfig, splits: &[Option<usize>]) {
    let x = ctx();
    let r = rounded_inputs::<T>(c, 2.0);
    let want = reference::forward(c, &r.qr, &r.kr, &r.vr);
    let msg = format!("{} seed {}", T::DTYPE, r.seed);
    let mut one: Option<Vec<f32>> = None;
    for &n in splits {
        let mut c = c.clone();
        c.kv_splits = n;
        assert_decode(x, &c, T::DTYPE);
        let f = x.forward_host(&c, &r.q, &r.k, &r.v).unwrap();
        let out = to_f32_vec(&f.out);
        let msg = format!("{msg} kv_splits {n:?}");
        let tol = common::rel_tol(T::DTYPE);
        assert_close_tol("out", &out, &want.out, tol, &msg);
        assert_lse_close(&f.lse, &want.lse, &msg);
        match &one {
            None => one = Some(out),
            // the merge is exact up to f32 rounding (and one rounding to the dtype)
            Some(o) => {
                let o64: Vec<f64> = o.iter().map(|&v| v as f64).collect();
                assert_close_tol("out against one split", &out, &o64, tol, &msg);
            }
        }
    }
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn every_split_count_gives_the_unsplit_result() {
    // 300 keys: splits of one key (300), empty splits (400, 7 of 43 keys: the last has 42),
    // splits not aligned to tiles, the heuristic
    let c = cfg(2, 1, 300, 8, 2, 40, false);
    splits_agree::<f32>(
        &c,
        &[
            Some(1),
            Some(2),
            Some(3),
            Some(7),
            Some(300),
            Some(400),
            None,
        ],
    );
    let c = cfg(1, 3, 1100, 4, 4, 64, true);
    splits_agree::<half::f16>(&c, &[Some(1), Some(5), None]);
    let c = cfg(1, 2, 700, 16, 2, 128, false);
    splits_agree::<half::bf16>(&c, &[Some(1), Some(4)]);
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn decode_runs_every_dtype_storage_and_gqa_shape() {
    // MHA, GQA, MQA; one to four query rows (more packed rows than one workgroup takes at
    // head_dim 256); odd head dims
    for (b, sq, skv, hq, hkv, d) in [
        (2, 1, 513, 4, 4, 16),
        (1, 4, 200, 32, 8, 128),
        (3, 2, 77, 6, 1, 33),
        (1, 3, 300, 16, 2, 256),
        (2, 1, 64, 2, 1, 1),
    ] {
        let c = cfg(b, sq, skv, hq, hkv, d, sq > 1);
        assert_decode(ctx(), &c, DType::F32);
        check_case::<_, f32>(ctx(), &c, 2.0, "decode", Gap::None);
        check_case::<_, half::f16>(ctx(), &c, 2.0, "decode", Gap::None);
        check_case::<_, half::bf16>(ctx(), &c, 2.0, "decode", Gap::None);
    }
    // packed half storage
    let packed = Context::new().unwrap();
    packed
        .set_tuning(flash_attn_wgpu::Tuning {
            half_storage: flash_attn_wgpu::HalfStorage::Packed,
            ..packed.tuning()
        })
        .unwrap();
    let c = cfg(2, 1, 301, 8, 2, 24, false);
    check_case::<_, half::f16>(&packed, &c, 2.0, "decode packed", Gap::None);
    check_case::<_, half::bf16>(&packed, &c, 2.0, "decode packed", Gap::None);
}

#[test]
fn the_subgroup_path_runs_at_the_adapters_own_width() {
    // the decode kernel's lanes hand q and the weights round the subgroup (lanes1, lanes4) at
    // the adapter's fixed width: 8 on lavapipe by default, 16 in CI's 16-wide tier
    // (LP_NATIVE_VECTOR_WIDTH=512, which sets FLASH_ATTN_EXPECT_SUBGROUP=16 so that a machine
    // whose lavapipe falls back to 8 fails rather than passes untested); the 32- and 64-wide
    // text differs from it only in its width (a unit test in kernels/wgsl.rs)
    let x = ctx();
    let width = x.tuning().rows_subgroup;
    if let Ok(want) = std::env::var("FLASH_ATTN_EXPECT_SUBGROUP") {
        assert_eq!(width.to_string(), want, "the adapter's subgroup width");
    }
    let c = cfg(2, 1, 300, 8, 2, 64, false);
    let p = plan::forward(&c, DType::F32, &x.plan_env()).unwrap();
    let decode = p.steps.iter().find(|s| s.key.kernel.is_decode()).unwrap();
    assert_eq!(decode.key.subgroup, width, "{}", decode.key.label());
    splits_agree::<f32>(&c, &[Some(1), None]);
}

#[test]
fn decode_takes_every_mask_and_score_modifier() {
    // with every modifier on (a user's score_mod too; and with each group alone), split and
    // unsplit, forward and the backward from the decode forward's out and lse
    let base = cfg(2, 3, 400, 8, 2, 32, true);
    let mut cases: Vec<AttentionConfig> = Vec::new();
    let mut all = base.clone();
    all.window = Window::new(Some(150), Some(0));
    all.softcap = Some(3.0);
    all.alibi_slopes = Some(common::random_alibi(&all, true));
    all.sinks = Some(common::random_sinks(&all));
    all.seqlens_kv = Some(vec![400, 130]);
    all.dropout = Some(common::random_dropout(0.2));
    all.block_mask = Some(common::random_block_mask(&all, (1, 40), true, true, 0.7));
    all.mask = Some(common::random_bool_mask(&all, true, true, 0.7, 1));
    all.bias = Some(common::random_bias(&all, true, false, 0.05, 0));
    all.score_mod = Some(common::score_mods::rational());
    cases.push(all);
    // key lengths with empty splits and a batch that sees no key (out 0, lse the sink's)
    let mut lens = base.clone();
    lens.seqlens_kv = Some(vec![0, 37]);
    lens.sinks = Some(common::random_sinks(&lens));
    cases.push(lens);
    let mut masks = base.clone();
    masks.causal = false;
    masks.mask = Some(common::random_bool_mask(&masks, true, true, 0.5, 2));
    cases.push(masks);
    let mut scores = base.clone();
    scores.softcap = Some(1.5);
    scores.bias = Some(common::random_bias(&scores, false, true, 0.1, 1));
    scores.dropout = Some(common::random_dropout(0.3));
    cases.push(scores);
    // (CI: everything at once and the key lengths, one split and six; tier.rs)
    let cases = common::tier::sample(&cases, &[0, 1]);
    for (n, c) in cases.iter().enumerate() {
        for splits in common::tier::sample(&[Some(1), Some(6), None], &[0, 1]) {
            let mut c = c.clone();
            c.kv_splits = splits;
            assert_decode(ctx(), &c, DType::F32);
            let what = format!("case {n} kv_splits {splits:?}");
            match n % 3 {
                0 => check_case::<_, f32>(ctx(), &c, 2.0, &what, Gap::None),
                1 => check_case::<_, half::f16>(ctx(), &c, 2.0, &what, Gap::None),
                _ => check_case::<_, half::bf16>(ctx(), &c, 2.0, &what, Gap::None),
            };
        }
    }
}

#[test]
fn bad_split_counts_are_typed_errors() {
    let mut c = cfg(1, 1, 100, 2, 2, 16, false);
    for n in [0, flash_attn_wgpu::config::MAX_KV_SPLITS + 1] {
        c.kv_splits = Some(n);
        match c.validate() {
            Err(flash_attn_wgpu::Error::InvalidConfig(m)) => {
                assert!(m.contains("kv_splits"), "{m}")
            }
            other => panic!("expected InvalidConfig for kv_splits {n}, got {other:?}"),
        }
    }
}

#[test]
fn decode_runs_in_windows_of_whole_batches_past_one_binding() {
    // a device binding 100 KiB at once: K (and V) of the 3 batches take 3 x 300 x 2 x 32 x 4 =
    // 225 KiB, one batch 75 KiB, so the call runs in windows of one batch, each a decode
    // dispatch and a merge;
    // with key lengths, sinks and ALiBi per batch (indexed by the whole call's batch), and a
    // block mask, which the whole call's extras hold after the key lengths of every batch
    // (a window's own layout put it among them: Params::from_part)
    let limits = wgpu::Limits {
        max_storage_buffer_binding_size: 100 << 10,
        ..wgpu::Limits::default()
    };
    let (device, queue) = common::device_with(limits, wgpu::Features::SHADER_F16);
    let x = Context::from_wgpu(device, queue).unwrap();
    let mut c = cfg(3, 2, 300, 8, 2, 32, true);
    c.seqlens_kv = Some(vec![300, 17, 150]);
    c.sinks = Some(common::random_sinks(&c));
    c.alibi_slopes = Some(common::random_alibi(&c, true));
    c.block_mask = Some(common::random_block_mask(&c, (128, 128), true, true, 0.7));
    let p = plan::forward(&c, DType::F32, &x.plan_env()).unwrap();
    let kernels: Vec<Kernel> = p.steps.iter().map(|s| s.key.kernel).collect();
    assert_eq!(
        kernels.iter().filter(|k| k.is_decode()).count(),
        3,
        "{kernels:?}"
    );
    check_case::<_, f32>(&x, &c, 2.0, "batch windows", Gap::None);
    // (the split one in f16: the full tier; tier.rs)
    if common::tier::full() {
        c.kv_splits = Some(3);
        check_case::<_, half::f16>(&x, &c, 2.0, "batch windows split", Gap::None);
    }
}
