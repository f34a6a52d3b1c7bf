//! Shared test helpers: one context per test binary, fresh random data, tolerances.
#![allow(dead_code)]

use std::sync::OnceLock;

use flash_attn_wgpu::{reference, Algorithm, AttentionConfig, Context};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// f32 kernels must match the f64 reference to this fraction of its largest magnitude.
pub const REL_TOL: f64 = 1e-4;

pub fn ctx() -> &'static Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    CTX.get_or_init(|| match Context::new() {
        Ok(c) => c,
        Err(e) => panic!("no GPU context for tests: {e}"),
    })
}

/// A fresh seed per call (printed by failing assertions so a failure can be replayed).
pub fn fresh_seed() -> u64 {
    rand::rng().random()
}

/// Uniform random values in [-amp, amp).
pub fn random(rng: &mut StdRng, n: usize, amp: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-amp..amp)).collect()
}

pub struct Inputs {
    pub seed: u64,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub d_out: Vec<f32>,
}

pub fn inputs(cfg: &AttentionConfig, amp: f32) -> Inputs {
    let seed = fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let nq = cfg.batch * cfg.seq_q * cfg.heads_q * cfg.head_dim;
    let nkv = cfg.batch * cfg.seq_kv * cfg.heads_kv * cfg.head_dim;
    Inputs {
        seed,
        q: random(&mut rng, nq, amp),
        k: random(&mut rng, nkv, amp),
        v: random(&mut rng, nkv, 1.0),
        d_out: random(&mut rng, nq, 1.0),
    }
}

/// Max |got - want| relative to max |want|; the check the issue sets for f32.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], ctx_msg: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length ({ctx_msg})");
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}[{i}] = {g} is not finite ({ctx_msg})");
        let e = (g as f64 - w).abs();
        if e > worst.0 {
            worst = (e, i);
        }
    }
    assert!(
        worst.0 <= REL_TOL * scale,
        "{what}: max abs error {:.3e} at [{}] (got {}, want {}) exceeds {REL_TOL:e} x {scale:.3e} ({ctx_msg})",
        worst.0,
        worst.1,
        got[worst.1],
        want[worst.1]
    );
}

/// lse: -inf exactly where the reference has -inf, else close in absolute terms.
pub fn assert_lse_close(got: &[f32], want: &[f64], ctx_msg: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w == f64::NEG_INFINITY {
            assert_eq!(g, f32::NEG_INFINITY, "lse[{i}] of an empty row ({ctx_msg})");
        } else {
            assert!(
                g.is_finite() && (g as f64 - w).abs() <= 1e-4 * w.abs().max(1.0),
                "lse[{i}]: got {g}, want {w} ({ctx_msg})"
            );
        }
    }
}

pub fn describe(cfg: &AttentionConfig, seed: u64) -> String {
    format!(
        "{:?} b={} sq={} skv={} hq={} hkv={} d={} causal={} seed={seed}",
        cfg.algorithm,
        cfg.batch,
        cfg.seq_q,
        cfg.seq_kv,
        cfg.heads_q,
        cfg.heads_kv,
        cfg.head_dim,
        cfg.causal
    )
}

/// Runs the forward pass of both algorithms against the reference.
pub fn check_forward(base: &AttentionConfig, amp: f32) {
    let data = inputs(base, amp);
    let want = reference::forward(base, &data.q, &data.k, &data.v);
    for alg in [Algorithm::Tiled, Algorithm::Naive] {
        let mut cfg = base.clone();
        cfg.algorithm = alg;
        let msg = describe(&cfg, data.seed);
        let got = ctx()
            .forward_host(&cfg, &data.q, &data.k, &data.v)
            .unwrap_or_else(|e| panic!("forward failed: {e} ({msg})"));
        assert_close("out", &got.out, &want.out, &msg);
        assert_lse_close(&got.lse, &want.lse, &msg);
    }
}

/// Runs forward then backward of both algorithms against the reference gradients.
pub fn check_backward(base: &AttentionConfig, amp: f32) {
    let data = inputs(base, amp);
    let want = reference::backward(base, &data.q, &data.k, &data.v, &data.d_out);
    for alg in [Algorithm::Tiled, Algorithm::Naive] {
        let mut cfg = base.clone();
        cfg.algorithm = alg;
        let msg = describe(&cfg, data.seed);
        let c = ctx();
        let f = c
            .forward_host(&cfg, &data.q, &data.k, &data.v)
            .unwrap_or_else(|e| panic!("forward failed: {e} ({msg})"));
        let g = c
            .backward_host(&cfg, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out)
            .unwrap_or_else(|e| panic!("backward failed: {e} ({msg})"));
        assert_close("dq", &g.dq, &want.dq, &msg);
        assert_close("dk", &g.dk, &want.dk, &msg);
        assert_close("dv", &g.dv, &want.dv, &msg);
    }
}

pub fn cfg(
    b: usize,
    sq: usize,
    skv: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
) -> AttentionConfig {
    let mut c = AttentionConfig::new(b, sq, skv, hq, hkv, d);
    c.causal = causal;
    c
}
