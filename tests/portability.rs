//! Portability without a GPU: every generated kernel variant through every backend's shader
//! compiler that naga drives (SPIR-V for Vulkan, exactly as the pipeline cache ships it,
//! checked by spirv-val 2025.5; MSL for Metal; HLSL for DX12), and a lint for WGSL that naga accepts but the
//! WGSL specification, or another compiler (Tint), rejects or compiles differently. Tint's own
//! compile of every variant is in tests/dawn.rs.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use flash_attn_wgpu::unstable::kernels::enumerate::{devices, pipeline_keys};
use flash_attn_wgpu::unstable::kernels::{Kernel, KernelKey, Pass, Variant};
use flash_attn_wgpu::unstable::spirv::{kernel_spirv, without_private_layouts, SpirvTarget};

fn naga_module(key: &KernelKey) -> (naga::Module, naga::valid::ModuleInfo) {
    let src = key.wgsl();
    let module = naga::front::wgsl::parse_str(&src)
        .unwrap_or_else(|e| panic!("{}: {}", key.label(), e.emit_to_string(&src)));
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{}: {}", key.label(), e.emit_to_string(&src)));
    (module, info)
}

/// `tool` when it runs; otherwise None, which fails under CI and only warns elsewhere (the
/// SPIR-V is still generated). `what` names the tool and how to get it.
fn validator(tool: PathBuf, what: &str) -> Option<PathBuf> {
    if Command::new(&tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Some(tool);
    }
    let msg = format!("{what} is not installed (`bash scripts/ensure-portability.sh` installs it)");
    if std::env::var_os("CI").is_some() {
        panic!("{msg}");
    }
    eprintln!("{msg}: SPIR-V is generated but not validated");
    None
}

/// Writes `words` to `file` and asserts that `tool` accepts them for Vulkan 1.3.
fn assert_valid_spirv(tool: &Path, file: &Path, words: &[u32], label: &str) {
    std::fs::write(file, bytemuck::cast_slice::<u32, u8>(words)).unwrap();
    let out = Command::new(tool)
        .args(["--target-env", "vulkan1.3"])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{label}: {}: {}",
        tool.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a Vulkan 1.3 device with f16, subgroups and cooperative matrices is handed (a kernel
/// asks only for the capabilities it uses); buffer accesses clamped in the SPIR-V (a device
/// with robustBufferAccess2 gets them unclamped: every other pipeline is checked so).
const VULKAN_1_3: SpirvTarget = SpirvTarget {
    lang_version: (1, 6),
    robust_buffers: false,
    f16: true,
    subgroups: true,
    cooperative_matrices: true,
};

#[test]
fn every_variant_translates_to_spirv_msl_and_hlsl() {
    // Debian's spirv-val (2023.1) predates SPV_KHR_cooperative_matrix and the rule on
    // explicit layouts outside buffers (VUID-StandaloneSpirv-None-10684): spirv-val 2025.5,
    // which ensure-portability.sh unpacks into .tools/, checks every kernel.
    let tool = validator(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .join(".tools/spirv-tools-2025.5/bin/spirv-val"),
        "spirv-val 2025.5 (.tools/)",
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("spirv");
    std::fs::create_dir_all(&dir).unwrap();
    let mut seen = HashSet::new();
    let mut count = 0;
    let mut validated = 0;
    let mut coop_msl = 0;
    for key in pipeline_keys(&devices()) {
        let wgsl = key.wgsl();
        if !seen.insert(wgsl.clone()) {
            continue;
        }
        count += 1;
        let label = key.label();

        // the words Vulkan gets, as the pipeline cache makes them: validated as written
        let target = SpirvTarget {
            robust_buffers: count % 2 == 0,
            ..VULKAN_1_3
        };
        let words = kernel_spirv(&wgsl, &target)
            .unwrap_or_else(|e| panic!("{label}: no SPIR-V to ship: {e}"));
        if let Some(tool) = &tool {
            assert_valid_spirv(tool, &dir.join(format!("v{count}.spv")), &words, &label);
            validated += 1;
        }

        // Cooperative matrices of 16x16 exist on Vulkan only: Metal's simdgroup matrices are
        // 8x8 (the coop kernels at fragment size 8 translate to MSL, what a Mac runs), and
        // DX12 has none in naga.
        let coop8 = key.kernel.is_coop() && key.tiles.rpt == 8;
        if key.kernel.is_coop() && !coop8 {
            continue;
        }
        let (module, info) = naga_module(&key);
        let msl_options = naga::back::msl::Options {
            lang_version: (2, 4),
            ..Default::default()
        };
        let msl_pipeline = naga::back::msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, "main".into())),
            ..Default::default()
        };
        naga::back::msl::write_string(&module, &info, &msl_options, &msl_pipeline)
            .unwrap_or_else(|e| panic!("{label}: MSL: {e}"));
        if coop8 {
            coop_msl += 1;
            continue;
        }

        let hlsl_options = naga::back::hlsl::Options {
            shader_model: naga::back::hlsl::ShaderModel::V6_2,
            ..Default::default()
        };
        let hlsl_pipeline = naga::back::hlsl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, "main".into())),
        };
        let mut hlsl = String::new();
        naga::back::hlsl::Writer::new(&mut hlsl, &hlsl_options, &hlsl_pipeline)
            .write(&module, &info, None)
            .unwrap_or_else(|e| panic!("{label}: HLSL: {e}"));
    }
    // every enumerated pipeline (kernels::enumerate, one per distinct source)
    assert_eq!(count, pipeline_keys(&devices()).len(), "{count} variants");
    // the 8x8 coop kernels (lavapipe 26's in the list, as Apple's) reached MSL
    assert!(
        coop_msl >= 3,
        "{coop_msl} coop kernels at 8x8 translated to MSL"
    );
    eprintln!(
        "{count} variants translated to SPIR-V, MSL and HLSL (the {coop_msl} coop kernels at \
         8x8 to SPIR-V and MSL); {validated} shipped SPIR-V modules validated by spirv-val \
         2025.5 (vulkan1.3)"
    );
}

/// The cleaning keeps what buffers need: naga's words for a kernel hold layout decorations
/// on types no buffer reaches (spirv-val rejects them), the shipped words hold none there,
/// and every decoration of a buffer type survives.
#[test]
fn layouts_leave_workgroup_and_private_types_and_stay_on_buffers() {
    let key = pipeline_keys(&devices())
        .into_iter()
        .find(|k| matches!(k.kernel, Kernel::Flash(Variant::Blocks, Pass::Forward)))
        .expect("a forward kernel");
    let (module, info) = naga_module(&key);
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    let raw = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline)).unwrap();
    let clean = without_private_layouts(&raw).unwrap();
    let layouts = |w: &[u32]| {
        count_ops(w, |op, i| {
            (op == 71 && i[2] == 6) || (op == 72 && matches!(i[3], 7 | 35))
        })
    };
    assert!(
        layouts(&clean) < layouts(&raw),
        "nothing removed: {} layout decorations before, {} after",
        layouts(&raw),
        layouts(&clean)
    );
    // only decorations went: every other instruction is kept, in order
    let others = |w: &[u32]| {
        let mut v = Vec::new();
        walk(w, |op, i| {
            if op != 71 && op != 72 {
                v.push(i.to_vec())
            }
        });
        v
    };
    assert_eq!(others(&raw), others(&clean));
    // the buffers' runtime arrays keep their strides
    let strided_runtime_arrays = |w: &[u32]| {
        let mut runtime = HashSet::new();
        walk(w, |op, i| {
            if op == 29 {
                runtime.insert(i[1]);
            }
        });
        count_ops(w, |op, i| op == 71 && i[2] == 6 && runtime.contains(&i[1]))
    };
    assert!(strided_runtime_arrays(&clean) > 0);
    assert_eq!(strided_runtime_arrays(&clean), strided_runtime_arrays(&raw));
}

/// The cleaning refuses a type that both a buffer and a private variable use (it would have
/// to split the type) rather than strip the buffer's layout.
#[test]
fn a_type_shared_by_a_buffer_and_a_private_variable_is_refused() {
    let src = "struct S { a: f32, b: array<f32, 4> }\n\
               @group(0) @binding(0) var<storage, read_write> buf: S;\n\
               var<private> copy: S;\n\
               @compute @workgroup_size(1) fn main() { copy = buf; copy.a = 2.0; buf = copy; }\n";
    let e = kernel_spirv(src, &VULKAN_1_3).unwrap_err();
    assert!(e.contains("laid out for a buffer"), "{e}");
}

fn walk(words: &[u32], mut f: impl FnMut(u32, &[u32])) {
    let mut i = 5;
    while i < words.len() {
        let n = (words[i] >> 16) as usize;
        f(words[i] & 0xffff, &words[i..i + n]);
        i += n;
    }
}

fn count_ops(words: &[u32], f: impl Fn(u32, &[u32]) -> bool) -> usize {
    let mut n = 0;
    walk(words, |op, i| n += usize::from(f(op, i)));
    n
}

// ---- The lint. Each rule is a class of construct found to break portability; the test
// fails with the file, line and rule.

/// WGSL sources the kernels are built from (the generated prelude is checked on every
/// variant in `generated_preludes_pass_the_lint`).
fn sources() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = Kernel::ALL
        .iter()
        .map(|k| (format!("{}.wgsl", k.name()), k.source().to_string()))
        .collect();
    v.extend(
        flash_attn_wgpu::unstable::kernels::hooks::wgsl_snippets()
            .map(|(name, text)| (name, text.to_string())),
    );
    v.push((
        "common.wgsl".into(),
        include_str!("../shaders/common.wgsl").into(),
    ));
    v.push((
        "blocks.wgsl".into(),
        include_str!("../shaders/blocks.wgsl").into(),
    ));
    v.push((
        "coop.wgsl".into(),
        include_str!("../shaders/coop.wgsl").into(),
    ));
    v
}

/// Problems in one WGSL text: (line, rule).
fn lint(text: &str) -> Vec<(usize, &'static str)> {
    let mut found = Vec::new();
    let mut depth = 0i32;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split("//").next().unwrap_or("");
        let t = line.trim();
        // 1. Tint zero-initializes a `var` without initializer once, not at each loop iteration
        //    as WGSL requires: code that accumulates into one would silently go wrong. Every
        //    function-scope var gets an explicit initializer.
        if depth > 0 && t.starts_with("var ") && !t.contains('=') {
            found.push((n + 1, "function-scope var without an initializer"));
        }
        // 2. A const-expression whose value is infinite or NaN is an error in WGSL (Tint
        //    enforces it; naga folds it silently): no bitcast of a literal to a float.
        let compact: String = t.split_whitespace().collect();
        for ty in ["bitcast<f32>(", "bitcast<f16>(", "bitcast<vec2<f16>>("] {
            if let Some(at) = compact.find(ty) {
                let arg = &compact[at + ty.len()..];
                if arg.starts_with(|c: char| c.is_ascii_digit()) {
                    found.push((n + 1, "bitcast of a literal to a float (infinite or NaN const-expressions are invalid WGSL)"));
                }
            }
        }
        // 3. Directives differ per compiler (naga rejects `enable subgroups;`, Tint requires
        //    it): only the generator (KernelKey::wgsl_for) writes them.
        if depth == 0 && (t.starts_with("enable ") || t.starts_with("requires ")) {
            found.push((
                n + 1,
                "a directive in a source file (the generator emits them per compiler)",
            ));
        }
        // 4. Float literals out of f32 range are infinite const-expressions too.
        for word in
            t.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+'))
        {
            if word.contains('e')
                && word
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit() || c == '-')
            {
                if let Ok(x) = word.trim_end_matches('f').parse::<f64>() {
                    if x.is_finite() && x.abs() > f32::MAX as f64 {
                        found.push((n + 1, "float literal outside the f32 range"));
                    }
                }
            }
        }
        depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
    }
    found
}

#[test]
fn kernel_sources_pass_the_portability_lint() {
    let mut problems = Vec::new();
    for (name, text) in sources() {
        for (line, rule) in lint(&text) {
            problems.push(format!("shaders/{name}:{line}: {rule}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn generated_preludes_pass_the_portability_lint() {
    let mut seen = HashSet::new();
    for key in pipeline_keys(&devices()) {
        let src = key.wgsl();
        let prelude_end = src
            .find(include_str!("../shaders/common.wgsl"))
            .unwrap_or(src.len());
        let prelude = &src[..prelude_end];
        if !seen.insert(prelude.to_string()) {
            continue;
        }
        // the directives are the generator's own (f16, cooperative matrices), at the top
        let body: String = prelude
            .lines()
            .filter(|l| !l.starts_with("enable "))
            .collect::<Vec<_>>()
            .join("\n");
        let problems = lint(&body);
        assert!(problems.is_empty(), "{}: {problems:?}", key.label());
    }
}

#[test]
fn the_lint_catches_each_class_it_names() {
    let bad = "fn f() {\n    var x: f32;\n    let i = bitcast<f32>(0x7f800000u);\n    let b = 1.0e39;\n}\nenable subgroups;\n";
    let rules: Vec<&str> = lint(bad).into_iter().map(|(_, r)| r).collect();
    assert_eq!(rules.len(), 4, "{rules:?}");
    let good = "fn f() {\n    var x = 0.0;\n    let i = bitcast<f32>(runtime_bits(0x7f800000u));\n    let b = 3.0e38;\n}\n";
    assert!(lint(good).is_empty(), "{:?}", lint(good));
}
