//! The burn operation against the library's f64 reference and against burn's own unfused
//! attention under autodiff: forward and dq, dk, dv, on fresh random data of odd sizes, and
//! typed errors for bad calls. One burn runtime per process, so one test function walks
//! the cases (each case names itself in its failure).

use burn::tensor::module::attention_fallback;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, DType, Device, Tensor, TensorData};
use flash_attn_burn::{
    flash_attention, flash_attention_with_bias, flash_attention_with_kvcache,
    flash_attention_with_lse, Error, Options, Window,
};
use flash_attn_wgpu::unstable::reference;
use flash_attn_wgpu::{AttentionConfig, ScoreBias};
use rand::{Rng, SeedableRng};

/// Host data in the library's layout `[batch, seq, heads, d]`.
fn random(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// A leaf of burn's autodiff in dtype `dt`, `[batch, seq, heads, d]` on the host, and its
/// view in burn's `[batch, heads, seq, d]` (strided: the operation reads it in place).
fn leaf(data: &[f32], shape: [usize; 4], dt: DType, dev: &Device) -> (Tensor<4>, Tensor<4>) {
    let t = Tensor::<4>::from_data(TensorData::new(data.to_vec(), shape), dev)
        .cast(dt)
        .require_grad();
    (t.clone(), t.swap_dims(1, 2))
}

/// A burn tensor's values as f32 in its logical order.
fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.cast(DType::F32)
        .into_data()
        .try_to_vec::<f32>()
        .expect("f32 data")
}

fn max_err(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-3f64, |m, x| m.max(x.abs()));
    let (i, err) = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .enumerate()
        .fold(
            (0, 0.0f64),
            |(bi, be), (i, e)| if e > be { (i, e) } else { (bi, be) },
        );
    assert!(
        err <= tol * scale,
        "{what}: max error {err:.3e} at {i} (got {}, want {}), tolerance {:.3e}",
        got[i],
        want[i],
        tol * scale
    );
}

struct Case {
    name: &'static str,
    shape: [usize; 6], // batch, heads_q, heads_kv, seq_q, seq_kv, d
    dtype: DType,
    options: Options,
    /// tolerance relative to the largest reference value
    tol: f64,
    /// also compare with burn's own unfused attention (masks it can express)
    against_burn: bool,
    /// an additive bias `[bb, bh, seq_q, seq_kv]` with its gradient: (bb, bh)
    bias: Option<[usize; 2]>,
}

fn run(case: &Case, dev: &Device, seed: u64) {
    let [b, hq, hkv, sq, skv, d] = case.shape;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (qs, ks) = ([b, sq, hq, d], [b, skv, hkv, d]);
    let n = |s: [usize; 4]| s.iter().product::<usize>();
    let (q, k, v, w) = (
        random(&mut rng, n(qs)),
        random(&mut rng, n(ks)),
        random(&mut rng, n(ks)),
        random(&mut rng, n(qs)),
    );
    // the reference reads the inputs as the device holds them (rounded to the dtype)
    let round = |x: &[f32], s| {
        host(Tensor::<4>::from_data(TensorData::new(x.to_vec(), s), dev).cast(case.dtype))
    };
    let (qr, kr, vr, wr) = (round(&q, qs), round(&k, ks), round(&v, ks), round(&w, qs));
    let bias = case.bias.map(|[bb, bh]| {
        let s = [bb, bh, sq, skv];
        let x = random(&mut rng, n(s));
        let xr = round(&x, s);
        (x, xr, s)
    });
    let mut cfg = AttentionConfig::new(b, sq, skv, hq, hkv, d);
    let o = &case.options;
    cfg.causal = o.causal;
    cfg.window = o.window;
    cfg.softmax_scale = o.softmax_scale;
    cfg.softcap = o.softcap;
    cfg.alibi_slopes = o.alibi_slopes.clone();
    cfg.seqlens_kv = o.key_lengths.clone();
    cfg.leftpad_kv = o.key_starts.clone();
    cfg.dropout = o.dropout;
    if let Some((_, xr, s)) = &bias {
        let b = ScoreBias::new((s[0], s[1], s[2], s[3]), xr).expect("bias");
        cfg.bias = Some(b.with_grad());
    }
    let want = reference::forward(&cfg, &qr, &kr, &vr);
    let want_g = reference::backward(&cfg, &qr, &kr, &vr, &wr);

    let (q_leaf, q_t) = leaf(&q, qs, case.dtype, dev);
    let (k_leaf, k_t) = leaf(&k, ks, case.dtype, dev);
    let (v_leaf, v_t) = leaf(&v, ks, case.dtype, dev);
    let w_t = Tensor::<4>::from_data(TensorData::new(w.clone(), qs), dev)
        .cast(case.dtype)
        .swap_dims(1, 2);
    let bias_leaf = bias.as_ref().map(|(x, _, s)| {
        Tensor::<4>::from_data(TensorData::new(x.clone(), *s), dev)
            .cast(case.dtype)
            .require_grad()
    });
    let (out, lse) = match &bias_leaf {
        None => flash_attention_with_lse(q_t.clone(), k_t.clone(), v_t.clone(), o),
        Some(bl) => flash_attention_with_bias(q_t.clone(), k_t.clone(), v_t.clone(), bl.clone(), o),
    }
    .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    assert_eq!(out.dims(), [b, hq, sq, d], "{}: out shape", case.name);
    assert_eq!(out.dtype(), case.dtype, "{}: out dtype", case.name);
    let grads = (out.clone() * w_t.clone()).sum().backward();
    let got_out = host(out.swap_dims(1, 2));
    let got_lse = host(lse);
    let g = |t: &Tensor<4>, what| {
        host(
            t.grad(&grads)
                .unwrap_or_else(|| panic!("{}: no gradient for {what}", case.name)),
        )
    };
    let (dq, dk, dv) = (g(&q_leaf, "q"), g(&k_leaf, "k"), g(&v_leaf, "v"));
    let name = case.name;
    max_err(
        &format!("{name}: out vs f64"),
        &got_out,
        &want.out,
        case.tol,
    );
    let lse_want: Vec<f64> = want
        .lse
        .iter()
        .map(|x| if x.is_finite() { *x } else { 0.0 })
        .collect();
    let lse_got: Vec<f32> = got_lse
        .iter()
        .map(|x| if x.is_finite() { *x } else { 0.0 })
        .collect();
    max_err(
        &format!("{name}: lse vs f64"),
        &lse_got,
        &lse_want,
        case.tol,
    );
    max_err(&format!("{name}: dq vs f64"), &dq, &want_g.dq, case.tol);
    max_err(&format!("{name}: dk vs f64"), &dk, &want_g.dk, case.tol);
    max_err(&format!("{name}: dv vs f64"), &dv, &want_g.dv, case.tol);
    let d_bias = bias_leaf.as_ref().map(|bl| g(bl, "bias"));
    if let Some(db) = &d_bias {
        let want_db = want_g.d_bias.as_ref().expect("reference d_bias");
        max_err(&format!("{name}: d_bias vs f64"), db, want_db, case.tol);
    }

    if case.against_burn {
        // burn's unfused attention on the same leaves: GQA by repeating k and v's heads, the
        // mask written out (bottom-right causal, window, key lengths) as burn's bool mask
        let (q2, q2_t) = leaf(&q, qs, case.dtype, dev);
        let (k2, k2_t) = leaf(&k, ks, case.dtype, dev);
        let (v2, v2_t) = leaf(&v, ks, case.dtype, dev);
        let group = hq / hkv;
        let rep = |t: Tensor<4>| {
            t.unsqueeze_dim::<5>(2)
                .repeat_dim(2, group)
                .reshape([b, hq, skv, d])
        };
        let mut hidden = Vec::with_capacity(b * hq * sq * skv);
        for bi in 0..b {
            for _ in 0..hq {
                for i in 0..sq {
                    for j in 0..skv {
                        let key_ok = o.key_lengths.as_ref().is_none_or(|l| j < l[bi]);
                        hidden.push(!(cfg.sees(i, j) && key_ok));
                    }
                }
            }
        }
        let mask = Tensor::<4, Bool>::from_data(TensorData::new(hidden, [b, hq, sq, skv]), dev);
        let opts = AttentionModuleOptions {
            scale: o.softmax_scale.map(f64::from),
            softcap: o.softcap.map(f64::from),
            is_causal: false,
        };
        let bias2 = bias.as_ref().map(|(x, _, s)| {
            Tensor::<4>::from_data(TensorData::new(x.clone(), *s), dev)
                .cast(case.dtype)
                .require_grad()
        });
        let full = bias2.clone().map(|t| t.expand([b, hq, sq, skv]));
        let out2 = attention_fallback(q2_t, rep(k2_t), rep(v2_t), Some(mask), full, opts);
        let grads2 = (out2.clone() * w_t).sum().backward();
        let g2 = |t: &Tensor<4>| host(t.grad(&grads2).expect("burn's gradient"));
        let f = |x: Vec<f32>| x.into_iter().map(f64::from).collect::<Vec<f64>>();
        let tol = 2.0 * case.tol;
        max_err(
            &format!("{name}: out vs burn"),
            &got_out,
            &f(host(out2.swap_dims(1, 2))),
            tol,
        );
        max_err(&format!("{name}: dq vs burn"), &dq, &f(g2(&q2)), tol);
        max_err(&format!("{name}: dk vs burn"), &dk, &f(g2(&k2)), tol);
        max_err(&format!("{name}: dv vs burn"), &dv, &f(g2(&v2)), tol);
        if let (Some(db), Some(b2)) = (&d_bias, &bias2) {
            max_err(&format!("{name}: d_bias vs burn"), db, &f(g2(b2)), tol);
        }
    }
}

/// A decode step over burn-held caches `[batch, heads_kv, capacity, d]`: appends at each
/// batch's length, then attention over what each holds, against the reference on the
/// caches as the host expects them after the appends.
fn kvcache(dev: &Device, seed: u64) {
    let (b, hq, hkv, cap, d, new) = (2, 4, 2, 40, 32, 2);
    let lens = [13usize, 30];
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let cs = [b, hkv, cap, d];
    let (mut kc, mut vc) = (
        random(&mut rng, cap * b * hkv * d),
        random(&mut rng, cap * b * hkv * d),
    );
    let (kn, vn) = (
        random(&mut rng, b * hkv * new * d),
        random(&mut rng, b * hkv * new * d),
    );
    let q = random(&mut rng, b * new * hq * d);
    let t = |x: &[f32], s: [usize; 4]| Tensor::<4>::from_data(TensorData::new(x.to_vec(), s), dev);
    let (mut k_cache, mut v_cache) = (t(&kc, cs), t(&vc, cs));
    let append = (t(&kn, [b, hkv, new, d]), t(&vn, [b, hkv, new, d]));
    let q_t = t(&q, [b, new, hq, d]).swap_dims(1, 2);
    // batch 0 left-padded (flash-attn's cache_leftpad)
    let starts = vec![4usize, 0];
    let opts = Options {
        causal: true,
        key_starts: Some(starts.clone()),
        ..Options::default()
    };
    let out =
        flash_attention_with_kvcache(q_t, &mut k_cache, &mut v_cache, &lens, Some(append), &opts)
            .expect("kvcache call");
    // the host's caches after the appends, and in the library's layout for the reference
    for (c, n) in [(&mut kc, &kn), (&mut vc, &vn)] {
        for bi in 0..b {
            for h in 0..hkv {
                for r in 0..new {
                    let dst = ((bi * hkv + h) * cap + lens[bi] + r) * d;
                    let src = ((bi * hkv + h) * new + r) * d;
                    c[dst..dst + d].copy_from_slice(&n[src..src + d]);
                }
            }
        }
    }
    assert_eq!(host(k_cache), kc, "k cache after the append");
    assert_eq!(host(v_cache), vc, "v cache after the append");
    let ours = |c: &[f32]| {
        let mut o = vec![0.0; c.len()];
        for bi in 0..b {
            for h in 0..hkv {
                for j in 0..cap {
                    let src = ((bi * hkv + h) * cap + j) * d;
                    let dst = ((bi * cap + j) * hkv + h) * d;
                    o[dst..dst + d].copy_from_slice(&c[src..src + d]);
                }
            }
        }
        o
    };
    let mut cfg = AttentionConfig::new(b, new, cap, hq, hkv, d);
    cfg.causal = true;
    cfg.seqlens_kv = Some(lens.iter().map(|l| l + new).collect());
    cfg.align_to_seqlens = true;
    cfg.leftpad_kv = Some(starts);
    let want = reference::forward(&cfg, &q, &ours(&kc), &ours(&vc));
    max_err(
        "kvcache: out vs f64",
        &host(out.swap_dims(1, 2)),
        &want.out,
        2e-5,
    );
    // an append past the capacity
    let (mut k2, mut v2) = (t(&kc, cs), t(&vc, cs));
    let row = (t(&kn, [b, hkv, new, d]), t(&vn, [b, hkv, new, d]));
    let q2 = t(&q, [b, new, hq, d]).swap_dims(1, 2);
    let e = flash_attention_with_kvcache(q2, &mut k2, &mut v2, &[13, 39], Some(row), &opts)
        .unwrap_err();
    assert!(e.to_string().contains("past the capacity 40"), "{e}");
}

fn errors(dev: &Device) {
    let t = |s: [usize; 4]| Tensor::<4>::zeros(s, dev);
    let o = Options::default();
    // head_dim of k differs from q's
    let e = flash_attention(t([1, 2, 8, 16]), t([1, 2, 8, 8]), t([1, 2, 8, 8]), &o).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    assert!(e.to_string().contains("expected [1, 2, 8, 16]"), "{e}");
    // v unlike k
    let e = flash_attention(t([1, 2, 8, 16]), t([1, 2, 8, 16]), t([1, 2, 9, 16]), &o).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // 3 query heads over 2 kv heads
    let e = flash_attention(t([1, 3, 8, 16]), t([1, 2, 8, 16]), t([1, 2, 8, 16]), &o).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    // key lengths for 2 batches given to 1
    let bad = Options {
        key_lengths: Some(vec![4, 4]),
        ..Options::default()
    };
    let e =
        flash_attention(t([1, 2, 8, 16]), t([1, 2, 8, 16]), t([1, 2, 8, 16]), &bad).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    // a dropout probability of 1
    let bad = Options {
        dropout: Some(flash_attn_burn::Dropout::new(1.0, 1, 0)),
        ..Options::default()
    };
    let e =
        flash_attention(t([1, 2, 8, 16]), t([1, 2, 8, 16]), t([1, 2, 8, 16]), &bad).unwrap_err();
    assert!(e.to_string().contains("dropout.p must be in [0, 1)"), "{e}");
    // a bias that is not [1 or batch, 1 or heads, seq_q, seq_kv]
    let e = flash_attention_with_bias(
        t([1, 2, 8, 16]),
        t([1, 2, 8, 16]),
        t([1, 2, 8, 16]),
        t([1, 2, 8, 7]),
        &o,
    )
    .unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // mixed dtypes
    let e = flash_attention(
        t([1, 2, 8, 16]),
        t([1, 2, 8, 16]).cast(DType::F16),
        t([1, 2, 8, 16]),
        &o,
    )
    .unwrap_err();
    assert!(matches!(e, Error::DType { .. }), "{e}");
}

/// The type of the primitive under a (non-autodiff) float tensor: burn's Fusion tensor when
/// its wgpu backend is fused (feature `fusion`), cubecl's tensor otherwise.
fn primitive_type(t: Tensor<4>) -> &'static str {
    use burn::backend::{BackendTensor, DispatchTensorKind};
    #[allow(unreachable_patterns)]
    match t.into_dispatch().kind {
        DispatchTensorKind::Cube(BackendTensor::Float(f)) => std::any::type_name_of_val(&f),
        _ => "not a float tensor of burn's cubecl backend",
    }
}

#[test]
fn burn_attention_matches_the_reference_and_burns_own_under_autodiff() {
    let plain = flash_attn_burn::init().expect("burn + flash attention on the default adapter");
    // the cases run on the backend this build selects: fused with the feature, else cubecl's
    let ty = primitive_type(Tensor::<4>::zeros([1, 1, 1, 1], &plain));
    eprintln!("burn's float tensors: {ty}");
    assert_eq!(ty.contains("Fusion"), cfg!(feature = "fusion"), "{ty}");
    let dev = plain.autodiff();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |t| t.as_nanos() as u64);
    eprintln!("seed {seed}");
    let cases = [
        Case {
            name: "f32 causal GQA, a bias over heads",
            shape: [2, 4, 2, 37, 45, 32],
            dtype: DType::F32,
            options: Options {
                causal: true,
                ..Options::default()
            },
            tol: 2e-5,
            against_burn: true,
            bias: Some([1, 4]),
        },
        Case {
            name: "f16 window, softcap, ALiBi, key lengths and left padding",
            shape: [2, 2, 1, 33, 29, 64],
            dtype: DType::F16,
            options: Options {
                window: Window::new(Some(7), Some(3)),
                softcap: Some(5.0),
                alibi_slopes: Some(vec![0.25, 0.0625]),
                key_lengths: Some(vec![29, 17]),
                key_starts: Some(vec![6, 0]),
                softmax_scale: Some(0.2),
                ..Options::default()
            },
            tol: 1e-2,
            against_burn: false,
            bias: None,
        },
    ];
    // dropout: its mask drawn by the forward and again by the backward (the reference draws
    // the same Philox words); a seed from this run's
    let cases = cases
        .into_iter()
        .chain([Case {
            name: "f32 causal GQA with dropout",
            shape: [2, 4, 2, 21, 26, 32],
            dtype: DType::F32,
            options: Options {
                causal: true,
                dropout: Some(flash_attn_burn::Dropout::new(0.25, seed, 3 << 30)),
                ..Options::default()
            },
            tol: 2e-5,
            against_burn: false,
            bias: None,
        }])
        .collect::<Vec<_>>();
    for (n, case) in cases.iter().enumerate() {
        run(case, &dev, seed + n as u64);
    }
    kvcache(&dev, seed + 100);
    errors(&dev);
}
