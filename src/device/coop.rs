//! Cooperative matrices: whether the adapter offers the configuration the coop kernels use
//! (16x16x16, f16 operands, f32 accumulators), and the self-check that has to pass before
//! `Context::new` picks the coop variant: a kernel no CI machine can run proves itself on the
//! adapter first, against the f64 reference, or the blocks variant stays the default.

use super::{Context, Tuning};
use crate::config::AttentionConfig;
use crate::error::Result;
use crate::kernels::Variant;

/// True when `props` holds 16x16x16 with f16 A and B and an f32 accumulator.
pub fn offers_coop_f16(props: &[wgpu::CooperativeMatrixProperties]) -> bool {
    props.iter().any(|p| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
            && p.ab_type == wgpu::CooperativeScalarType::F16
            && p.cr_type == wgpu::CooperativeScalarType::F32
    })
}

/// Worst error the self-check accepts, relative to the largest reference output: f16's unit
/// roundoff (P is rounded to f16 once) with the tests' headroom (docs/PRECISION.md).
const SELF_CHECK_TOL: f64 = 4.0 / 2048.0;

impl Context {
    /// Runs `variant`'s forward and backward on small causal and non-causal f16 calls (odd
    /// lengths, GQA, head_dim 64) against the f64 reference on this device: `Ok(None)` when
    /// every output is within 4 x 2^-11 of its largest reference value, `Ok(Some(why))` when
    /// one is not, `Err` when the variant cannot run here. `Context::new` runs it for the coop
    /// variant before picking it; it checks any variant on a driver one does not trust.
    /// The tuning is restored afterwards.
    pub fn check_variant(&self, variant: Variant) -> Result<Option<String>> {
        let before = self.tuning();
        self.set_tuning(Tuning { variant, ..before })?;
        let result = self.variant_cases();
        self.set_tuning_unchecked(before);
        result
    }

    fn variant_cases(&self) -> Result<Option<String>> {
        for causal in [false, true] {
            let mut cfg = AttentionConfig::new(1, 77, 93, 4, 2, 64);
            cfg.causal = causal;
            let mut state = 0x2545_f491_u32;
            let mut next = |n: usize| -> Vec<half::f16> {
                (0..n)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 17;
                        state ^= state << 5;
                        half::f16::from_f32((state as f32 / u32::MAX as f32) * 4.0 - 2.0)
                    })
                    .collect()
            };
            let (q, k, v, d_out) = (
                next(cfg.q_shape().iter().product()),
                next(cfg.kv_shape().iter().product()),
                next(cfg.kv_shape().iter().product()),
                next(cfg.q_shape().iter().product()),
            );
            let f32s = |x: &[half::f16]| x.iter().map(|h| h.to_f32()).collect::<Vec<_>>();
            let (qf, kf, vf) = (f32s(&q), f32s(&k), f32s(&v));
            let want = crate::reference::forward(&cfg, &qf, &kf, &vf);
            let got = self.forward_host(&cfg, &q, &k, &v)?;
            let out = f32s(&got.out);
            // the backward is defined on the stored (f16-rounded) out
            let grads =
                crate::reference::backward_with_out(&cfg, &qf, &kf, &vf, &out, &f32s(&d_out));
            let g = self.backward_host(&cfg, &q, &k, &v, &got.out, &got.lse, &d_out)?;
            for (name, got, want) in [
                ("out", out, &want.out),
                ("dq", f32s(&g.dq), &grads.dq),
                ("dk", f32s(&g.dk), &grads.dk),
                ("dv", f32s(&g.dv), &grads.dv),
            ] {
                let worst = worst_error(&got, want);
                if worst > SELF_CHECK_TOL {
                    return Ok(Some(format!(
                        "the self-check (causal {causal}) has {name} off by \
                         {worst:.2e} of max|{name}| (allowed {SELF_CHECK_TOL:.2e})"
                    )));
                }
            }
        }
        Ok(None)
    }
}

/// The largest |got - want| over max|want|; infinite where got is NaN.
fn worst_error(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs() / scale)
        .fold(
            0.0f64,
            |m, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
        )
}
