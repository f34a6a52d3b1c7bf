//! Shared test helpers: one context per test binary, fresh random data, tolerances.
#![allow(dead_code)]

pub mod backend;
pub mod kv;
#[cfg(feature = "cuda")]
pub mod nvrtc;
pub mod pipelines;
pub mod score_mods;
pub mod shards;
pub mod tier;

/// A device of the default adapter created with exactly `limits` and the adapter's features
/// among `features`: for tests of small or unusual devices. `PASSTHROUGH_SHADERS` is asked
/// for too where offered, as `Context::new` does on Vulkan, so that such a device runs the
/// SPIR-V users of `Context::new` get (src/device/spirv.rs); `driver::` tests the WGSL route.
pub fn device_with(limits: wgpu::Limits, features: wgpu::Features) -> (wgpu::Device, wgpu::Queue) {
    device_exactly(Some(limits), features | wgpu::Features::PASSTHROUGH_SHADERS)
}

/// A device of the default adapter with `limits` (None: the adapter's own) and exactly the
/// adapter's features among `features`.
pub fn device_exactly(
    limits: Option<wgpu::Limits>,
    features: wgpu::Features,
) -> (wgpu::Device, wgpu::Queue) {
    pollster::block_on(async {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions::default())
            .await
            .expect("an adapter");
        adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("test device"),
                required_features: adapter.features() & features,
                required_limits: limits.unwrap_or_else(|| adapter.limits()),
                ..Default::default()
            })
            .await
            .expect("a device")
    })
}

use std::sync::OnceLock;

use flash_attn_wgpu::dtype::{from_f32_slice, to_f32_vec};
use flash_attn_wgpu::{
    unstable::reference, Algorithm, AttentionBackend, AttentionConfig, Context, DType, Element,
    Variant,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// f32 kernels must match the f64 reference to this fraction of its largest magnitude.
pub const REL_TOL: f64 = 1e-4;

/// Every way a call can run: the tiled algorithm in each variant, and the naive algorithm
/// (which has no variants; Rows stands in).
pub fn algorithm_variants() -> Vec<(Algorithm, Variant)> {
    Variant::ALL
        .into_iter()
        .map(|v| (Algorithm::Tiled, v))
        .chain([(Algorithm::Naive, Variant::Rows)])
        .collect()
}

/// The context the tests share. Its tuning stays as made: a test that sets a variant or a
/// subgroup size makes a context of its own, since tests run side by side and another's
/// change would swap their kernels mid-test (a bit-equality check between two calls once
/// failed so). A changed tuning fails the next test that asks for the context.
pub fn ctx() -> &'static Context {
    let ctx = try_ctx().unwrap_or_else(|e| panic!("no GPU context for tests: {e}"));
    static MADE: OnceLock<flash_attn_wgpu::Tuning> = OnceLock::new();
    let made = *MADE.get_or_init(|| ctx.tuning());
    assert_eq!(
        ctx.tuning(),
        made,
        "a test changed the shared context's tuning: give it a context of its own"
    );
    ctx
}

/// Set (to anything) where the wgpu halves of tests/gpu/backends.rs must run: CI sets it
/// (scripts/run-tests.sh), so that a machine without its Vulkan driver fails instead of
/// skipping them.
pub const REQUIRE_WGPU_ENV: &str = "FLASH_ATTN_REQUIRE_WGPU";

/// The shared wgpu context, or why there is none (no adapter: a machine whose only GPU path
/// is CUDA, such as an NVIDIA machine without its Vulkan driver).
pub fn try_ctx() -> Result<&'static Context, String> {
    static CTX: OnceLock<Result<Context, String>> = OnceLock::new();
    CTX.get_or_init(|| Context::new().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(Clone::clone)
}

/// The wgpu context for a test that also runs on CUDA: `None`, with the reason printed, where
/// wgpu has no adapter and [`REQUIRE_WGPU_ENV`] is unset, so that the CUDA half still runs.
pub fn wgpu_half() -> Option<&'static Context> {
    match try_ctx() {
        Ok(c) => Some(c),
        Err(e) if std::env::var_os(REQUIRE_WGPU_ENV).is_none() => {
            eprintln!("wgpu half skipped: {e}");
            None
        }
        Err(e) => panic!("no wgpu context, and {REQUIRE_WGPU_ENV} is set: {e}"),
    }
}

/// How many cases a GPU property test draws: `ci` in the CI tier, `full` in the full tier
/// (tier.rs), or `PROPTEST_CASES` where set (`PROPTEST_CASES=200` for a longer search). Each
/// case compiles pipelines of its own on lavapipe (seconds each), so CI draws a few a run:
/// fresh ones every run.
#[allow(dead_code)]
pub fn prop_cases(ci: u32, full: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if tier::full() { full } else { ci })
}

/// A fresh seed per call, printed by failing assertions; `FLASH_ATTN_TEST_SEED=<seed>` replays
/// one (every call then draws that seed).
pub fn fresh_seed() -> u64 {
    match std::env::var("FLASH_ATTN_TEST_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("FLASH_ATTN_TEST_SEED={s}: expected a u64")),
        Err(_) => rand::rng().random(),
    }
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
    // k and v as the call lays them out (page pools for a paged call)
    let nkv = cfg.kv_shape().iter().product();
    // v and out as wide as head_dim_v
    let (nv, no) = (
        cfg.v_shape().iter().product(),
        cfg.out_shape().iter().product(),
    );
    Inputs {
        seed,
        q: random(&mut rng, nq, amp),
        k: random(&mut rng, nkv, amp),
        v: random(&mut rng, nv, 1.0),
        d_out: random(&mut rng, no, 1.0),
    }
}

/// Max |got - want| relative to max |want|; the check the issue sets for f32.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], ctx_msg: &str) {
    assert_close_tol(what, got, want, REL_TOL, ctx_msg);
}

/// Tolerance, as a fraction of max |reference|, for outputs stored in `dtype` and compared with
/// the f64 reference computed from the same dtype-rounded inputs. The kernels read inputs
/// exactly and accumulate in f32, whose error the f32 tests bound by REL_TOL; the only other
/// error is one round-to-nearest of each output into the dtype, at most its unit roundoff u
/// (2^-11 for f16, 2^-8 for bf16) times the value, hence at most u * max |reference|.
pub fn rel_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => REL_TOL,
        half => REL_TOL + half.unit_roundoff(),
    }
}

/// Like `assert_close` with an explicit tolerance; returns max |got - want| / max |want|.
pub fn assert_close_tol(what: &str, got: &[f32], want: &[f64], tol: f64, ctx_msg: &str) -> f64 {
    assert_close_floor(what, got, want, tol, 0.0, ctx_msg)
}

/// `assert_close_tol` against max(max |want|, `floor`): for a result that is a sum of terms
/// which may cancel, `floor` is the terms' magnitude, which bounds the f32 rounding error
/// where max |want| alone would not (a gradient that is exactly 0 in exact arithmetic).
pub fn assert_close_floor(
    what: &str,
    got: &[f32],
    want: &[f64],
    tol: f64,
    floor: f64,
    ctx_msg: &str,
) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: length ({ctx_msg})");
    let scale = want.iter().fold(floor, |m, x| m.max(x.abs())).max(1e-30);
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}[{i}] = {g} is not finite ({ctx_msg})");
        let e = (g as f64 - w).abs();
        if e > worst.0 {
            worst = (e, i);
        }
    }
    assert!(
        worst.0 <= tol * scale,
        "{what}: max abs error {:.3e} at [{}] (got {}, want {}) exceeds {tol:e} x {scale:.3e} ({ctx_msg})",
        worst.0,
        worst.1,
        got[worst.1],
        want[worst.1]
    );
    worst.0 / scale
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
    let mut mods = String::new();
    if cfg.window.is_active() {
        mods += &format!(" window=({:?}, {:?})", cfg.window.left, cfg.window.right);
    }
    if let Some(c) = cfg.softcap {
        mods += &format!(" softcap={c}");
    }
    if cfg.score_mod.is_some() {
        mods += " score_mod";
    }
    if cfg.mask_mod.is_some() {
        mods += " mask_mod";
    }
    if let Some(s) = &cfg.alibi_slopes {
        mods += &format!(" alibi[{}]", s.len());
    }
    if cfg.sinks.is_some() {
        mods += " sinks";
    }
    if let Some(n) = &cfg.seqlens_kv {
        mods += &format!(" seqlens_kv={n:?}");
    }
    if let Some(n) = &cfg.leftpad_kv {
        mods += &format!(" leftpad_kv={n:?}");
    }
    if let Some(v) = &cfg.varlen {
        mods += &format!(
            " varlen(cu_q={:?}, cu_kv={:?})",
            v.cu_seqlens_q, v.cu_seqlens_kv
        );
    }
    if let Some(m) = &cfg.block_mask {
        mods += &format!(
            " blocks({}x{}, [{}, {}], density {:.2})",
            m.block_q,
            m.block_kv,
            m.batch,
            m.heads,
            m.density()
        );
    }
    if let Some(m) = &cfg.mask {
        mods += &format!(
            " mask([{}, {}], density {:.2})",
            m.batch,
            m.heads,
            m.density()
        );
    }
    if let Some(b) = &cfg.bias {
        mods += &format!(
            " bias([{}, {}], {}{})",
            b.batch,
            b.heads,
            b.dtype(),
            if b.grad { ", grad" } else { "" }
        );
    }
    if let Some(d) = &cfg.dropout {
        mods += &format!(
            " dropout(p={}, seed={:#x}, offset={:#x})",
            d.p, d.seed, d.offset
        );
    }
    format!(
        "{:?} b={} sq={} skv={} hq={} hkv={} d={} causal={}{mods} seed={seed}",
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

/// Fresh random ALiBi slopes in [0.05, 0.6): one per query head, or (`per_batch`) one per
/// batch and query head.
pub fn random_alibi(cfg: &AttentionConfig, per_batch: bool) -> Vec<f32> {
    let n = cfg.heads_q * if per_batch { cfg.batch } else { 1 };
    let mut rng = StdRng::seed_from_u64(fresh_seed());
    (0..n).map(|_| rng.random_range(0.05..0.6)).collect()
}

/// Fresh random per-batch key lengths in [0, seq_kv]: the first batch full, the second empty
/// (rows that see no key) when there are three or more, the rest random.
pub fn random_seqlens(cfg: &AttentionConfig) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(fresh_seed());
    (0..cfg.batch)
        .map(|b| match b {
            0 => cfg.seq_kv,
            1 if cfg.batch >= 3 => 0,
            _ => rng.random_range(0..=cfg.seq_kv),
        })
        .collect()
}

/// Fresh random left paddings (`leftpad_kv`) for `cfg`'s key lengths: each batch's in
/// [0, its length], so a batch may lose every key (its rows then see none).
pub fn random_leftpad(cfg: &AttentionConfig) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(fresh_seed());
    (0..cfg.batch)
        .map(|b| rng.random_range(0..=cfg.kv_len(b)))
        .collect()
}

/// Fresh random sinks in [-1, 3): one per query head, large enough to take a visible share of
/// each row's softmax.
pub fn random_sinks(cfg: &AttentionConfig) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(fresh_seed());
    (0..cfg.heads_q)
        .map(|_| rng.random_range(-1.0..3.0))
        .collect()
}

/// Dropout with probability `p`, a fresh seed and an offset just under 2^32, so that the
/// RNG's 64-bit counter (offset + key / 4) carries into its high word within a row.
pub fn random_dropout(p: f32) -> flash_attn_wgpu::Dropout {
    let mut rng = StdRng::seed_from_u64(fresh_seed());
    flash_attn_wgpu::Dropout::new(p, rng.random(), (1u64 << 32) - rng.random_range(1..40))
}

/// A random block mask of `block_q x block_kv` blocks with about `density` of them on, one
/// grid per batch and per query head (or shared: `per_batch` / `per_head` false). Its pattern
/// is drawn from a seed of these arguments, the same every run: which blocks are on decides
/// the tiles a call gets (`plan::tiles_for` fits them to the blocks where that skips work), so
/// a fresh pattern made the suite's pipeline set move from run to run (issue 46). The inputs
/// the mask is tested with are fresh.
pub fn random_block_mask(
    cfg: &AttentionConfig,
    (block_q, block_kv): (usize, usize),
    per_batch: bool,
    per_head: bool,
    density: f64,
) -> flash_attn_wgpu::BlockMask {
    let dims = mask_dims(cfg, per_batch, per_head);
    let seed = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (block_q, block_kv, dims, density.to_bits()).hash(&mut h);
        h.finish()
    };
    let mut rng = StdRng::seed_from_u64(seed);
    flash_attn_wgpu::BlockMask::from_fn(block_q, block_kv, dims, |_, _, _, _| {
        rng.random_bool(density)
    })
}

/// A mask's shape for `cfg`: `(batch, heads, seq_q, seq_kv)` with batch and heads the call's
/// (`per_batch`, `per_head`) or 1 (broadcast).
fn mask_dims(
    cfg: &AttentionConfig,
    per_batch: bool,
    per_head: bool,
) -> (usize, usize, usize, usize) {
    (
        if per_batch { cfg.batch } else { 1 },
        if per_head { cfg.heads_q } else { 1 },
        cfg.seq_q,
        cfg.seq_kv,
    )
}

/// A fresh random boolean mask with about `density` of its entries true, one grid per batch
/// and per query head (or shared: `per_batch` / `per_head` false), and `empty_rows` rows of
/// every grid with no true entry at all.
pub fn random_bool_mask(
    cfg: &AttentionConfig,
    per_batch: bool,
    per_head: bool,
    density: f64,
    empty_rows: usize,
) -> flash_attn_wgpu::BoolMask {
    let mut rng = StdRng::seed_from_u64(fresh_seed());
    let empty: Vec<usize> = (0..empty_rows)
        .map(|_| rng.random_range(0..cfg.seq_q))
        .collect();
    let dims = mask_dims(cfg, per_batch, per_head);
    flash_attn_wgpu::BoolMask::from_fn(dims, |_, _, i, _| {
        !empty.contains(&i) && rng.random_bool(density)
    })
}

/// A fresh random f32 bias in [-2, 2] with about `hidden` of its entries -inf, one grid per
/// batch and per query head (or shared: `per_batch` / `per_head` false), and `hidden_rows`
/// rows of every grid all -inf; asking for `d_bias`.
pub fn random_bias(
    cfg: &AttentionConfig,
    per_batch: bool,
    per_head: bool,
    hidden: f64,
    hidden_rows: usize,
) -> flash_attn_wgpu::ScoreBias {
    let mut rng = StdRng::seed_from_u64(fresh_seed());
    let rows: Vec<usize> = (0..hidden_rows)
        .map(|_| rng.random_range(0..cfg.seq_q))
        .collect();
    let dims = mask_dims(cfg, per_batch, per_head);
    flash_attn_wgpu::ScoreBias::from_fn(dims, |_, _, i, _| {
        if rows.contains(&i) || rng.random_bool(hidden) {
            f32::NEG_INFINITY
        } else {
            rng.random_range(-2.0f32..2.0)
        }
    })
    .expect("a random bias is finite or -inf")
    .with_grad()
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
    check_backward_on(ctx(), base, amp)
}

/// [`check_backward`] on a context of the test's own.
pub fn check_backward_on(c: &Context, base: &AttentionConfig, amp: f32) {
    let data = inputs(base, amp);
    let want = reference::backward(base, &data.q, &data.k, &data.v, &data.d_out);
    for alg in [Algorithm::Tiled, Algorithm::Naive] {
        let mut cfg = base.clone();
        cfg.algorithm = alg;
        let msg = describe(&cfg, data.seed);
        let f = c
            .forward_host(&cfg, &data.q, &data.k, &data.v)
            .unwrap_or_else(|e| panic!("forward failed: {e} ({msg})"));
        let g = c
            .backward_host(&cfg, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out)
            .unwrap_or_else(|e| panic!("backward failed: {e} ({msg})"));
        assert_qkv_grads_close(&cfg, &data, [&g.dq, &g.dk, &g.dv], &want, &msg);
        match (&g.d_sinks, &want.d_sinks) {
            (Some(got), Some(want)) => assert_close("d_sinks", got, want, &msg),
            (None, None) => {}
            (got, _) => panic!("d_sinks: got {got:?}, sinks {:?} ({msg})", cfg.sinks),
        }
        match (&g.d_bias, &want.d_bias) {
            (Some(got), Some(want)) => assert_close("d_bias", got, want, &msg),
            (None, None) => {}
            (got, _) => panic!("d_bias: got {got:?}, bias {:?} ({msg})", cfg.bias),
        }
        match (&g.d_table, &want.d_table) {
            (Some(got), Some(want)) => {
                // each entry sums many pairs' terms, which cancel (a row's gradients sum to 0)
                let floor = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                assert_close_floor("d_table", got, want, 2e-4, floor, &msg);
            }
            (None, None) => {}
            (got, _) => panic!("d_table: got {got:?} ({msg})"),
        }
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

/// Fresh random inputs rounded to `T`, and the same rounded values in f32 (exact) for the
/// reference.
pub struct Rounded<T> {
    pub seed: u64,
    pub q: Vec<T>,
    pub k: Vec<T>,
    pub v: Vec<T>,
    pub d_out: Vec<T>,
    pub qr: Vec<f32>,
    pub kr: Vec<f32>,
    pub vr: Vec<f32>,
    pub dor: Vec<f32>,
}

pub fn rounded_inputs<T: Element>(cfg: &AttentionConfig, amp: f32) -> Rounded<T> {
    let data = inputs(cfg, amp);
    let (q, k, v, d_out) = (
        from_f32_slice::<T>(&data.q),
        from_f32_slice::<T>(&data.k),
        from_f32_slice::<T>(&data.v),
        from_f32_slice::<T>(&data.d_out),
    );
    let (qr, kr, vr, dor) = (
        to_f32_vec(&q),
        to_f32_vec(&k),
        to_f32_vec(&v),
        to_f32_vec(&d_out),
    );
    Rounded {
        seed: data.seed,
        q,
        k,
        v,
        d_out,
        qr,
        kr,
        vr,
        dor,
    }
}

/// Largest errors of one dtype check, as fractions of max |reference|.
#[derive(Debug, Clone, Copy, Default)]
pub struct Errors {
    pub out: f64,
    pub dq: f64,
    pub dk: f64,
    pub dv: f64,
}

impl Errors {
    pub fn max(self, o: Errors) -> Errors {
        Errors {
            out: self.out.max(o.out),
            dq: self.dq.max(o.dq),
            dk: self.dk.max(o.dk),
            dv: self.dv.max(o.dv),
        }
    }
}

/// Forward then backward in element type `T` on `ctx` (with the tuning it has), against the f64
/// reference computed from the T-rounded inputs: `backend::check_case` with no gap allowed.
pub fn check_dtype<B: AttentionBackend, T: Element>(
    ctx: &B,
    cfg: &AttentionConfig,
    amp: f32,
    msg: &str,
) -> Errors {
    backend::check_case::<B, T>(ctx, cfg, amp, msg, backend::Gap::None)
}

/// `check_dtype` for a runtime dtype.
pub fn check_dtype_dyn<B: AttentionBackend>(
    ctx: &B,
    dtype: DType,
    cfg: &AttentionConfig,
    amp: f32,
    msg: &str,
) -> Errors {
    match dtype {
        DType::F32 => check_dtype::<B, f32>(ctx, cfg, amp, msg),
        DType::F16 => check_dtype::<B, half::f16>(ctx, cfg, amp, msg),
        DType::BF16 => check_dtype::<B, half::bf16>(ctx, cfg, amp, msg),
    }
}

/// The magnitude of the terms each gradient sums, for random data: dS = P (dP - delta) is a
/// difference of terms of size |dP| ~ sqrt(dv) |dO| |v| (dv: the values' head dim; times the dropout factor) that
/// cancel exactly where a row sees a single key (P = 1, dP = delta), so dq and dk can be 0
/// in exact arithmetic with f32 rounding errors of that size relative to dP; the tolerance
/// is then taken against these (dq: scale |dP| |k|, dk: scale |dP| |q|, dv: |dO| times the
/// dropout factor, d_bias: |dP| P with P ~ 1 / seq_kv) rather than against the result.
pub fn gradient_floors(cfg: &AttentionConfig, [q, k, v, d_out]: [&[f32]; 4]) -> [f64; 4] {
    let max = |x: &[f32]| x.iter().fold(0.0f64, |m, y| m.max(y.abs() as f64));
    let z = cfg.dropout.map_or(1.0, |d| 1.0 / (1.0 - d.p as f64));
    let dp = (cfg.dv() as f64).sqrt() * max(d_out) * max(v) * z;
    let scale = cfg.scale() as f64;
    [
        scale * dp * max(k),
        scale * dp * max(q),
        max(d_out) * z,
        dp / cfg.seq_kv.max(1) as f64,
    ]
}

/// dq, dk and dv of an f32 call against the reference, each within `REL_TOL` of the larger
/// of its max |reference| and the size of the terms it sums ([`gradient_floors`]): with
/// large logits a row's P is nearly one-hot, dS = P (dP - delta) cancels, and the gradients
/// of the keys such rows pick are far smaller than the f32 rounding of those terms.
pub fn assert_qkv_grads_close(
    cfg: &AttentionConfig,
    data: &Inputs,
    [dq, dk, dv]: [&[f32]; 3],
    want: &reference::RefGradients,
    msg: &str,
) {
    let [fq, fk, fv, _] = gradient_floors(cfg, [&data.q, &data.k, &data.v, &data.d_out]);
    assert_close_floor("dq", dq, &want.dq, REL_TOL, fq, msg);
    assert_close_floor("dk", dk, &want.dk, REL_TOL, fk, msg);
    assert_close_floor("dv", dv, &want.dv, REL_TOL, fv, msg);
}

/// Like `assert_close_tol`, for results that may hold NaN: NaN exactly where the reference has
/// NaN (a row that sees a NaN), and everywhere else within `tol` x the largest finite
/// |reference|. Returns the number of NaN entries.
pub fn assert_close_nan(what: &str, got: &[f32], want: &[f64], tol: f64, ctx_msg: &str) -> usize {
    assert_eq!(got.len(), want.len(), "{what}: length ({ctx_msg})");
    let scale = want
        .iter()
        .filter(|x| x.is_finite())
        .fold(0.0f64, |m, x| m.max(x.abs()))
        .max(1e-30);
    let mut nans = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}] = {g}, want NaN ({ctx_msg})");
            nans += 1;
        } else if w.is_infinite() {
            assert_eq!(g as f64, w, "{what}[{i}] ({ctx_msg})");
        } else {
            let e = (g as f64 - w).abs();
            assert!(
                e <= tol * scale,
                "{what}[{i}]: got {g}, want {w}: error {e:.3e} exceeds {tol:e} x {scale:.3e} ({ctx_msg})"
            );
        }
    }
    nans
}

/// Copies of `r`'s k and v with NaN in every element of the key rows `hidden` (batch, kv
/// head, key) of `c`: rows no query may read.
pub fn nan_in_key_rows<T: Element>(
    c: &AttentionConfig,
    r: &Rounded<T>,
    hidden: &[(usize, usize, usize)],
) -> (Vec<T>, Vec<T>) {
    let (mut k, mut v) = (r.k.clone(), r.v.clone());
    let nan = T::from_f32(f32::NAN);
    for &(b, hk, j) in hidden {
        let row = (b * c.seq_kv + j) * c.heads_kv + hk;
        k[row * c.head_dim..(row + 1) * c.head_dim].fill(nan);
        v[row * c.dv()..(row + 1) * c.dv()].fill(nan);
    }
    (k, v)
}

/// Writes `x` into every element of key `j` (all kv heads) of a `[b, seq_kv, heads_kv, d]`
/// tensor, in batch 0.
pub fn poison_key(t: &mut [f32], cfg: &AttentionConfig, j: usize, x: f32) {
    let row = cfg.heads_kv * cfg.head_dim;
    t[j * row..(j + 1) * row].fill(x);
}

/// Fresh rounded inputs for a causal config with seq_q == seq_kv (row i sees keys 0..=i),
/// poisoned where causal masking hides the values from most rows: NaN and +-Inf in the k and
/// v of the last four keys (key n-1 is seen by the last row alone), and a NaN query row (row 3
/// of head 0). Rows that see a poisoned key or query carry NaN; every other row must come out
/// as if nothing had been poisoned.
pub fn poisoned_inputs<T: Element>(cfg: &AttentionConfig) -> Rounded<T> {
    assert!(cfg.causal && cfg.seq_q == cfg.seq_kv && cfg.seq_q > 4);
    let r = rounded_inputs::<T>(cfg, 1.0);
    let (mut qr, mut kr, mut vr) = (r.qr, r.kr, r.vr);
    let n = cfg.seq_kv;
    poison_key(&mut vr, cfg, n - 1, f32::NAN);
    poison_key(&mut kr, cfg, n - 2, f32::NAN);
    poison_key(&mut vr, cfg, n - 3, f32::INFINITY);
    poison_key(&mut kr, cfg, n - 4, f32::NEG_INFINITY);
    poison_key(&mut vr, cfg, n - 4, f32::NAN);
    let qrow = 3 * cfg.heads_q * cfg.head_dim;
    qr[qrow..qrow + cfg.head_dim].fill(f32::NAN);
    Rounded {
        seed: r.seed,
        q: from_f32_slice::<T>(&qr),
        k: from_f32_slice::<T>(&kr),
        v: from_f32_slice::<T>(&vr),
        d_out: r.d_out,
        qr,
        kr,
        vr,
        dor: r.dor,
    }
}
