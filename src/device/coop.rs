//! Cooperative matrices: whether the adapter offers a configuration the coop kernels use
//! (16x16x16 or 8x8x8, f16 operands, f32 accumulators), and the self-check that has to pass
//! before `Context::new` picks the coop variant on a GPU: a kernel proves itself on the
//! adapter first, against the f64 reference, or the blocks variant stays the default.

use super::{Context, Tuning};
use crate::config::AttentionConfig;
use crate::error::Result;
use crate::kernels::Variant;

/// The fragment size of the coop kernels on an adapter offering `props`: 16 where it offers
/// 16x16x16 with f16 A and B and an f32 accumulator (NVIDIA, AMD RDNA3/4 through Vulkan),
/// else 8 where it offers 8x8x8 so (Apple GPUs through Metal, lavapipe 26), else 0. The
/// kernels' text is the same at both sizes but for the size (`DeviceCaps::coop`).
pub fn fragment_size(props: &[wgpu::CooperativeMatrixProperties]) -> u32 {
    let offers = |n: u32| {
        props.iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (n, n, n)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        })
    };
    [16, 8].into_iter().find(|&n| offers(n)).unwrap_or(0)
}

/// What `AdapterSummary::cooperative_matrices` says of fragment size `frag` before a verdict.
pub fn shape_name(frag: u32) -> String {
    format!("{frag}x{frag}x{frag} f16/f32")
}

/// Worst error the self-check accepts, relative to the largest reference output: f16's unit
/// roundoff (P is rounded to f16 once) with the tests' headroom (docs/PRECISION.md).
const SELF_CHECK_TOL: f64 = 4.0 / 2048.0;

/// `FLASH_ATTN_WGPU_COOP=off` (or `0`, `false`): never pick the coop variant, and skip its
/// self-check (a driver that hangs in it cannot stop `Context::new` then).
pub const COOP_ENV: &str = "FLASH_ATTN_WGPU_COOP";
/// `FLASH_ATTN_WGPU_COOP_TIMEOUT_S`: how long `Context::new` waits for the self-check
/// (default [`DEFAULT_SELF_CHECK_TIMEOUT_S`]) before it gives up on the coop variant.
pub const COOP_TIMEOUT_ENV: &str = "FLASH_ATTN_WGPU_COOP_TIMEOUT_S";
/// The self-check's default deadline: it compiles a few dozen pipelines, well under a second
/// each on a GPU driver.
pub const DEFAULT_SELF_CHECK_TIMEOUT_S: u64 = 60;

/// Whether `COOP_ENV` switches the coop variant off.
fn switched_off() -> bool {
    is_off(std::env::var(COOP_ENV).ok().as_deref())
}

fn is_off(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "off" | "0" | "false"
        )
    })
}

/// The self-check's deadline: `COOP_TIMEOUT_ENV` where it parses, else the default.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
fn self_check_timeout() -> std::time::Duration {
    timeout_from(std::env::var(COOP_TIMEOUT_ENV).ok().as_deref())
}

#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
fn timeout_from(value: Option<&str>) -> std::time::Duration {
    let s = value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_SELF_CHECK_TIMEOUT_S);
    std::time::Duration::from_secs(s)
}

/// Whether the coop variant may be used on `adapter` (`Err` says why not): its self-check
/// on a probe device of its own, given up after [`self_check_timeout`]. Natively the check
/// runs on a thread of its own, so that a driver stuck in it cannot hold `Context::new`
/// (the thread is left behind); this waits for it, blocking.
pub(super) async fn verdict(
    adapter: &wgpu::Adapter,
    features: wgpu::Features,
    limits: &wgpu::Limits,
    frag: u32,
) -> std::result::Result<(), String> {
    if switched_off() {
        return Err(format!(
            "switched off ({COOP_ENV}=off; the self-check did not run)"
        ));
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::sync::mpsc::{channel, RecvTimeoutError};
        let timeout = self_check_timeout();
        let (tx, rx) = channel();
        let (adapter, limits) = (adapter.clone(), limits.clone());
        let spawned = std::thread::Builder::new()
            .name("flash-attn-coop-self-check".into())
            .spawn(move || {
                let _ = tx.send(pollster::block_on(probe(&adapter, features, &limits, frag)));
            });
        if let Err(e) = spawned {
            return Err(format!("no thread for the self-check: {e}"));
        }
        match rx.recv_timeout(timeout) {
            Ok(v) => v,
            Err(RecvTimeoutError::Timeout) => Err(format!(
                "the self-check timed out after {} s ({COOP_TIMEOUT_ENV})",
                timeout.as_secs()
            )),
            Err(RecvTimeoutError::Disconnected) => Err("the self-check panicked".into()),
        }
    }
    #[cfg(target_arch = "wasm32")]
    {
        probe(adapter, features, limits, frag).await
    }
}

/// The self-check on a probe device, and whether the device survived it.
async fn probe(
    adapter: &wgpu::Adapter,
    features: wgpu::Features,
    limits: &wgpu::Limits,
    frag: u32,
) -> std::result::Result<(), String> {
    let (device, queue) = super::request(adapter, features, limits, true)
        .await
        .map_err(|e| format!("no device for the self-check: {e}"))?;
    let probe = Context::build(device, queue, Some(adapter.get_info()), frag);
    match probe.check_variant(Variant::Coop) {
        Ok(None) => probe
            .check_alive()
            .map_err(|e| format!("the device was lost in the self-check: {e}")),
        Ok(Some(why)) => Err(why),
        Err(e) => Err(format!("the coop kernels' self-check failed: {e}")),
    }
}

/// The (causal, head_dim) cases of the self-check: head_dim 64 and 128 (the planned tiles are
/// 16 x 16 at both; the products over head_dim take 4 and 8 fragments of 16, 8 and 16 of 8),
/// and 80, which pads to whole cooperative blocks.
const SELF_CHECK_CASES: [(bool, usize); 4] = [(false, 64), (true, 64), (true, 128), (false, 80)];

impl Context {
    /// Runs `variant`'s forward and backward on small causal and non-causal f16 calls (odd
    /// lengths, GQA, head_dim 64, 128 and 80) against the f64 reference on this device, each
    /// twice: `Ok(None)` when every output is within 4 x 2^-11 of its largest reference value
    /// and the second run equals the first bit for bit, `Ok(Some(why))` when one is not, `Err`
    /// when the variant cannot run here. `Context::new` runs it for the coop variant before
    /// picking it; it checks any variant on a driver one does not trust. The tuning is
    /// restored afterwards.
    pub fn check_variant(&self, variant: Variant) -> Result<Option<String>> {
        let before = self.tuning();
        self.set_tuning(Tuning { variant, ..before })?;
        let result = self.variant_cases();
        self.set_tuning_unchecked(before);
        result
    }

    fn variant_cases(&self) -> Result<Option<String>> {
        let mut state = 0x2545_f491_u32;
        for (causal, head_dim) in SELF_CHECK_CASES {
            let mut cfg = AttentionConfig::new(1, 77, 93, 4, 2, head_dim);
            cfg.causal = causal;
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
            let case = format!("causal {causal}, head_dim {head_dim}");
            for (name, got, want) in [
                ("out", out, &want.out),
                ("dq", f32s(&g.dq), &grads.dq),
                ("dk", f32s(&g.dk), &grads.dk),
                ("dv", f32s(&g.dv), &grads.dv),
            ] {
                let worst = worst_error(&got, want);
                if worst > SELF_CHECK_TOL {
                    return Ok(Some(format!(
                        "the self-check ({case}) has {name} off by {worst:.2e} of max|{name}| \
                         (allowed {SELF_CHECK_TOL:.2e})"
                    )));
                }
            }
            // Barriers must order the kernels' workgroup traffic (naga's SPIR-V for
            // cooperative matrices does not say so formally: gfx-rs/wgpu#8805): a second
            // run must give the same bits.
            let again = self.forward_host(&cfg, &q, &k, &v)?;
            let g2 = self.backward_host(&cfg, &q, &k, &v, &got.out, &got.lse, &d_out)?;
            let bits = |x: &[half::f16]| x.iter().map(|h| h.to_bits()).collect::<Vec<_>>();
            for (name, a, b) in [
                ("out", bits(&got.out), bits(&again.out)),
                ("dq", bits(&g.dq), bits(&g2.dq)),
                ("dk", bits(&g.dk), bits(&g2.dk)),
                ("dv", bits(&g.dv), bits(&g2.dv)),
            ] {
                if let Some(e) = a.iter().zip(&b).position(|(x, y)| x != y) {
                    return Ok(Some(format!(
                        "nondeterministic: the self-check ({case}) gave {name} different bits \
                         on a second run (first at element {e})"
                    )));
                }
            }
            if got
                .lse
                .iter()
                .zip(&again.lse)
                .any(|(x, y)| x.to_bits() != y.to_bits())
            {
                return Ok(Some(format!(
                    "nondeterministic: the self-check ({case}) gave lse different bits on a \
                     second run"
                )));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_and_the_deadline_read_their_variables() {
        for off in ["off", "OFF", "0", "false", " off "] {
            assert!(is_off(Some(off)), "{off:?}");
        }
        for on in [None, Some("on"), Some("1"), Some("")] {
            assert!(!is_off(on), "{on:?}");
        }
        assert_eq!(timeout_from(Some("5")).as_secs(), 5);
        assert_eq!(
            timeout_from(Some("x")).as_secs(),
            DEFAULT_SELF_CHECK_TIMEOUT_S
        );
        assert_eq!(timeout_from(None).as_secs(), DEFAULT_SELF_CHECK_TIMEOUT_S);
    }
}
