//! The CUDA path against the f64 reference on fresh random data, forward and backward, where a
//! CUDA device exists: f16 and bf16, odd lengths, GQA/MQA, causal and not, rows that see no
//! key, every head-dim class. Without a driver or device each test prints why and returns (CI
//! has no GPU); NVRTC missing beside a device is a failure (the set-up is broken, not absent).
//!
//! Tolerance: the kernels accumulate in f32 but round P (and, in the backward, dS) to the input
//! dtype before their products on the tensor cores, as FlashAttention does. Those roundings add
//! errors of a few unit roundoffs u of the dtype, random in sign, beside `rel_tol` (f32
//! accumulation and one output rounding): out gets 2u more, the gradients (two rounded factors,
//! summed over a whole column or row) 8u. A layout, indexing or masking bug gives errors of
//! order 1.
#![cfg(feature = "cuda")]

mod common;

use common::nvrtc::nvrtc_dir;
use common::{assert_close_tol, assert_lse_close, describe, rel_tol, rounded_inputs, Rounded};
use flash_attn_wgpu::cuda::CudaContext;
use flash_attn_wgpu::dtype::to_f32_vec;
use flash_attn_wgpu::{reference, AttentionConfig, Element, Error};

fn cuda() -> Option<CudaContext> {
    let dir = nvrtc_dir();
    match CudaContext::with_nvrtc_dir(0, Some(&dir)) {
        Ok(c) => {
            eprintln!(
                "CUDA: {} (sm_{}), NVRTC {:?}",
                c.device_name(),
                c.arch(),
                c.nvrtc_version()
            );
            Some(c)
        }
        Err(Error::CudaUnavailable { missing, .. }) if !missing.contains("NVRTC") => {
            eprintln!("skipped: no CUDA device here ({missing})");
            None
        }
        Err(e) => panic!("CUDA device present but unusable: {e}"),
    }
}

fn check<T: Element>(cuda: &CudaContext, cfg: &AttentionConfig, amp: f32) {
    let Rounded {
        seed,
        q,
        k,
        v,
        d_out,
        qr,
        kr,
        vr,
        dor,
    } = rounded_inputs::<T>(cfg, amp);
    let msg = format!("CUDA {} {}", T::DTYPE, describe(cfg, seed));
    let u = T::DTYPE.unit_roundoff();
    let want = reference::forward(cfg, &qr, &kr, &vr);
    let f = cuda
        .forward_host(cfg, &q, &k, &v)
        .unwrap_or_else(|e| panic!("forward failed: {e} ({msg})"));
    let out = to_f32_vec(&f.out);
    let tol = rel_tol(T::DTYPE) + 2.0 * u;
    let e = assert_close_tol("out", &out, &want.out, tol, &msg);
    assert_lse_close(&f.lse, &want.lse, &msg);
    let mut errors = vec![format!("out {e:.2e}")];
    if cfg.head_dim <= 128 {
        let g = cuda
            .backward_host(cfg, &q, &k, &v, &f.out, &f.lse, &d_out)
            .unwrap_or_else(|e| panic!("backward failed: {e} ({msg})"));
        // delta = rowsum(dO * out) from the stored (rounded) out, as the kernels do
        let wg = reference::backward_with_out(cfg, &qr, &kr, &vr, &out, &dor);
        let tol = rel_tol(T::DTYPE) + 8.0 * u;
        for (name, got, want) in [
            ("dq", &g.dq, &wg.dq),
            ("dk", &g.dk, &wg.dk),
            ("dv", &g.dv, &wg.dv),
        ] {
            let e = assert_close_tol(name, &to_f32_vec(got), want, tol, &msg);
            errors.push(format!("{name} {e:.2e}"));
        }
    }
    eprintln!("{msg}: {} of max |reference|", errors.join(", "));
}
fn both_dtypes(cuda: &CudaContext, cfg: &AttentionConfig, amp: f32) {
    check::<half::f16>(cuda, cfg, amp);
    check::<half::bf16>(cuda, cfg, amp);
}

#[test]
fn cuda_matches_the_reference_at_odd_lengths_causal_and_not() {
    let Some(cuda) = cuda() else { return };
    for head_dim in [64, 128] {
        for causal in [false, true] {
            for (seq_q, seq_kv) in [(1, 1), (77, 133), (133, 77), (200, 200)] {
                let mut cfg = AttentionConfig::new(2, seq_q, seq_kv, 4, 4, head_dim);
                cfg.causal = causal;
                both_dtypes(&cuda, &cfg, 1.0);
            }
        }
    }
}

#[test]
fn cuda_handles_gqa_mqa_and_every_head_dim_class() {
    let Some(cuda) = cuda() else { return };
    // head dims 16..=256 in steps of 16, each tile shape: forward 64-key tiles up to 128,
    // 16-key tiles past it (forward only: the backward stops at 128); backward 64-row/key
    // tiles up to 64, 32 past it
    for head_dim in [16, 48, 96, 128, 160, 256] {
        for heads_kv in [1, 2, 8] {
            let cfg = AttentionConfig::new(1, 65, 130, 8, heads_kv, head_dim);
            both_dtypes(&cuda, &cfg, 1.0);
        }
    }
}

#[test]
fn cuda_gives_zero_and_neg_inf_lse_for_rows_that_see_no_key() {
    let Some(cuda) = cuda() else { return };
    // causal with seq_q > seq_kv: the first seq_q - seq_kv rows see nothing
    let mut cfg = AttentionConfig::new(1, 150, 40, 2, 2, 64);
    cfg.causal = true;
    both_dtypes(&cuda, &cfg, 1.0);
    // large logits: the online softmax's running max must keep them exact
    let cfg = AttentionConfig::new(1, 90, 300, 2, 1, 128);
    both_dtypes(&cuda, &cfg, 8.0);
}

#[test]
fn cuda_refuses_what_its_kernels_cannot_do_with_typed_errors() {
    let Some(cuda) = cuda() else { return };
    let cfg = AttentionConfig::new(1, 8, 8, 1, 1, 64);
    let x = vec![0.5f32; 8 * 64];
    assert!(matches!(
        cuda.forward_host(&cfg, &x, &x, &x),
        Err(Error::Unsupported { .. })
    ));
    let cfg = AttentionConfig::new(1, 8, 8, 1, 1, 72);
    let h = vec![half::f16::from_f32(0.5); 8 * 72];
    assert!(matches!(
        cuda.forward_host(&cfg, &h, &h, &h),
        Err(Error::Unsupported { .. })
    ));
    let short = vec![half::f16::from_f32(0.5); 10];
    assert!(matches!(
        cuda.forward_host(&cfg, &short, &h, &h),
        Err(Error::SliceLength { .. })
    ));
    // the backward stops at head_dim 128
    let cfg = AttentionConfig::new(1, 8, 8, 1, 1, 144);
    let h = vec![half::bf16::from_f32(0.5); 8 * 144];
    let f = cuda.forward_host(&cfg, &h, &h, &h).unwrap();
    assert!(matches!(
        cuda.backward_host(&cfg, &h, &h, &h, &f.out, &f.lse, &h),
        Err(Error::Unsupported { .. })
    ));
}
