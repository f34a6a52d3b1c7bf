//! The correctness suite's body, written once for every backend (`AttentionBackend`): a forward
//! and a backward on fresh random data against the f64 reference, with each backend's rounding
//! allowance; the gaps each backend declares (README, "The CUDA path") checked to be typed
//! `Unsupported` errors naming that backend rather than skipped; NaN and Inf kept out of the
//! rows a mask hides them from.

use flash_attn_wgpu::dtype::to_f32_vec;
use flash_attn_wgpu::{
    unstable::reference, Algorithm, AttentionBackend, AttentionConfig, Backend, DType, Element,
    Error,
};

use super::{
    assert_close_floor, assert_close_nan, assert_close_tol, assert_lse_close, describe,
    gradient_floors, rel_tol, rounded_inputs, Errors, Rounded,
};

/// Which pass of a case a backend does not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gap {
    None,
    /// Neither pass: the forward is refused.
    Forward,
    /// The forward runs, the backward is refused.
    Backward,
}

/// What `backend` declares it cannot do for `dtype` and `cfg` (README, "The CUDA path"): the
/// CUDA path has no naive algorithm (it is the wgpu path's baseline, not a feature).
pub fn declared_gap(backend: Backend, _dtype: DType, cfg: &AttentionConfig) -> Gap {
    match backend {
        Backend::Cuda if cfg.algorithm == Algorithm::Naive => Gap::Forward,
        // paged K/V: forward only (an inference layout), on both
        _ if cfg.paged.is_some() => Gap::Backward,
        _ => Gap::None,
    }
}

/// Extra error, in unit roundoffs u of the dtype, beyond `rel_tol` (f32 accumulation, one
/// output rounding): (out, gradients).
///
/// The wgpu kernels compute in f32 from exactly read inputs: none. The CUDA kernels round P
/// (and, in the backward, dS) to the input dtype before their tensor-core products, as
/// FlashAttention does: errors of a few u, random in sign; out gets 2u, the gradients (two
/// rounded factors, summed over a whole row or column) 8u. A layout, indexing or masking bug
/// gives errors of order 1.
pub fn allowance(backend: Backend) -> (f64, f64) {
    match backend {
        Backend::Wgpu => (0.0, 0.0),
        Backend::Cuda => ROUNDED_P,
    }
}

/// The allowance of kernels that round P (and in the backward dS) to the input dtype before
/// their matrix products: the CUDA kernels (tensor cores) and the wgpu coop family
/// (cooperative matrices).
pub const ROUNDED_P: (f64, f64) = (2.0, 8.0);

fn expect_unsupported<R>(backend: Backend, got: flash_attn_wgpu::Result<R>, what: &str, msg: &str) {
    match got {
        Err(Error::Unsupported { backend: b, .. }) if b == backend => {}
        Err(e) => panic!("{what}: expected Unsupported on {backend}, got {e:?} ({msg})"),
        Ok(_) => panic!("{what}: expected Unsupported on {backend}, it ran ({msg})"),
    }
}

/// Forward then backward in `T` on `b` against the f64 reference computed from the T-rounded
/// inputs; the backward reference takes the forward's stored (rounded) `out` for
/// delta = rowsum(dO * out), exactly as the backward passes do. Where `gap` says a pass is
/// not run, it must be refused with `Unsupported` naming the backend; errors of the passes
/// that ran are returned (0 for the others).
pub fn check_case<B: AttentionBackend, T: Element>(
    b: &B,
    cfg: &AttentionConfig,
    amp: f32,
    msg: &str,
    gap: Gap,
) -> Errors {
    let cfg = &bias_in::<T>(cfg);
    let r = rounded_inputs::<T>(cfg, amp);
    check_rounded(b, cfg, &r, (&r.k, &r.v), msg, gap)
}

/// `cfg` as a call in `T` takes it: a bias joins calls of its own dtype, so the case's bias is
/// rounded to `T`.
pub fn bias_in<T: Element>(cfg: &AttentionConfig) -> AttentionConfig {
    let mut c = cfg.clone();
    c.bias = c
        .bias
        .map(|b| b.cast::<T>().expect("a rounded bias is finite or -inf"));
    c
}

/// [`check_case`] on given inputs: the device reads `(k, v)` (`r.k` and `r.v`, or copies with
/// NaN planted in rows no query sees), the reference `r`'s rounded values.
pub fn check_rounded<B: AttentionBackend, T: Element>(
    b: &B,
    cfg: &AttentionConfig,
    r: &Rounded<T>,
    kv: (&[T], &[T]),
    msg: &str,
    gap: Gap,
) -> Errors {
    check_rounded_allowing(b, cfg, r, kv, msg, gap, allowance(b.backend()))
}

/// [`check_rounded`] with an allowance of its own (out, gradients, in unit roundoffs): for
/// kernels that round P and dS to the dtype before their matrix products (the coop family,
/// [`ROUNDED_P`]).
pub fn check_rounded_allowing<B: AttentionBackend, T: Element>(
    b: &B,
    cfg: &AttentionConfig,
    r: &Rounded<T>,
    (k, v): (&[T], &[T]),
    msg: &str,
    gap: Gap,
    (extra_out, extra_grad): (f64, f64),
) -> Errors {
    let (seed, q, d_out) = (r.seed, &r.q[..], &r.d_out[..]);
    let (qr, kr, vr, dor) = (&r.qr[..], &r.kr[..], &r.vr[..], &r.dor[..]);
    let backend = b.backend();
    let msg = format!("{backend} {} {msg} {}", T::DTYPE, describe(cfg, seed));
    let u = T::DTYPE.unit_roundoff();
    let f = b.forward_host(cfg, q, k, v);
    if gap == Gap::Forward {
        expect_unsupported(backend, f, "forward", &msg);
        return Errors::default();
    }
    let f = f.unwrap_or_else(|e| panic!("forward failed: {e} ({msg})"));
    let want = reference::forward(cfg, qr, kr, vr);
    let out = to_f32_vec(&f.out);
    let tol = rel_tol(T::DTYPE) + extra_out * u;
    let e_out = assert_close_tol("out", &out, &want.out, tol, &msg);
    assert_lse_close(&f.lse, &want.lse, &msg);
    let g = b.backward_host(cfg, q, k, v, &f.out, &f.lse, d_out);
    if gap == Gap::Backward {
        expect_unsupported(backend, g, "backward", &msg);
        return Errors {
            out: e_out,
            ..Errors::default()
        };
    }
    let g = g.unwrap_or_else(|e| panic!("backward failed: {e} ({msg})"));
    let wg = reference::backward_with_out(cfg, qr, kr, vr, &out, dor);
    let tol = rel_tol(T::DTYPE) + extra_grad * u;
    match (&g.d_sinks, &wg.d_sinks) {
        (Some(got), Some(want)) => {
            assert_close_tol("d_sinks", got, want, tol, &msg);
        }
        (None, None) => {}
        (got, _) => panic!("d_sinks: got {got:?}, sinks {:?} ({msg})", cfg.sinks),
    }
    let [dq_floor, dk_floor, dv_floor, d_bias_floor] = gradient_floors(cfg, [qr, kr, vr, dor]);
    match (&g.d_bias, &wg.d_bias) {
        (Some(got), Some(want)) => {
            assert_close_floor("d_bias", &to_f32_vec(got), want, tol, d_bias_floor, &msg);
        }
        (None, None) => {}
        (got, _) => panic!("d_bias: got {}, bias {:?} ({msg})", got.is_some(), cfg.bias),
    }
    Errors {
        out: e_out,
        dq: assert_close_floor("dq", &to_f32_vec(&g.dq), &wg.dq, tol, dq_floor, &msg),
        dk: assert_close_floor("dk", &to_f32_vec(&g.dk), &wg.dk, tol, dk_floor, &msg),
        dv: assert_close_floor("dv", &to_f32_vec(&g.dv), &wg.dv, tol, dv_floor, &msg),
    }
}

/// The dtypes a case runs in on `backend`. CUDA: all three (this suite is its only
/// correctness suite). wgpu: one, rotating with the shape, since tests/dtypes.rs and
/// tests/variants.rs already run every dtype through every wgpu kernel over these shapes;
/// here wgpu proves the shared interface, and all three would triple the suite's lavapipe time.
pub fn dtypes_for(backend: Backend, cfg: &AttentionConfig) -> Vec<DType> {
    match backend {
        Backend::Cuda => DType::ALL.to_vec(),
        Backend::Wgpu => {
            let turn = cfg.seq_q + cfg.seq_kv + cfg.head_dim + cfg.heads_kv + cfg.causal as usize;
            vec![DType::ALL[turn % 3]]
        }
    }
}

/// `check_case` in every dtype `dtypes_for` gives, with the gaps `b` declares.
pub fn check_all_dtypes<B: AttentionBackend>(b: &B, cfg: &AttentionConfig, amp: f32) -> Errors {
    let backend = b.backend();
    let mut worst = Errors::default();
    for dtype in dtypes_for(backend, cfg) {
        let gap = declared_gap(backend, dtype, cfg);
        let e = match dtype {
            DType::F32 => check_case::<B, f32>(b, cfg, amp, "", gap),
            DType::F16 => check_case::<B, half::f16>(b, cfg, amp, "", gap),
            DType::BF16 => check_case::<B, half::bf16>(b, cfg, amp, "", gap),
        };
        worst = worst.max(e);
    }
    worst
}

/// Whether `backend` keeps NaN and Inf in keys, values or query rows out of every row (and
/// gradient) the mask hides them from, for `dtype`. The CUDA tensor-core kernels do not: a
/// masked score's P is 0, and 0 x Inf in their P V (or dS^T Q) products is NaN, as in
/// FlashAttention (README, "The CUDA path"); the CUDA SIMT kernels (f32) and wgpu do.
pub fn isolates_nonfinite(backend: Backend, dtype: DType) -> bool {
    match backend {
        Backend::Wgpu => true,
        Backend::Cuda => dtype == DType::F32,
    }
}

/// A poisoned case (`super::poisoned_inputs`) on `b`: forward and backward against the
/// reference on the same poisoned, T-rounded inputs. NaN exactly where the reference has it,
/// the other rows as if nothing had been poisoned, the NaN query row's lse NaN (not -inf).
/// The backward takes the forward's own out and lse (NaN rows included, which the host check
/// would refuse) as device tensors.
pub fn check_poisoned<B: AttentionBackend, T: Element>(b: &B, c: &AttentionConfig, r: &Rounded<T>) {
    let (extra_out, extra_grad) = allowance(b.backend());
    let u = T::DTYPE.unit_roundoff();
    let msg = format!("{} {} {}", b.backend(), T::DTYPE, describe(c, r.seed));
    let want = reference::forward(c, &r.qr, &r.kr, &r.vr);
    let f = b.forward_host(c, &r.q, &r.k, &r.v).unwrap();
    let out = to_f32_vec(&f.out);
    let nans = assert_close_nan(
        "out",
        &out,
        &want.out,
        rel_tol(T::DTYPE) + extra_out * u,
        &msg,
    );
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
    let (qs, kvs) = (c.q_shape(), c.kv_shape());
    let g = b
        .backward(
            c,
            &b.upload(&r.q, &qs).unwrap(),
            &b.upload(&r.k, &kvs).unwrap(),
            &b.upload(&r.v, &kvs).unwrap(),
            &b.upload(&f.out, &qs).unwrap(),
            &b.upload(&f.lse, &c.lse_shape()).unwrap(),
            &b.upload(&r.d_out, &qs).unwrap(),
        )
        .unwrap_or_else(|e| panic!("backward failed: {e} ({msg})"));
    let wg = reference::backward_with_out(c, &r.qr, &r.kr, &r.vr, &out, &r.dor);
    let tol = rel_tol(T::DTYPE) + extra_grad * u;
    for (name, got, want) in [
        ("dq", &g.dq, &wg.dq),
        ("dk", &g.dk, &wg.dk),
        ("dv", &g.dv, &wg.dv),
    ] {
        let got = to_f32_vec(&b.download::<T>(got).unwrap());
        assert_close_nan(name, &got, want, tol, &msg);
    }
}
