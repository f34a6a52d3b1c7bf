//! The kernels on a second WebGPU implementation: Dawn (Chrome's WebGPU, Tint compiler) under
//! Node.js, on the same adapter. Plans are exported as replay data (`Plan::replay`) with the
//! f64 reference's expected outputs, and `dawn/runner.mjs` replays and checks them.
//!
//! Needs `node` and the pinned `webgpu` package in dawn/node_modules
//! (`bash scripts/ensure-portability.sh`). Without them these tests say so and pass, except under CI
//! (or FLASH_ATTN_REQUIRE_DAWN=1), where they fail.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{cfg, poisoned_inputs, rel_tol, rounded_inputs, Rounded};
use flash_attn_wgpu::dtype::{from_f32_slice, to_f32_vec};
use flash_attn_wgpu::unstable::kernels::enumerate::{devices, pipeline_keys};
use flash_attn_wgpu::unstable::kernels::{DeviceCaps, WgslConsumer};
use flash_attn_wgpu::unstable::replay::{to_words, ReplayCase, ReplayCheck};
use flash_attn_wgpu::{
    unstable::plan, unstable::reference, Algorithm, AttentionConfig, DType, Element, HalfStorage,
    Tuning, Variant,
};

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// `node`, started as this test binary was: through the Mesa 26 root's loader and libraries
/// where scripts/mesa26.sh started it (it sets `FLASH_ATTN_MESA26_LIB`), so that Dawn's
/// Vulkan is lavapipe 26.1 as wgpu's is (it compiles Tint's SPIR-V about 2.5x faster than
/// 25.0.7: docs/log/ci-time.md); else the `node` on PATH.
fn node() -> Command {
    let Some(lib) = std::env::var_os("FLASH_ATTN_MESA26_LIB").map(PathBuf::from) else {
        return Command::new("node");
    };
    let path = std::env::var_os("PATH").unwrap_or_default();
    let Some(node) = std::env::split_paths(&path)
        .map(|d| d.join("node"))
        .find(|p| p.is_file())
    else {
        return Command::new("node");
    };
    let mut c = Command::new(lib.join("ld-linux-x86-64.so.2"));
    c.arg("--library-path").arg(&lib).arg(node);
    c
}

/// The runner script, if node and the webgpu package are there.
fn runner() -> Option<PathBuf> {
    let script = root().join("dawn/runner.mjs");
    let has_pkg = root()
        .join("dawn/node_modules/webgpu/package.json")
        .exists();
    let has_node = node()
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if has_pkg && has_node {
        return Some(script);
    }
    let why = if has_node {
        "dawn/node_modules/webgpu is missing"
    } else {
        "node is missing"
    };
    if std::env::var_os("CI").is_some() || std::env::var_os("FLASH_ATTN_REQUIRE_DAWN").is_some() {
        panic!("Dawn runner unavailable ({why}): run `bash scripts/ensure-portability.sh`");
    }
    eprintln!("skipping the Dawn tests: {why} (run `bash scripts/ensure-portability.sh`)");
    None
}

/// Runs the runner; returns (success, stdout).
fn run_node(script: &Path, args: &[&str]) -> (bool, String) {
    let out = node()
        .arg(script)
        .args(args)
        .output()
        .expect("spawning node");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Dawn warns about lavapipe's limits on stderr; keep only real errors in the test log.
    for line in stderr.lines().filter(|l| !l.starts_with("Warning:")) {
        eprintln!("runner: {line}");
    }
    (out.status.success(), stdout)
}

struct DawnAdapter {
    subgroup: u32,
    shader_f16: bool,
}

fn dawn_adapter(script: &Path) -> DawnAdapter {
    let (ok, out) = run_node(script, &["info"]);
    assert!(ok, "runner info failed: {out}");
    let v: serde_json::Value =
        serde_json::from_str(out.lines().last().unwrap_or("")).expect("info JSON");
    eprintln!("Dawn adapter: {v}");
    let features: Vec<&str> = v["features"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    let (min, max) = (
        v["subgroup_min_size"].as_u64().unwrap_or(0),
        v["subgroup_max_size"].as_u64().unwrap_or(0),
    );
    DawnAdapter {
        // As on wgpu: share tile reads only across a subgroup size the adapter fixes.
        subgroup: if features.contains(&"subgroups") && min == max && (2..=64).contains(&min) {
            min as u32
        } else {
            0
        },
        shader_f16: features.contains(&"shader-f16"),
    }
}

fn env(variant: Variant, rows_subgroup: u32, half_storage: HalfStorage) -> plan::PlanEnv {
    plan::PlanEnv {
        caps: DeviceCaps::WEBGPU_DEFAULT,
        tuning: Tuning {
            variant,
            rows_subgroup,
            half_storage,
            decode_q_chunks: true,
        },
        max_binding_bytes: 128 << 20,
        offset_align: 256,
        compiled_flags: flash_attn_wgpu::unstable::kernels::flags::compiled_from_env(),
    }
}

/// Indices of the NaN entries of a reference result (rows that see a NaN).
fn nan_at(want: &[f64]) -> Vec<usize> {
    (0..want.len()).filter(|&i| want[i].is_nan()).collect()
}

fn tensor_check(label: &str, buffer: usize, dtype: DType, want: &[f64]) -> ReplayCheck {
    ReplayCheck {
        label: label.into(),
        buffer,
        dtype: dtype.name(),
        kind: "tensor",
        expected: want
            .iter()
            .map(|&x| Some(if x.is_nan() { 0.0 } else { x }))
            .collect(),
        tol: rel_tol(dtype),
        nan: nan_at(want),
    }
}

fn lse_check(buffer: usize, want: &[f64]) -> ReplayCheck {
    ReplayCheck {
        label: "lse".into(),
        buffer,
        dtype: "f32",
        kind: "lse",
        expected: want
            .iter()
            .map(|&x| (x != f64::NEG_INFINITY).then_some(if x.is_nan() { 0.0 } else { x }))
            .collect(),
        tol: 1e-4,
        nan: nan_at(want),
    }
}

/// A forward case and a backward case for `T`, with expected outputs from the f64 reference
/// on the T-rounded inputs (the backward's `out` is the reference's, rounded to T).
fn cases<T: Element>(
    c: &AttentionConfig,
    amp: f32,
    e: &plan::PlanEnv,
    name: &str,
) -> [ReplayCase; 2] {
    cases_of(c, e, name, rounded_inputs::<T>(c, amp))
}

/// `cases` for given inputs.
fn cases_of<T: Element>(
    c: &AttentionConfig,
    e: &plan::PlanEnv,
    name: &str,
    inputs: Rounded<T>,
) -> [ReplayCase; 2] {
    // a bias joins calls of its own dtype: this case's, rounded
    let cast;
    let c = match &c.bias {
        Some(b) if b.dtype() != T::DTYPE => {
            let mut c2 = c.clone();
            c2.bias = Some(b.cast::<T>().expect("a rounded bias is finite or -inf"));
            cast = c2;
            &cast
        }
        _ => c,
    };
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
    } = inputs;
    let want = reference::forward(c, &qr, &kr, &vr);
    let dtype = T::DTYPE;
    let name = format!("{name} seed={seed}");

    let p = plan::forward(c, dtype, e).expect("forward plan");
    let mut fwd = p.replay(
        &format!("fwd {name}"),
        WgslConsumer::Tint,
        vec![to_words(&q), to_words(&k), to_words(&v)],
        65535,
    );
    fwd.checks = vec![
        tensor_check("out", p.replay_output_buffer(0), dtype, &want.out),
        lse_check(p.replay_output_buffer(1), &want.lse),
    ];

    let out: Vec<T> = want.out.iter().map(|&x| T::from_f32(x as f32)).collect();
    let lse: Vec<f32> = want.lse.iter().map(|&x| x as f32).collect();
    let grads = reference::backward_with_out(c, &qr, &kr, &vr, &to_f32_vec(&out), &dor);
    let p = plan::backward(c, dtype, e).expect("backward plan");
    let words = vec![
        to_words(&q),
        to_words(&k),
        to_words(&v),
        to_words(&out),
        to_words(&lse),
        to_words(&d_out),
    ];
    let mut bwd = p.replay(&format!("bwd {name}"), WgslConsumer::Tint, words, 65535);
    bwd.checks = vec![
        tensor_check("dq", p.replay_output_buffer(0), dtype, &grads.dq),
        tensor_check("dk", p.replay_output_buffer(1), dtype, &grads.dk),
        tensor_check("dv", p.replay_output_buffer(2), dtype, &grads.dv),
    ];
    if let Some(d_sinks) = &grads.d_sinks {
        bwd.checks.push(tensor_check(
            "d_sinks",
            p.replay_output_buffer(3),
            DType::F32,
            d_sinks,
        ));
    }
    if let Some(d_bias) = &grads.d_bias {
        let at = 3 + grads.d_sinks.is_some() as usize;
        bwd.checks.push(tensor_check(
            "d_bias",
            p.replay_output_buffer(at),
            dtype,
            d_bias,
        ));
    }
    [fwd, bwd]
}

/// Replays `cases` on Dawn; every one must pass.
fn run_cases(script: &Path, file: &str, cases: &[ReplayCase]) {
    let path = write_json(file, &serde_json::json!({ "cases": cases }));
    let (ok, out) = run_node(script, &["run", path.to_str().unwrap()]);
    eprintln!("{out}");
    assert!(
        ok,
        "Dawn results differ from the reference (see the FAIL lines above)"
    );
    assert!(
        out.contains(&format!("{} passed, 0 failed", cases.len())),
        "{out}"
    );
}

fn write_json(file: &str, value: &serde_json::Value) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(file);
    std::fs::write(&path, value.to_string()).expect("writing replay data");
    path
}

/// Which (variant, storage) pairs the Dawn replays run. The blocks kernels are 5-10x slower
/// for lavapipe to compile from Tint's SPIR-V than the others (about 9 s a pipeline, from
/// naga's 2 s), so on Dawn they run f32 and native f16 (split calls: f32) over every shape;
/// their packed f16 and bf16 loads and stores are the prelude's, which the lanes and rows
/// replays and every wgpu test cover for every variant.
fn on_dawn(variant: Variant, dtype: DType, half: HalfStorage) -> bool {
    variant != Variant::Blocks
        || dtype == DType::F32
        || (dtype == DType::F16 && half == HalfStorage::Native)
}

/// The (dtype, storage) formats Dawn runs: native f16 where the adapter has shader-f16.
fn formats(dawn: &DawnAdapter) -> Vec<(DType, HalfStorage)> {
    let mut formats = vec![
        (DType::F32, HalfStorage::Packed),
        (DType::F16, HalfStorage::Packed),
        (DType::BF16, HalfStorage::Packed),
    ];
    if dawn.shader_f16 {
        formats.push((DType::F16, HalfStorage::Native));
    }
    formats
}

/// The (algorithm, variant, subgroup) triples Dawn runs: every variant, the naive path, and
/// the rows kernels sharing tile reads across the adapter's fixed subgroup size.
fn algorithms(dawn: &DawnAdapter) -> Vec<(Algorithm, Variant, u32)> {
    let mut algorithms: Vec<(Algorithm, Variant, u32)> = common::algorithm_variants()
        .into_iter()
        .map(|(alg, v)| (alg, v, 0))
        .collect();
    if dawn.subgroup != 0 {
        algorithms.push((Algorithm::Tiled, Variant::Rows, dawn.subgroup));
    }
    algorithms
}

/// A forward and a backward case of `c` in `dtype`.
fn cases_in(
    dtype: DType,
    c: &AttentionConfig,
    amp: f32,
    e: &plan::PlanEnv,
    name: &str,
) -> [ReplayCase; 2] {
    match dtype {
        DType::F32 => cases::<f32>(c, amp, e, name),
        DType::F16 => cases::<half::f16>(c, amp, e, name),
        DType::BF16 => cases::<half::bf16>(c, amp, e, name),
    }
}

#[test]
fn every_format_and_algorithm_matches_the_f64_reference_on_dawn() {
    // Each (format, algorithm) pair (CI: each algorithm and each format at least once) runs
    // on one of the shapes below in rotation; the full product (every pair on every shape)
    // took 25 minutes of lavapipe compiles on CI, and every pair on one shape 8 minutes, for
    // no kernel code the rotation misses
    // (every variant's source compiles with Tint in `every_kernel_variant_compiles_with_tint`,
    // and every pair runs on wgpu over all of these shapes in tests/dtypes.rs and variants.rs).
    let Some(script) = runner() else { return };
    let dawn = dawn_adapter(&script);
    let shapes = [
        // odd lengths, GQA, causal
        (cfg(2, 37, 29, 4, 2, 64, true), 1.0),
        // seq_q > seq_kv: rows that see no key; large logits
        (cfg(1, 40, 9, 2, 1, 16, true), 8.0),
        (cfg(1, 33, 47, 2, 1, 128, false), 1.0),
        // one head, odd head_dim sizes: odd element counts in packed storage
        (cfg(1, 19, 23, 1, 1, 256, true), 1.0),
    ];
    // CI: each algorithm in one format in turns, every format at least once (tier.rs); the
    // full tier: every pair
    let mut all = Vec::new();
    let pairs = common::tier::pairs(
        &algorithms(&dawn),
        &formats(&dawn),
        |&(_, v, _), &(d, h)| on_dawn(v, d, h),
    );
    for (pair, ((algorithm, variant, sg), (dtype, half))) in pairs.into_iter().enumerate() {
        let (c, amp) = &shapes[pair % 4];
        let mut c = c.clone();
        c.algorithm = algorithm;
        let e = env(variant, sg, half);
        let name = format!(
            "{dtype} {half:?} {algorithm:?} {variant:?} sg={sg} {}",
            common::describe(&c, 0)
        );
        all.extend(cases_in(dtype, &c, *amp, &e, &name));
    }
    run_cases(&script, "dawn-cases.json", &all);
}

#[test]
fn windows_and_split_calls_match_the_f64_reference_on_dawn() {
    let Some(script) = runner() else { return };
    let dawn = dawn_adapter(&script);
    let formats = formats(&dawn);
    let mut all = Vec::new();
    // A sliding window with the score modifiers, key ranges (lengths and left padding),
    // dropout, a block mask, a boolean mask and a bias (the WINDOW, SOFTCAP, ALIBI, SINKS,
    // SEQLENS, DROPOUT, BLOCKS, MASK, BIAS, SCORE_MOD and MASK_MOD pipeline constants, the extras' uniform binding
    // and the pair data's storage one, the sinks' and the bias's gradient kernels, Philox
    // under Tint): f32 on every algorithm and variant, the softcap and ALiBi (per batch and
    // head) in turns.
    {
        let mut c = cfg(2, 70, 90, 2, 1, 32, false);
        c.window = flash_attn_wgpu::Window::new(Some(12), Some(3));
        c.sinks = Some(common::random_sinks(&c));
        c.seqlens_kv = Some(vec![90, 41]);
        c.leftpad_kv = Some(vec![17, 0]);
        c.dropout = Some(common::random_dropout(0.25));
        c.block_mask = Some(common::random_block_mask(&c, (16, 24), true, false, 0.6));
        c.mask = Some(common::random_bool_mask(&c, true, false, 0.8, 1));
        c.bias = Some(common::random_bias(&c, false, true, 0.05, 1));
        // and a user's score modifier and mask (their WGSL, and the score chain's, under Tint)
        c.score_mod = Some(common::score_mods::rational());
        c.mask_mod = Some(common::score_mods::dilated());
        // (the rows kernels sharing tiles across a subgroup run in the test above: the
        // sharing is in how tiles are read, which the modifiers do not touch)
        // (CI: the rows kernels; the blocks kernels, 5-10x slower for lavapipe to compile
        // from Tint's SPIR-V, and the naive path with every modifier in the full tier)
        let algorithms = common::tier::sample(&common::algorithm_variants(), &[0]);
        for (i, (algorithm, variant)) in algorithms.into_iter().enumerate() {
            let sg = 0;
            let mut c = c.clone();
            c.algorithm = algorithm;
            // (CI: one case, so both)
            c.softcap = (i % 2 == 1 || !common::tier::full()).then_some(2.0);
            c.alibi_slopes = (i % 2 == 0).then(|| common::random_alibi(&c, true));
            let e = env(variant, sg, HalfStorage::Packed);
            let name = format!(
                "f32 {algorithm:?} {variant:?} sg={sg} {}",
                common::describe(&c, 0)
            );
            all.extend(cases_in(DType::F32, &c, 2.0, &e, &name));
        }
    }
    // Calls split into windows (bindings of a few KiB): whole batches (4 KiB), and rows of
    // one batch with several query and key windows merged in accumulate mode (8 KiB). Each
    // variant on each shape, in a format that rotates. The second shape takes dropout and a
    // block mask and a boolean mask too (its parts index them by the whole call's rows and
    // keys), the third is a packed varlen call.
    let mut dropped = cfg(1, 150, 130, 2, 1, 16, true);
    dropped.dropout = Some(common::random_dropout(0.3));
    dropped.block_mask = Some(common::random_block_mask(
        &dropped,
        (40, 20),
        false,
        true,
        0.6,
    ));
    dropped.mask = Some(common::random_bool_mask(&dropped, false, true, 0.8, 1));
    // the third: four sequences packed (varlen, 97 rows and 140 keys in all, one sequence
    // without rows and one without keys), causal in each, the parts looking their sequences
    // up by the whole call's rows and keys
    let v = flash_attn_wgpu::Varlen::from_lengths(&[30, 0, 50, 17], &[44, 20, 0, 76]);
    let mut packed = AttentionConfig::packed(v.cu_seqlens_q, v.cu_seqlens_kv, 1, 1, 24);
    packed.causal = true;
    let shapes = [
        (cfg(3, 20, 20, 2, 1, 16, true), 4 << 10),
        (dropped, 8 << 10),
        (packed, 8 << 10),
    ];
    // CI: each shape on one variant, the blocks kernels on the shape without modifiers (they
    // compile slowest from Tint's SPIR-V); the full tier: every variant on each (tier.rs)
    let variants = match common::tier::full() {
        true => Variant::ALL.to_vec(),
        false => vec![Variant::Blocks, Variant::Rows, Variant::Rows],
    };
    for (turn, ((c, limit), variant)) in common::tier::pairs(&shapes, &variants, |_, _| true)
        .into_iter()
        .enumerate()
    {
        let usable: Vec<_> = formats
            .iter()
            .filter(|&&(dtype, half)| {
                on_dawn(variant, dtype, half) && (variant != Variant::Blocks || dtype == DType::F32)
            })
            .collect();
        let &(dtype, half) = usable[turn % usable.len()];
        let mut e = env(variant, 0, half);
        e.max_binding_bytes = limit;
        let name = format!(
            "{dtype} {half:?} {variant:?} windows of {limit} B {}",
            common::describe(&c, 0)
        );
        all.extend(cases_in(dtype, &c, 1.0, &e, &name));
    }
    run_cases(&script, "dawn-split-cases.json", &all);
}

#[test]
fn keys_a_row_cannot_see_never_reach_it_on_dawn() {
    // As tests/nonfinite.rs on wgpu: NaN and Inf in keys and values the causal mask hides from
    // most rows, and a NaN query row. NaN exactly where the reference has it, every other
    // element as the reference.
    let Some(script) = runner() else { return };
    let c0 = cfg(1, 40, 40, 2, 1, 16, true);
    // One dtype per algorithm, in turns (bf16, f16, f32, ...; the blocks kernels, slowest to
    // compile from Tint's SPIR-V, get f32): every dtype's loads meet the poison on Dawn, and
    // every algorithm does; tests/dtypes.rs runs each dtype on every variant on wgpu. (All
    // three on every algorithm took four minutes of lavapipe compiles.)
    let mut all = Vec::new();
    // (CI: the rows kernels in bf16 and the naive path in f32; tier.rs)
    let keep = |i: &usize| common::tier::full() || [0, 2].contains(i);
    for (i, (algorithm, variant)) in common::algorithm_variants()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| keep(i))
    {
        let mut c = c0.clone();
        c.algorithm = algorithm;
        let e = env(variant, 0, HalfStorage::Packed);
        let name = format!("poisoned {algorithm:?} {variant:?}");
        all.extend(match i % 3 {
            0 => cases_of(
                &c,
                &e,
                &format!("bf16 {name}"),
                poisoned_inputs::<half::bf16>(&c),
            ),
            1 => cases_of(
                &c,
                &e,
                &format!("f16 {name}"),
                poisoned_inputs::<half::f16>(&c),
            ),
            _ => cases_of(&c, &e, &format!("f32 {name}"), poisoned_inputs::<f32>(&c)),
        });
    }
    assert!(all.iter().all(|case| !case.checks.is_empty()));
    assert!(
        all.iter()
            .any(|case| case.checks.iter().any(|k| !k.nan.is_empty())),
        "the poisoned rows must be expected NaN"
    );
    run_cases(&script, "dawn-poisoned.json", &all);
}

#[test]
fn every_kernel_variant_compiles_with_tint() {
    let Some(script) = runner() else { return };
    let dawn = dawn_adapter(&script);
    let mut seen = std::collections::HashSet::new();
    let modules: Vec<serde_json::Value> = pipeline_keys(&devices())
        .into_iter()
        // cooperative matrices are a wgpu extension Tint does not have
        .filter(|k| !k.kernel.is_coop())
        .filter(|k| {
            (dawn.shader_f16 || !k.uses_f16()) && (dawn.subgroup != 0 || !k.uses_subgroups())
        })
        .filter_map(|k| {
            // Tint's source differs from naga's only in directives: most dedupe again
            let wgsl = k.wgsl_for(WgslConsumer::Tint);
            seen.insert(wgsl.clone())
                .then(|| serde_json::json!({ "label": k.label(), "wgsl": wgsl }))
        })
        .collect();
    assert!(modules.len() > 400, "{} modules", modules.len());
    let path = write_json(
        "tint-modules.json",
        &serde_json::json!({ "modules": modules }),
    );
    let (ok, out) = run_node(&script, &["compile", path.to_str().unwrap()]);
    eprintln!("{out}");
    assert!(ok, "Tint rejected some variants (see the FAIL lines above)");
}

/// A merge of three random shards (rows some shards, or all, see no key of: lse -inf, out 0)
/// in `T`, against the f64 reference merge of the same rounded values.
fn merge_case<T: Element>(e: &plan::PlanEnv, name: &str) -> ReplayCase {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let seed = common::fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let shape = [2, 3, 2, 12];
    let n: usize = shape.iter().product();
    let rows = 2 * 2 * 3;
    let shards: Vec<(Vec<T>, Vec<f32>)> = (0..3)
        .map(|s| {
            let lse: Vec<f32> = (0..rows)
                .map(|r| {
                    if r == 0 || (r == 1 && s != 1) || rng.random_bool(0.2) {
                        f32::NEG_INFINITY
                    } else {
                        rng.random_range(-20.0f32..20.0)
                    }
                })
                .collect();
            let mut out = common::random(&mut rng, n, 2.0);
            for (r, l) in lse.iter().enumerate() {
                if *l == f32::NEG_INFINITY {
                    let (bh, i) = (r / 3, r % 3);
                    let o = (((bh / 2) * 3 + i) * 2 + bh % 2) * 12;
                    out[o..o + 12].fill(0.0);
                }
            }
            (from_f32_slice::<T>(&out), lse)
        })
        .collect();
    let as64: Vec<(Vec<f64>, Vec<f64>)> = shards
        .iter()
        .map(|(o, l)| {
            (
                to_f32_vec(o).iter().map(|&x| x as f64).collect(),
                l.iter().map(|&x| x as f64).collect(),
            )
        })
        .collect();
    let refs: Vec<(&[f64], &[f64])> = as64.iter().map(|(o, l)| (&o[..], &l[..])).collect();
    let want = reference::merge(shape, &refs);
    let p = plan::merge(shape, 3, T::DTYPE, e).expect("merge plan");
    let words = shards
        .iter()
        .flat_map(|(o, l)| [to_words(o), to_words(l)])
        .collect();
    let mut case = p.replay(
        &format!("merge {name} seed={seed}"),
        WgslConsumer::Tint,
        words,
        65535,
    );
    case.checks = vec![
        tensor_check("out", p.replay_output_buffer(0), T::DTYPE, &want.out),
        lse_check(p.replay_output_buffer(1), &want.lse),
    ];
    case
}

#[test]
fn merges_and_decode_splits_match_the_f64_reference_on_dawn() {
    // the public merge of random shards in every format, and decode calls (split-KV with GQA
    // packing, then, in f32, the backward from their out and lse; and in one split) with
    // sinks, ALiBi, a window, key lengths and left padding, in f32 and a half format
    let Some(script) = runner() else { return };
    let dawn = dawn_adapter(&script);
    let mut decode = cfg(2, 2, 300, 8, 2, 32, true);
    decode.sinks = Some(common::random_sinks(&decode));
    decode.alibi_slopes = Some(common::random_alibi(&decode, false));
    decode.window = flash_attn_wgpu::Window::new(Some(200), Some(0));
    decode.seqlens_kv = Some(vec![300, 41]);
    decode.leftpad_kv = Some(vec![110, 9]);
    decode.kv_splits = Some(5);
    let mut all = Vec::new();
    for (n, (dtype, half)) in formats(&dawn).into_iter().enumerate() {
        let e = env(Variant::Rows, 0, half);
        let name = format!("{dtype} {half:?}");
        all.push(match dtype {
            DType::F32 => merge_case::<f32>(&e, &name),
            DType::F16 => merge_case::<half::f16>(&e, &name),
            DType::BF16 => merge_case::<half::bf16>(&e, &name),
        });
        // decode in f32 and the first half format: the formats differ only in the prelude's
        // load and store functions, which the merges above and the other tests here run in
        // every format (and tests/gpu/decode.rs on naga); each decode replay is minutes of
        // lavapipe compiles from Tint's SPIR-V
        // (CI: f32 only; tier.rs)
        if n > 1 || (n > 0 && !common::tier::full()) {
            continue;
        }
        let p = plan::forward(&decode, dtype, &e).expect("decode plan");
        assert_eq!(
            p.steps[0].key.kernel,
            flash_attn_wgpu::unstable::kernels::Kernel::FlashDecode
        );
        // the backward from the decode's out and lse in f32 only: its kernels are the usual
        // backward's, which the other Dawn tests run in every format (in every format here
        // they took seven minutes of lavapipe compiles, with the modifiers on)
        let [fwd, bwd] = cases_in(dtype, &decode, 2.0, &e, &format!("decode {name}"));
        all.push(fwd);
        // (CI: the forward only; the backward's kernels are the ones the modifier case of
        // `windows_and_split_calls_match_the_f64_reference_on_dawn` runs)
        if dtype == DType::F32 && common::tier::full() {
            all.push(bwd);
        }
        // one split: the kernel that finishes the rows itself (forward only: the backward is
        // the case above's)
        let one = AttentionConfig {
            kv_splits: Some(1),
            ..decode.clone()
        };
        let p = plan::forward(&one, dtype, &e).expect("one-split decode plan");
        assert_eq!(
            p.steps[0].key.kernel,
            flash_attn_wgpu::unstable::kernels::Kernel::FlashDecodeOne
        );
        let [fwd, _] = cases_in(dtype, &one, 2.0, &e, &format!("decode one split {name}"));
        all.push(fwd);
    }
    run_cases(&script, "dawn-merge-decode.json", &all);
}

#[test]
fn eight_bit_cache_reads_match_the_f64_reference_on_dawn() {
    // a decode step over q8_0 and E4M3 caches (split-KV and one split), and the tiled forward
    // over one: the kernels' cache loads on a second implementation, against the reference
    // over the values the cache holds (the host's dequantization; 13 s on lavapipe, the
    // modifiers off). The quantizing append is tests/gpu/kvcache.rs's (its GPU rounding may
    // differ from the host's by a step on a tie, so a replay could not check it exactly).
    use flash_attn_wgpu::CacheFormat;
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let Some(script) = runner() else { return };
    let seed = common::fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let e = env(Variant::Rows, 0, HalfStorage::Packed);
    let mut all = Vec::new();
    for (format, seq_q, splits) in [
        (CacheFormat::Q8_0, 1, Some(3)),
        (CacheFormat::E4M3, 2, Some(1)),
        (CacheFormat::Q8_0, 7, None),
    ] {
        let mut c = cfg(2, seq_q, 90, 4, 2, 64, true);
        c.seqlens_kv = Some(vec![90, 37]);
        c.align_to_seqlens = true;
        c.kv_splits = splits;
        let shape = c.kv_shape();
        let n: usize = shape.iter().product();
        let mut values = || -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.5..1.5)).collect() };
        let (k, v) = (values(), values());
        let words = |x: &[f32]| {
            let scales =
                (format == CacheFormat::E4M3).then(|| CacheFormat::e4m3_head_scales(x, shape));
            format.quantize(x, shape, scales.as_deref()).unwrap()
        };
        let (kw, vw) = (words(&k), words(&v));
        let (kq, vq) = (
            format.dequantize(&kw, shape).unwrap(),
            format.dequantize(&vw, shape).unwrap(),
        );
        let q: Vec<f32> = (0..c.q_shape().iter().product::<usize>())
            .map(|_| rng.random_range(-1.5..1.5))
            .collect();
        let want = reference::forward(&c, &q, &kq, &vq);
        let mut p = plan::forward(&c, DType::F32, &e).expect("forward plan");
        plan::quantized::read_cache(&mut p, format, &c, &e).unwrap();
        let name = format!("{format} seq_q {seq_q} splits {splits:?} seed={seed}");
        let mut case = p.replay(&name, WgslConsumer::Tint, vec![to_words(&q), kw, vw], 65535);
        case.checks = vec![
            tensor_check("out", p.replay_output_buffer(0), DType::F32, &want.out),
            lse_check(p.replay_output_buffer(1), &want.lse),
        ];
        all.push(case);
    }
    run_cases(&script, "dawn-eight-bit.json", &all);
}
