//! The public merge of partial results over disjoint key shards: attention over each shard,
//! merged, equals attention over all the keys (forward, and the backward through the merged
//! out and lse), in every dtype, with rows some shards (or all) let see no key; the f64
//! reference merge agrees on random shards; bad shards are typed errors.

use crate::common;

use common::shards::{case, key_range, merged_equals_full};
use common::{assert_close_tol, assert_lse_close, ctx, fresh_seed, random};
use flash_attn_wgpu::{unstable::reference, AttentionConfig, DType, Error, Forward, HostForward};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[test]
fn merged_key_shards_equal_attention_over_all_keys_in_every_dtype() {
    for parts in [2, 3, 5] {
        merged_equals_full::<_, f32>(ctx(), parts);
    }
    merged_equals_full::<_, half::f16>(ctx(), 3);
    merged_equals_full::<_, half::bf16>(ctx(), 4);
    // half outputs in packed storage (stored with atomicOr)
    let packed = flash_attn_wgpu::Context::new().unwrap();
    packed
        .set_tuning(flash_attn_wgpu::Tuning {
            half_storage: flash_attn_wgpu::HalfStorage::Packed,
            ..packed.tuning()
        })
        .unwrap();
    merged_equals_full::<_, half::f16>(&packed, 2);
}

#[test]
fn one_shard_merges_to_itself_bit_for_bit() {
    let c = AttentionConfig::new(1, 7, 19, 2, 2, 16);
    let mut rng = StdRng::seed_from_u64(fresh_seed());
    let q = random(&mut rng, 7 * 2 * 16, 1.0);
    let k = random(&mut rng, 19 * 2 * 16, 1.0);
    let f = ctx().forward_host(&c, &q, &k, &k).unwrap();
    let m = ctx()
        .merge_host(&c.q_shape(), std::slice::from_ref(&f))
        .unwrap();
    assert_eq!(m, f);
}

#[test]
fn sharded_backward_through_the_merged_out_and_lse_gives_the_full_gradients() {
    let case = case(3);
    let c = &case.cfg;
    let msg = case.describe();
    let mut rng = StdRng::seed_from_u64(case.seed ^ 2);
    let nq = c.batch * c.seq_q * c.heads_q * c.head_dim;
    let nk = c.batch * c.seq_kv * c.heads_kv * c.head_dim;
    let (q, k, v, d_out) = (
        random(&mut rng, nq, 1.5),
        random(&mut rng, nk, 1.5),
        random(&mut rng, nk, 1.0),
        random(&mut rng, nq, 1.0),
    );
    let x = ctx();
    let shards: Vec<HostForward> = case
        .shards
        .iter()
        .map(|&s| {
            let sc = case.shard_cfg(s);
            x.forward_host(&sc, &q, &key_range(c, &k, s), &key_range(c, &v, s))
                .unwrap()
        })
        .collect();
    let m = x.merge_host(&c.q_shape(), &shards).unwrap();
    let mut dq = vec![0.0f32; nq];
    let (mut dk, mut dv) = (vec![0.0f32; nk], vec![0.0f32; nk]);
    let row = c.heads_kv * c.head_dim;
    for &s in &case.shards {
        let sc = case.shard_cfg(s);
        let g = x
            .backward_host(
                &sc,
                &q,
                &key_range(c, &k, s),
                &key_range(c, &v, s),
                &m.out,
                &m.lse,
                &d_out,
            )
            .unwrap();
        dq.iter_mut().zip(&g.dq).for_each(|(a, b)| *a += b);
        // the shard's keys go back to their place in every batch
        let len = (s.1 - s.0) * row;
        for b in 0..c.batch {
            let at = b * c.seq_kv * row + s.0 * row;
            dk[at..at + len].copy_from_slice(&g.dk[b * len..(b + 1) * len]);
            dv[at..at + len].copy_from_slice(&g.dv[b * len..(b + 1) * len]);
        }
    }
    let want = reference::backward(&case.full_cfg(), &q, &k, &v, &d_out);
    assert_close_tol("dq", &dq, &want.dq, 2e-4, &msg);
    assert_close_tol("dk", &dk, &want.dk, 2e-4, &msg);
    assert_close_tol("dv", &dv, &want.dv, 2e-4, &msg);
}

#[test]
fn random_shards_merge_as_the_f64_reference_merges_them() {
    let seed = fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let shape = [2, 5, 3, 40];
    let n: usize = shape.iter().product();
    let rows = 2 * 5 * 3;
    let shards: Vec<HostForward> = (0..4)
        .map(|s| HostForward {
            out: random(&mut rng, n, 3.0),
            lse: (0..rows)
                .map(|r| match (r, s) {
                    // row 0: no shard sees a key; row 1: only shard 2 does
                    (0, _) | (1, 0 | 1 | 3) => f32::NEG_INFINITY,
                    _ if rng.random_bool(0.2) => f32::NEG_INFINITY,
                    _ => rng.random_range(-30.0f32..30.0),
                })
                .collect(),
        })
        .collect();
    // a shard whose row sees no key has out 0 there, as the forward gives it
    let shards: Vec<HostForward> = shards
        .into_iter()
        .map(|mut s| {
            for r in 0..rows {
                if s.lse[r] == f32::NEG_INFINITY {
                    let (bh, i) = (r / 5, r % 5);
                    let (b, h) = (bh / 3, bh % 3);
                    let o = ((b * 5 + i) * 3 + h) * 40;
                    s.out[o..o + 40].fill(0.0);
                }
            }
            s
        })
        .collect();
    let as64: Vec<(Vec<f64>, Vec<f64>)> = shards
        .iter()
        .map(|s| {
            (
                s.out.iter().map(|&x| x as f64).collect(),
                s.lse.iter().map(|&x| x as f64).collect(),
            )
        })
        .collect();
    let refs: Vec<(&[f64], &[f64])> = as64.iter().map(|(o, l)| (&o[..], &l[..])).collect();
    let want = reference::merge(shape, &refs);
    let got = ctx().merge_host(&shape, &shards).unwrap();
    let msg = format!("seed {seed}");
    assert_close_tol("out", &got.out, &want.out, 1e-5, &msg);
    assert_lse_close(&got.lse, &want.lse, &msg);
    assert_eq!(got.lse[0], f32::NEG_INFINITY);
    assert!(got.out[..40].iter().all(|x| *x == 0.0));
    // row 1 is shard 2's row, exactly
    assert_eq!(got.lse[1], shards[2].lse[1]);
    // a NaN lse (a row that saw a NaN) stays NaN
    let mut poisoned = shards.clone();
    poisoned[1].lse[7] = f32::NAN;
    let got = ctx().merge_host(&shape, &poisoned).unwrap();
    assert!(got.lse[7].is_nan());
}

#[test]
fn bad_shards_are_typed_errors() {
    let x = ctx();
    let f = |shape: &[usize], dtype: DType| -> Forward {
        let [b, s, h, _] = shape.try_into().unwrap();
        Forward {
            out: x.zeros_of(shape, dtype).unwrap(),
            lse: x.zeros(&[b, h, s]).unwrap(),
        }
    };
    let good = [1, 4, 2, 8];
    let invalid = |r: flash_attn_wgpu::Result<Forward>, want: &str| match r {
        Err(Error::InvalidConfig(m)) => assert!(m.contains(want), "{m}"),
        other => panic!("expected InvalidConfig with {want:?}, got {other:?}"),
    };
    invalid(x.merge(&[]), "at least one shard");
    invalid(
        x.merge(&[f(&good, DType::F32), f(&[1, 4, 2, 16], DType::F32)]),
        "shard 1's out has shape [1, 4, 2, 16], expected [1, 4, 2, 8]",
    );
    invalid(x.merge(&[f(&[1, 4, 2, 520], DType::F32)]), "head_dim");
    let three_d = Forward {
        out: x.zeros(&[4, 2, 8]).unwrap(),
        lse: x.zeros(&[2, 4]).unwrap(),
    };
    invalid(x.merge(&[three_d]), "4 dimensions");
    let wrong_lse = Forward {
        out: x.zeros(&good).unwrap(),
        lse: x.zeros(&[1, 4, 2]).unwrap(),
    };
    invalid(
        x.merge(&[wrong_lse]),
        "shard 0's lse has shape [1, 4, 2], expected [1, 2, 4]",
    );
    match x.merge(&[f(&good, DType::F32), f(&good, DType::F16)]) {
        Err(Error::DType {
            tensor,
            expected,
            got,
        }) => {
            assert_eq!(tensor, "shard 1's out");
            assert_eq!((expected, got), (DType::F32, DType::F16));
        }
        other => panic!("expected DType, got {other:?}"),
    }
    let half_lse = Forward {
        out: x.zeros(&good).unwrap(),
        lse: x.zeros_of(&[1, 2, 4], DType::F16).unwrap(),
    };
    assert!(matches!(x.merge(&[half_lse]), Err(Error::DType { .. })));
    let other = flash_attn_wgpu::Context::new().unwrap();
    let foreign = Forward {
        out: other.zeros(&good).unwrap(),
        lse: other.zeros(&[1, 2, 4]).unwrap(),
    };
    match x.merge(&[f(&good, DType::F32), foreign]) {
        Err(Error::ForeignTensor { tensor }) => assert_eq!(tensor, "shard 1's out"),
        other => panic!("expected ForeignTensor, got {other:?}"),
    }
    // host shards: lengths and +inf lse
    let h = HostForward {
        out: vec![0.0f32; 64],
        lse: vec![0.0f32; 8],
    };
    assert!(matches!(
        x.merge_host(&[1, 4, 2, 4], std::slice::from_ref(&h)),
        Err(Error::SliceLength { .. })
    ));
    let mut inf = h.clone();
    inf.lse[3] = f32::INFINITY;
    assert!(matches!(
        x.merge_host(&good, &[inf]),
        Err(Error::InvalidValue { index: 3, .. })
    ));
}
