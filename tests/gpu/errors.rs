//! Bad input gets a typed error that says what was expected and what was given; never a panic.

use crate::common;
use common::{cfg, ctx};
use flash_attn_wgpu::unstable::kernels::{Kernel, Pass};
use flash_attn_wgpu::{Algorithm, AttentionConfig, DType, Error, TensorRole, Variant};
use proptest::prelude::*;

fn data(c: &AttentionConfig) -> (Vec<f32>, Vec<f32>) {
    let nq = c.batch * c.seq_q * c.heads_q * c.head_dim;
    let nkv = c.batch * c.seq_kv * c.heads_kv * c.head_dim;
    (vec![0.5; nq], vec![0.25; nkv])
}

#[test]
fn short_q_slice_names_the_tensor_and_both_lengths() {
    let c = cfg(1, 8, 8, 2, 2, 16, false);
    let (q, kv) = data(&c);
    let err = ctx().forward_host(&c, &q[1..], &kv, &kv).unwrap_err();
    match &err {
        Error::SliceLength {
            tensor,
            expected,
            got,
            ..
        } => {
            assert_eq!(*tensor, TensorRole::Q);
            assert_eq!((*expected, *got), (q.len(), q.len() - 1));
        }
        other => panic!("expected SliceLength, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("q has 255 elements, expected 256"), "{msg}");
}

#[test]
fn long_v_slice_is_rejected() {
    let c = cfg(1, 8, 8, 2, 2, 16, false);
    let (q, kv) = data(&c);
    let mut v = kv.clone();
    v.push(1.0);
    match ctx().forward_host(&c, &q, &kv, &v) {
        Err(Error::SliceLength {
            tensor: TensorRole::V,
            ..
        }) => {}
        other => panic!("expected SliceLength for v, got {other:?}"),
    }
}

#[test]
fn backward_checks_d_out_and_lse_lengths() {
    let c = cfg(1, 8, 8, 2, 2, 16, false);
    let (q, kv) = data(&c);
    let lse = vec![0.0; 16];
    match ctx().backward_host(&c, &q, &kv, &kv, &q, &lse[1..], &q) {
        Err(Error::SliceLength {
            tensor: TensorRole::Lse,
            expected: 16,
            got: 15,
            ..
        }) => {}
        other => panic!("expected SliceLength for lse, got {other:?}"),
    }
    match ctx().backward_host(&c, &q, &kv, &kv, &q, &lse, &q[2..]) {
        Err(Error::SliceLength {
            tensor: TensorRole::DOut,
            ..
        }) => {}
        other => panic!("expected SliceLength for d_out, got {other:?}"),
    }
}

#[test]
fn an_lse_no_forward_returns_is_refused_by_both_backward_calls() {
    let c = cfg(1, 4, 4, 1, 1, 8, false);
    let (q, kv) = data(&c);
    let lse = vec![0.0, f32::INFINITY, 0.0, 0.0];
    let refused = |r: flash_attn_wgpu::Result<_>| match r {
        Err(Error::InvalidValue {
            tensor: TensorRole::Lse,
            index: 1,
            ..
        }) => {}
        other => panic!("expected InvalidValue for lse[1], got {other:?}"),
    };
    refused(
        ctx()
            .backward_host(&c, &q, &kv, &kv, &q, &lse, &q)
            .map(|_| ()),
    );
    let t = |x: &[f32], s: &[usize]| ctx().upload(x, s).unwrap();
    let (qs, kvs) = (c.q_shape(), c.kv_shape());
    refused(
        ctx()
            .backward(
                &c,
                &t(&q, &qs),
                &t(&kv, &kvs),
                &t(&kv, &kvs),
                &t(&q, &qs),
                &t(&lse, &c.lse_shape()),
                &t(&q, &qs),
            )
            .map(|_| ()),
    );
}

#[test]
fn a_nan_lse_row_gets_nan_gradients_and_the_other_rows_are_untouched() {
    // A NaN lse is what the forward returns for a row that saw a NaN: accepted, and only that
    // row's dq (and the keys it sees) carry it.
    let c = cfg(1, 4, 4, 1, 1, 8, true);
    let (q, kv) = data(&c);
    let f = ctx().forward_host(&c, &q, &kv, &kv).unwrap();
    let mut lse = f.lse.clone();
    lse[2] = f32::NAN;
    let g = ctx()
        .backward_host(&c, &q, &kv, &kv, &f.out, &lse, &q)
        .unwrap();
    let row = |i: usize| &g.dq[i * 8..(i + 1) * 8];
    assert!(row(2).iter().all(|x| x.is_nan()));
    for i in [0, 1, 3] {
        assert!(row(i).iter().all(|x| x.is_finite()), "dq row {i}");
    }
    // key 3 is seen by row 3 alone (causal): its dk stays finite
    assert!(g.dk[3 * 8..].iter().all(|x| x.is_finite()));
}

#[test]
fn zero_dimensions_are_invalid() {
    for i in 0..6 {
        let mut d = [1usize, 4, 4, 2, 2, 8];
        d[i] = 0;
        let c = cfg(d[0], d[1], d[2], d[3], d[4], d[5], false);
        let err = c.validate().unwrap_err();
        assert!(
            matches!(err, Error::InvalidConfig(ref m) if m.contains("got 0")),
            "{err}"
        );
    }
}

#[test]
fn heads_q_not_a_multiple_of_heads_kv_is_invalid() {
    let c = cfg(1, 4, 4, 6, 4, 8, false);
    let err = ctx().forward_host::<f32>(&c, &[], &[], &[]).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("heads_q = 6") && msg.contains("heads_kv = 4"),
        "{msg}"
    );
}

#[test]
fn head_dims_past_576_and_values_past_512_are_invalid() {
    let c = cfg(1, 4, 4, 1, 1, 577, false);
    let msg = c.validate().unwrap_err().to_string();
    assert!(msg.contains("1..=576") && msg.contains("577"), "{msg}");
    // 576 alone leaves the values 576 wide: past 512
    let mut c = cfg(1, 4, 4, 1, 1, 576, false);
    let msg = c.validate().unwrap_err().to_string();
    assert!(msg.contains("1..=512") && msg.contains("576"), "{msg}");
    c.head_dim_v = Some(512);
    c.validate().unwrap();
    c.head_dim_v = Some(0);
    assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))));
}

#[test]
fn non_finite_softmax_scale_is_invalid() {
    for s in [f32::NAN, f32::INFINITY] {
        let mut c = cfg(1, 4, 4, 1, 1, 8, false);
        c.softmax_scale = Some(s);
        assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))));
    }
}

#[test]
fn alibi_slopes_sinks_and_key_lengths_that_do_not_fit_are_invalid_and_named() {
    // batch 2, heads_q 4: slopes [4] or [2, 4]; sinks [4]
    let base = cfg(2, 4, 4, 4, 2, 8, false);
    for (slopes, sinks, want) in [
        (
            Some(vec![0.5; 5]),
            None,
            "alibi_slopes must hold heads_q = 4 slopes",
        ),
        (
            Some(vec![0.5; 3]),
            None,
            "or batch x heads_q = 8 ([batch, heads_q]), got 3",
        ),
        (
            Some(vec![0.5, f32::NAN, 0.5, 0.5]),
            None,
            "alibi_slopes must be finite, got NaN at index 1",
        ),
        (
            None,
            Some(vec![0.0; 8]),
            "sinks must hold one logit per query head ([heads_q] = [4]), got 8",
        ),
        (
            None,
            Some(vec![0.0, 0.0, f32::INFINITY, 0.0]),
            "sinks must be finite, got inf at index 2",
        ),
    ] {
        let mut c = base.clone();
        c.alibi_slopes = slopes;
        c.sinks = sinks;
        let n = 2 * 4 * 4 * 8;
        match ctx().forward_host(
            &c,
            &vec![0.5f32; n],
            &vec![0.5f32; n / 2],
            &vec![0.5f32; n / 2],
        ) {
            Err(e @ Error::InvalidConfig(_)) => {
                assert!(e.to_string().contains(want), "{e}")
            }
            other => panic!("expected InvalidConfig naming {want:?}, got {other:?}"),
        }
    }
    // key lengths: one per batch, none past seq_kv
    for (lens, want) in [
        (
            vec![4],
            "seqlens_kv must hold one key length per batch ([batch] = [2]), got 1",
        ),
        (
            vec![4, 5],
            "seqlens_kv[1] must be at most seq_kv = 4, got 5",
        ),
    ] {
        let mut c = base.clone();
        c.seqlens_kv = Some(lens);
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains(want), "{msg}");
    }
    // left paddings: one per batch, none past the batch's key length
    for (lens, pad, want) in [
        (
            None,
            vec![0],
            "leftpad_kv must hold one start per batch ([batch] = [2]), got 1",
        ),
        (
            None,
            vec![4, 5],
            "leftpad_kv[1] must be at most batch 1's key length 4, got 5",
        ),
        (
            Some(vec![4, 2]),
            vec![1, 3],
            "leftpad_kv[1] must be at most batch 1's key length 2, got 3",
        ),
    ] {
        let mut c = base.clone();
        c.seqlens_kv = lens;
        c.leftpad_kv = Some(pad);
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains(want), "{msg}");
    }
    // both layouts of slopes are accepted
    for n in [4, 8] {
        let mut c = base.clone();
        c.alibi_slopes = Some(vec![0.25; n]);
        c.sinks = Some(vec![1.0; 4]);
        c.validate().unwrap();
    }
}

#[test]
fn per_batch_alibi_slopes_past_the_uniform_extras_are_a_device_limit_error() {
    // 1,025 batches x 16 heads of slopes, plus 16 sinks: past the 16,384 f32 words of the
    // extras uniform; one slope per head fits
    let mut c = cfg(1025, 1, 1, 16, 16, 4, false);
    c.alibi_slopes = Some(vec![0.5; 1025 * 16]);
    c.sinks = Some(vec![0.0; 16]);
    let env = ctx().plan_env();
    match flash_attn_wgpu::unstable::plan::forward(&c, flash_attn_wgpu::DType::F32, &env) {
        Err(Error::DeviceLimit {
            what,
            needed,
            limit,
            hint,
        }) => {
            assert!(what.contains("ALiBi slopes, sinks, key lengths"), "{what}");
            assert_eq!((needed, limit), ((1025 * 16 + 16) * 4, 65536));
            assert!(hint.contains("[heads_q]"), "{hint}");
        }
        other => panic!(
            "expected DeviceLimit, got {:?}",
            other.map(|p| p.steps.len())
        ),
    }
    c.alibi_slopes = Some(vec![0.5; 16]);
    assert!(
        flash_attn_wgpu::unstable::plan::forward(&c, flash_attn_wgpu::DType::F32, &env).is_ok()
    );
}

#[test]
fn block_masks_that_do_not_fit_the_call_are_invalid_and_named() {
    // batch 2, heads_q 4, 10 x 7 in blocks of 4 x 3: grids of 3 x 3
    let c = cfg(2, 10, 7, 4, 2, 8, false);
    let mask = |bq, bkv, b, h, n| flash_attn_wgpu::BlockMask::new(bq, bkv, b, h, vec![true; n]);
    for (m, want) in [
        (mask(0, 3, 1, 1, 9), "block_mask.block_q must be in 1..=2^32-1 (rows or keys per block), got 0"),
        (mask(4, 0, 1, 1, 9), "block_mask.block_kv must be in 1..=2^32-1 (rows or keys per block), got 0"),
        (mask(4, 3, 3, 1, 27), "block_mask.batch must be 1 (broadcast) or the call's batch = 2, got 3"),
        (mask(4, 3, 1, 2, 18), "block_mask.heads must be 1 (broadcast) or the call's heads_q = 4, got 2"),
        (
            mask(4, 3, 2, 4, 71),
            "block_mask.blocks must hold [batch, heads, ceil(seq_q / block_q), ceil(seq_kv / block_kv)] = [2, 4, 3, 3] = 72 entries, got 71",
        ),
    ] {
        let mut cf = c.clone();
        cf.block_mask = Some(m);
        match cf.validate() {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(want), "{msg}"),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
        let (q, kv) = data(&cf);
        assert!(ctx().forward_host(&cf, &q, &kv, &kv).is_err());
    }
    let mut ok = c.clone();
    ok.block_mask = Some(mask(4, 3, 2, 1, 18));
    ok.validate().unwrap();
}

#[test]
fn boolean_masks_that_do_not_fit_the_call_are_invalid_and_named() {
    use flash_attn_wgpu::BoolMask;
    let c = cfg(2, 10, 7, 4, 2, 8, false);
    let mut huge = BoolMask::filled((1, 1, 1, 1), true);
    (huge.seq_q, huge.seq_kv) = (65536, 65536);
    let mut big = c.clone();
    (big.seq_q, big.seq_kv) = (65536, 65536);
    for (cf, m, want) in [
        (&c, BoolMask::filled((3, 1, 10, 7), true), "mask.batch must be 1 (broadcast) or the call's batch = 2, got 3"),
        (&c, BoolMask::filled((1, 2, 10, 7), true), "mask.heads must be 1 (broadcast) or the call's heads_q = 4, got 2"),
        (&c, BoolMask::filled((2, 4, 9, 7), true), "mask.seq_q must be the call's seq_q = 10 (mask broadcasts over batch and heads only), got 9"),
        (&c, BoolMask::filled((1, 1, 10, 8), true), "mask.seq_kv must be the call's seq_kv = 7"),
        (&big, huge, "mask [1, 1, 65536, 65536] has more than 4294967295 entries"),
    ] {
        let mut cf = cf.clone();
        cf.mask = Some(m);
        match cf.validate() {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(want), "{msg}"),
            other => panic!("expected InvalidConfig naming {want:?}, got {other:?}"),
        }
    }
    match BoolMask::from_bools((1, 1, 10, 7), &[true; 69]) {
        Err(Error::InvalidConfig(msg)) => assert!(
            msg.contains("mask entries must be [batch, heads, seq_q, seq_kv] = [1, 1, 10, 7] = 70 values, got 69"),
            "{msg}"
        ),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    let mut ok = c.clone();
    ok.mask = Some(BoolMask::filled((2, 1, 10, 7), false));
    ok.validate().unwrap();
    let (q, kv) = data(&ok);
    // every pair hidden: out 0, lse -inf
    let f = ctx().forward_host(&ok, &q, &kv, &kv).unwrap();
    assert!(f.out.iter().all(|&x| x == 0.0));
    assert!(f.lse.iter().all(|&x| x == f32::NEG_INFINITY));
}

#[test]
fn a_boolean_mask_or_a_bias_past_one_binding_is_a_device_limit_error_naming_it() {
    let limit = ctx().device().limits().max_storage_buffer_binding_size;
    // the pair data of `c` needs `needed` bytes: past the binding, a DeviceLimit naming it;
    // an adapter that binds it has nothing to refuse
    let refused = |c: &AttentionConfig, needed: u64| {
        if limit >= needed {
            return;
        }
        let (q, kv) = data(c);
        match ctx().forward_host(c, &q, &kv, &kv) {
            Err(Error::DeviceLimit {
                what, needed: n, ..
            }) => {
                assert!(
                    what.contains("pair data (mask bits and bias entries)"),
                    "{what}"
                );
                assert_eq!(n, needed);
            }
            other => panic!("expected DeviceLimit, got {:?}", other.map(|f| f.lse.len())),
        }
    };
    // two heads of 32768 x 32768 bits: 256 MiB, past lavapipe's 128 MiB storage binding
    let mut c = cfg(1, 32768, 32768, 2, 1, 4, false);
    c.mask = Some(flash_attn_wgpu::BoolMask::filled(
        (1, 2, 32768, 32768),
        true,
    ));
    refused(&c, 256 << 20);
    // a bias past one binding, in the same binding: 6000 x 6000 f32 entries, 144 MB
    let mut c = cfg(1, 6000, 6000, 1, 1, 4, false);
    c.bias = Some(
        flash_attn_wgpu::ScoreBias::new((1, 1, 6000, 6000), &vec![0.25f32; 36_000_000]).unwrap(),
    );
    refused(&c, 36_000_000 * 4);
}

#[test]
fn varlen_boundaries_that_do_not_fit_the_call_are_invalid_and_named() {
    // two sequences packed: 3 + 4 rows, 5 + 2 keys
    let packed = |q: Vec<u32>, kv: Vec<u32>| AttentionConfig::packed(q, kv, 2, 1, 8);
    let ok = packed(vec![0, 3, 7], vec![0, 5, 7]);
    ok.validate().unwrap();
    let mut batched = ok.clone();
    batched.batch = 2;
    let mut padded = ok.clone();
    padded.seqlens_kv = Some(vec![7]);
    let mut short = ok.clone();
    short.seq_kv = 9;
    for (cf, want) in [
        (packed(vec![0, 3, 7], vec![0, 7]), "cu_seqlens_q and cu_seqlens_kv must both hold sequences + 1 >= 2 offsets, got 3 and 2"),
        (packed(vec![7], vec![7]), "must both hold sequences + 1 >= 2 offsets, got 1 and 1"),
        (packed(vec![1, 3, 7], vec![0, 5, 7]), "varlen.cu_seqlens_q must start at 0, got 1"),
        (packed(vec![0, 3, 7], vec![0, 5, 4]), "varlen.cu_seqlens_kv must not decrease, got cu_seqlens_kv[2] = 4 after cu_seqlens_kv[1] = 5"),
        (short, "varlen.cu_seqlens_kv must end at the packed total (seq_kv = 9), got 7"),
        (batched, "a varlen call packs its sequences into batch 1 (seq_q and seq_kv the totals), got batch = 2"),
        (padded, "seqlens_kv and leftpad_kv must be None in a varlen call"),
    ] {
        match cf.validate() {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(want), "{msg}"),
            other => panic!("expected InvalidConfig naming {want:?}, got {other:?}"),
        }
        let (q, kv) = data(&cf);
        assert!(ctx().forward_host(&cf, &q, &kv, &kv).is_err());
    }
}

#[test]
fn a_block_mask_past_the_uniform_extras_is_a_device_limit_error() {
    // 32768 x 32768 in blocks of 16: 2048 x 2048 bits = 131,072 words, past 16,384; blocks of
    // 128 (256 x 256 bits = 2,048 words) fit
    let mut c = cfg(1, 32768, 32768, 1, 1, 4, false);
    c.block_mask = Some(flash_attn_wgpu::BlockMask::from_fn(
        16,
        16,
        (1, 1, 32768, 32768),
        |_, _, r, col| r == col,
    ));
    let env = ctx().plan_env();
    match flash_attn_wgpu::unstable::plan::forward(&c, flash_attn_wgpu::DType::F32, &env) {
        Err(Error::DeviceLimit {
            what, needed, hint, ..
        }) => {
            assert!(what.contains("block-mask bits"), "{what}");
            assert_eq!(needed, 131072 * 4);
            assert!(hint.contains("larger blocks"), "{hint}");
        }
        other => panic!(
            "expected DeviceLimit, got {:?}",
            other.map(|p| p.steps.len())
        ),
    }
    c.block_mask = Some(flash_attn_wgpu::BlockMask::from_fn(
        128,
        128,
        (1, 1, 32768, 32768),
        |_, _, r, col| r == col,
    ));
    assert!(
        flash_attn_wgpu::unstable::plan::forward(&c, flash_attn_wgpu::DType::F32, &env).is_ok()
    );
}

#[test]
fn a_window_side_past_2_pow_30_is_invalid_and_names_the_side() {
    for (left, right, side) in [
        (Some((1 << 30) + 1), None, "window.left"),
        (Some(4), Some(usize::MAX), "window.right"),
    ] {
        let mut c = cfg(1, 4, 4, 1, 1, 8, false);
        c.window = flash_attn_wgpu::Window::new(left, right);
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains(side) && msg.contains("1073741824"), "{msg}");
        // and the call refuses it before touching the device
        let x = vec![0.5f32; 4 * 8];
        assert!(matches!(
            ctx().forward_host(&c, &x, &x, &x),
            Err(Error::InvalidConfig(_))
        ));
    }
    // the largest side is accepted, and sees everything at this size
    let mut c = cfg(1, 4, 4, 1, 1, 8, false);
    c.window = flash_attn_wgpu::Window::new(Some(1 << 30), Some(1 << 30));
    assert!(c.validate().is_ok());
}

#[test]
fn a_dropout_probability_outside_0_to_1_is_invalid_and_named() {
    for p in [-0.1f32, 1.0, 1.5, f32::NAN, f32::INFINITY] {
        let mut cf = cfg(1, 4, 4, 1, 1, 8, false);
        cf.dropout = Some(flash_attn_wgpu::Dropout::new(p, 1, 2));
        let err = cf.validate().unwrap_err();
        assert!(
            matches!(err, flash_attn_wgpu::Error::InvalidConfig(_)),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("dropout.p must be in [0, 1)") && msg.contains(&format!("got {p}")),
            "{msg}"
        );
        // refused by the calls too, before anything runs
        let d = vec![0.5f32; 4 * 8];
        assert!(common::ctx().forward_host(&cf, &d, &d, &d).is_err());
    }
    let mut cf = cfg(1, 4, 4, 1, 1, 8, false);
    cf.dropout = Some(flash_attn_wgpu::Dropout::new(0.0, 1, 2));
    assert!(cf.validate().is_ok());
}

#[test]
fn a_softcap_that_is_not_a_positive_number_is_invalid() {
    for c in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let mut cf = cfg(1, 4, 4, 1, 1, 8, false);
        cf.softcap = Some(c);
        let msg = cf.validate().unwrap_err().to_string();
        assert!(msg.contains("softcap") && msg.contains("above 0"), "{msg}");
    }
}

#[test]
fn tensor_of_wrong_shape_is_rejected() {
    let c = cfg(1, 8, 8, 2, 2, 16, false);
    let (q, kv) = data(&c);
    let x = ctx();
    let qt = x.upload(&q, &[1, 8, 2, 16]).unwrap();
    let kt = x.upload(&kv, &[1, 8, 16, 2]).unwrap();
    match x.forward(&c, &qt, &kt, &kt) {
        Err(Error::Shape {
            tensor: TensorRole::K,
            expected,
            got,
        }) => {
            assert_eq!(expected, vec![1, 8, 2, 16]);
            assert_eq!(got, vec![1, 8, 16, 2]);
        }
        other => panic!("expected Shape error, got {other:?}"),
    }
}

#[test]
fn upload_with_mismatched_shape_is_rejected() {
    assert!(ctx().upload(&[1.0; 5], &[2, 3]).is_err());
    assert!(ctx().upload::<f32>(&[], &[0, 3]).is_err());
}

#[test]
fn naive_reports_its_memory_limit_and_tiled_has_none() {
    // One (batch, head) slice's seq_q x seq_kv f32 score matrix is over the binding limit.
    let limit = ctx()
        .adapter_info()
        .max_storage_binding_bytes
        .min(u32::MAX as u64);
    let seq_q = 4;
    let seq_kv = (limit / (4 * seq_q as u64) + 1) as usize;
    let mut c = cfg(1, seq_q, seq_kv, 1, 1, 1, false);
    c.algorithm = Algorithm::Naive;
    let q = vec![0.5f32; seq_q];
    let mut rng_kv: Vec<f32> = (0..seq_kv)
        .map(|j| ((j * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    rng_kv[seq_kv - 1] = 3.0;
    match ctx().forward_host(&c, &q, &rng_kv, &rng_kv) {
        Err(Error::DeviceLimit {
            needed,
            limit: l,
            hint,
            what,
        }) => {
            assert_eq!(needed, (seq_q * seq_kv * 4) as u64);
            assert_eq!(l, limit);
            assert!(hint.contains("Algorithm::Tiled"), "{hint}");
            assert!(what.contains("seq_q x seq_kv"), "{what}");
        }
        other => panic!("expected DeviceLimit, got {other:?}"),
    }
    // The naive backward materializes the same matrices and refuses the same way.
    let lse = vec![0.0f32; seq_q];
    match ctx().backward_host(&c, &q, &rng_kv, &rng_kv, &q, &lse, &q) {
        Err(Error::DeviceLimit { hint, .. }) => assert!(hint.contains("Algorithm::Tiled")),
        other => panic!("expected DeviceLimit from the naive backward, got {other:?}"),
    }
    c.algorithm = Algorithm::Tiled;
    let got = ctx().forward_host(&c, &q, &rng_kv, &rng_kv).unwrap();
    let want = flash_attn_wgpu::unstable::reference::forward(&c, &q, &rng_kv, &rng_kv);
    // f32 sums over ~8M keys: allow 1e-3 relative (measured ~3e-4; the naive kernels'
    // plain per-thread sums do worse at 1M keys).
    for (i, (g, w)) in got.out.iter().zip(&want.out).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= 1e-3 * w.abs(),
            "out[{i}]: {g} vs {w}"
        );
    }
    for (i, (g, w)) in got.lse.iter().zip(&want.lse).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= 1e-4 * w.abs(),
            "lse[{i}]: {g} vs {w}"
        );
    }
}

/// A config that is invalid in one random way, with slices sized for what was asked.
fn invalid_case() -> impl Strategy<Value = (AttentionConfig, i32)> {
    (
        (
            0usize..3,
            0usize..5,
            0usize..5,
            0usize..5,
            1usize..4,
            0usize..300,
        ),
        any::<bool>(),
        prop_oneof![
            Just(None),
            Just(Some(f32::NAN)),
            Just(Some(f32::INFINITY)),
            Just(Some(0.5))
        ],
        -2i32..3,
    )
        .prop_map(|((b, sq, skv, hq, hkv, d), causal, scale, slice_delta)| {
            let mut c = AttentionConfig::new(b, sq, skv, hq, hkv, d);
            c.causal = causal;
            c.softmax_scale = scale;
            (c, slice_delta)
        })
        .prop_filter("must be invalid", |(c, delta)| {
            c.validate().is_err() || *delta != 0
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn random_invalid_input_returns_err_and_never_panics((c, delta) in invalid_case()) {
        let (q, kv) = data(&c);
        let resize = |mut x: Vec<f32>| {
            let n = (x.len() as i64 + delta as i64).max(0) as usize;
            x.resize(n, 0.1);
            x
        };
        let q = resize(q);
        for alg in [Algorithm::Tiled, Algorithm::Naive] {
            let mut c = c.clone();
            c.algorithm = alg;
            prop_assert!(ctx().forward_host(&c, &q, &kv, &kv).is_err());
            let lse = vec![0.0; c.batch * c.heads_q * c.seq_q];
            prop_assert!(ctx().backward_host(&c, &q, &kv, &kv, &q, &lse, &q).is_err());
        }
    }
}

#[test]
fn mixing_dtypes_in_one_call_names_the_tensor_and_both_dtypes() {
    let c = cfg(1, 8, 8, 2, 2, 16, false);
    let (q, kv) = data(&c);
    let ctx = ctx();
    let q = ctx.upload(&q, &c.q_shape()).unwrap();
    let k: Vec<half::f16> = kv.iter().map(|&x| half::f16::from_f32(x)).collect();
    let k = ctx.upload(&k, &c.kv_shape()).unwrap();
    let v = ctx.upload(&kv, &c.kv_shape()).unwrap();
    let err = ctx.forward(&c, &q, &k, &v).unwrap_err();
    match &err {
        Error::DType {
            tensor,
            expected,
            got,
        } => {
            assert_eq!(tensor, "k");
            assert_eq!((*expected, *got), (DType::F32, DType::F16));
        }
        other => panic!("expected DType, got {other:?}"),
    }
    assert!(
        err.to_string().contains("k has dtype f16, expected f32"),
        "{err}"
    );
}

#[test]
fn backward_needs_lse_in_f32_whatever_the_dtype() {
    let c = cfg(1, 8, 8, 1, 1, 16, false);
    let ctx = ctx();
    let x: Vec<half::bf16> = vec![half::bf16::from_f32(0.5); 8 * 16];
    let t = |d: &[half::bf16]| ctx.upload(d, &c.q_shape()).unwrap();
    let (q, k, v, out, d_out) = (t(&x), t(&x), t(&x), t(&x), t(&x));
    let lse_bf16 = ctx
        .upload(&[half::bf16::from_f32(1.0); 8], &c.lse_shape())
        .unwrap();
    match ctx.backward(&c, &q, &k, &v, &out, &lse_bf16, &d_out) {
        Err(Error::DType {
            tensor,
            expected: DType::F32,
            got: DType::BF16,
        }) => assert_eq!(tensor, "lse"),
        other => panic!("expected DType for lse, got {other:?}"),
    }
}

#[test]
fn downloading_as_the_wrong_type_is_a_dtype_error() {
    let c = cfg(1, 4, 4, 1, 1, 8, false);
    let ctx = ctx();
    let x: Vec<half::f16> = vec![half::f16::from_f32(0.25); 32];
    let q = ctx.upload(&x, &c.q_shape()).unwrap();
    let f = ctx.forward(&c, &q, &q, &q).unwrap();
    // expected: what the call asked for; got: what the tensor holds
    match ctx.download::<f32>(&f.out) {
        Err(Error::DType {
            tensor,
            expected: DType::F32,
            got: DType::F16,
        }) => assert_eq!(tensor, "out"),
        other => panic!("expected DType, got {other:?}"),
    }
    assert_eq!(ctx.download::<half::f16>(&f.out).unwrap().len(), 32);
    assert!(matches!(
        ctx.download::<half::bf16>(&f.lse),
        Err(Error::DType { .. })
    ));
}

#[test]
fn casting_needs_an_f32_source() {
    let ctx = ctx();
    let t = ctx.upload(&[half::bf16::ONE; 3], &[3]).unwrap();
    assert!(matches!(
        ctx.cast(&t, DType::F16),
        Err(Error::DType {
            expected: DType::F32,
            got: DType::BF16,
            ..
        })
    ));
}

#[test]
fn a_tensor_from_another_context_is_refused_by_every_call() {
    let c = cfg(1, 8, 8, 1, 1, 16, false);
    let (q, kv) = data(&c);
    let a = flash_attn_wgpu::Context::new().unwrap();
    let b = ctx();
    let qa = a.upload(&q, &c.q_shape()).unwrap();
    let kb = b.upload(&kv, &c.kv_shape()).unwrap();
    let vb = b.upload(&kv, &c.kv_shape()).unwrap();
    match b.forward(&c, &qa, &kb, &vb) {
        Err(Error::ForeignTensor { tensor }) => assert_eq!(tensor, "q"),
        other => panic!("expected ForeignTensor for q, got {other:?}"),
    }
    match b.download::<f32>(&qa) {
        Err(e @ Error::ForeignTensor { .. }) => {
            assert!(e.to_string().contains("another Context"), "{e}")
        }
        other => panic!("expected ForeignTensor, got {other:?}"),
    }
    assert!(matches!(
        b.cast(&qa, DType::F16),
        Err(Error::ForeignTensor { .. })
    ));
    let fb = b
        .forward(&c, &b.upload(&q, &c.q_shape()).unwrap(), &kb, &vb)
        .unwrap();
    match b.backward(&c, &qa, &kb, &vb, &fb.out, &fb.lse, &fb.out) {
        Err(Error::ForeignTensor { tensor }) => assert_eq!(tensor, "q"),
        other => panic!("expected ForeignTensor, got {other:?}"),
    }
    let la = a
        .upload(&b.download::<f32>(&fb.lse).unwrap(), &c.lse_shape())
        .unwrap();
    let qb = b.upload(&q, &c.q_shape()).unwrap();
    match b.backward(&c, &qb, &kb, &vb, &fb.out, &la, &fb.out) {
        Err(Error::ForeignTensor { tensor }) => assert_eq!(tensor, "lse"),
        other => panic!("expected ForeignTensor for lse, got {other:?}"),
    }
    // every algorithm and dtype: the check comes before anything runs
    fn each<T: flash_attn_wgpu::Element>(
        a: &flash_attn_wgpu::Context,
        b: &flash_attn_wgpu::Context,
        c: &AttentionConfig,
        q: &[f32],
        kv: &[f32],
    ) {
        use flash_attn_wgpu::dtype::from_f32_slice;
        let (q, kv) = (from_f32_slice::<T>(q), from_f32_slice::<T>(kv));
        let (qb, kb) = (
            b.upload(&q, &c.q_shape()).unwrap(),
            b.upload(&kv, &c.kv_shape()).unwrap(),
        );
        let va = a.upload(&kv, &c.kv_shape()).unwrap();
        for alg in [Algorithm::Tiled, Algorithm::Naive] {
            let mut c = c.clone();
            c.algorithm = alg;
            match b.forward(&c, &qb, &kb, &va) {
                Err(Error::ForeignTensor { tensor }) => assert_eq!(tensor, "v"),
                other => panic!(
                    "{alg:?} {}: expected ForeignTensor for v, got {other:?}",
                    T::DTYPE
                ),
            }
            let f = b.forward(&c, &qb, &kb, &kb).unwrap();
            let d_out_a = a.upload(&q, &c.q_shape()).unwrap();
            match b.backward(&c, &qb, &kb, &kb, &f.out, &f.lse, &d_out_a) {
                Err(Error::ForeignTensor { tensor }) => assert_eq!(tensor, "d_out"),
                other => panic!(
                    "{alg:?} {}: expected ForeignTensor for d_out, got {other:?}",
                    T::DTYPE
                ),
            }
        }
    }
    each::<f32>(&a, b, &c, &q, &kv);
    each::<half::f16>(&a, b, &c, &q, &kv);
    each::<half::bf16>(&a, b, &c, &q, &kv);
}

#[test]
fn element_counts_that_overflow_are_invalid_configs_not_panics() {
    let huge = 1usize << 62;
    let c = cfg(huge, huge, huge, 4, 4, 1, false);
    match c.validate() {
        Err(Error::InvalidConfig(m)) => assert!(m.contains("64 bits"), "{m}"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    assert!(matches!(
        ctx().forward_host::<f32>(&c, &[0.0], &[0.0], &[0.0]),
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        ctx().upload(&[1.0f32], &[usize::MAX, 2]),
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        ctx().zeros(&[usize::MAX, 3]),
        Err(Error::InvalidConfig(_))
    ));
}

#[test]
fn context_can_be_debug_printed() {
    let s = format!("{:?}", ctx());
    assert!(s.contains("Context") && s.contains("adapter"), "{s}");
}

#[test]
fn the_coop_variant_is_unsupported_without_cooperative_matrices() {
    // A context without cooperative matrices (one made from a device: `from_wgpu` never uses
    // them, so this runs on every adapter, lavapipe 26's 8x8x8 included): a typed Unsupported
    // naming the variant and what the context lacks; the tuning is unchanged.
    let (device, queue) =
        common::device_exactly(None, wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP);
    let ctx = flash_attn_wgpu::Context::from_wgpu(device, queue).unwrap();
    let before = ctx.tuning();
    let err = ctx
        .set_tuning(flash_attn_wgpu::Tuning {
            variant: flash_attn_wgpu::Variant::Coop,
            ..before
        })
        .unwrap_err();
    match err {
        flash_attn_wgpu::Error::Unsupported {
            feature,
            backend,
            reason,
        } => {
            assert_eq!(backend, flash_attn_wgpu::Backend::Wgpu);
            assert!(feature.contains("Variant::Coop"), "{feature}");
            assert!(reason.contains("Variant::Blocks"), "{reason}");
        }
        e => panic!("expected Unsupported, got {e:?}"),
    }
    assert_eq!(ctx.tuning(), before);
}

#[test]
fn tiles_for_a_head_dim_out_of_range_is_a_typed_error_not_a_panic_or_a_wrap() {
    // 1 << 27 overflowed the workgroup-memory arithmetic; 1 << 32 truncated to 0
    let ctx = ctx();
    for d in [0, 257, 1 << 27, 1 << 32] {
        assert!(
            matches!(
                ctx.tiles_for(Kernel::Flash(Variant::Rows, Pass::Forward), d),
                Err(Error::InvalidConfig(m)) if m.contains("head_dim")
            ),
            "{d}"
        );
    }
}
