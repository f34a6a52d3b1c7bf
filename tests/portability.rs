//! Portability without a GPU: every generated kernel variant through every backend's shader
//! compiler that naga drives (SPIR-V for Vulkan, checked by `spirv-val` where it is
//! installed; MSL for Metal; HLSL for DX12), and a lint for WGSL that naga accepts but the
//! WGSL specification, or another compiler (Tint), rejects or compiles differently. Tint's own
//! compile of every variant is in tests/dawn.rs.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use flash_attn_wgpu::unstable::kernels::enumerate::{devices, pipeline_keys};
use flash_attn_wgpu::unstable::kernels::{Kernel, KernelKey};

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

/// Writes `words` to `file` and asserts that `tool` accepts them for Vulkan 1.1.
fn assert_valid_spirv(tool: &Path, file: &Path, words: &[u32], label: &str) {
    std::fs::write(file, bytemuck::cast_slice::<u32, u8>(words)).unwrap();
    let out = Command::new(tool)
        .args(["--target-env", "vulkan1.1"])
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

/// `words` without the ArrayStride decorations of arrays in the Workgroup storage class.
/// naga decorates every array type with its stride, and spirv-val 2025 rejects explicit
/// layouts in Workgroup memory (VUID-StandaloneSpirv-None-10684): a naga-wide quirk that every
/// kernel has and drivers accept, not a property of ours. The rest is validated as written.
fn without_workgroup_array_strides(words: &[u32]) -> Vec<u32> {
    const OP_TYPE_POINTER: u32 = 32;
    const OP_DECORATE: u32 = 71;
    const STORAGE_WORKGROUP: u32 = 4;
    const DECORATION_ARRAY_STRIDE: u32 = 6;
    let instructions = || {
        let mut i = 5;
        std::iter::from_fn(move || {
            let n = (*words.get(i)? >> 16) as usize;
            let inst = &words[i..i + n.max(1)];
            i += n.max(1);
            Some(inst)
        })
    };
    let workgroup_pointees: HashSet<u32> = instructions()
        .filter(|w| w[0] & 0xffff == OP_TYPE_POINTER && w[2] == STORAGE_WORKGROUP)
        .map(|w| w[3])
        .collect();
    let mut out = words[..5].to_vec();
    for w in instructions() {
        let drop = w[0] & 0xffff == OP_DECORATE
            && w[2] == DECORATION_ARRAY_STRIDE
            && workgroup_pointees.contains(&w[1]);
        if !drop {
            out.extend_from_slice(w);
        }
    }
    out
}

#[test]
fn every_variant_translates_to_spirv_msl_and_hlsl() {
    // Debian's spirv-val (2023.1) predates SPV_KHR_cooperative_matrix: the coop kernels go to
    // spirv-val 2025.5, which ensure-portability.sh unpacks into .tools/.
    let debian = validator(
        PathBuf::from("spirv-val"),
        "spirv-val (Debian's spirv-tools)",
    );
    let modern = validator(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .join(".tools/spirv-tools-2025.5/bin/spirv-val"),
        "spirv-val 2025.5 (.tools/)",
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("spirv");
    std::fs::create_dir_all(&dir).unwrap();
    let mut seen = HashSet::new();
    let mut count = 0;
    let mut coop_validated = 0;
    for key in pipeline_keys(&devices()) {
        if !seen.insert(key.wgsl()) {
            continue;
        }
        count += 1;
        let (module, info) = naga_module(&key);
        let label = key.label();

        let spv_options = naga::back::spv::Options {
            lang_version: (1, 3),
            ..Default::default()
        };
        let pipeline = naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: "main".into(),
        };
        let words = naga::back::spv::write_vec(&module, &info, &spv_options, Some(&pipeline))
            .unwrap_or_else(|e| panic!("{label}: SPIR-V: {e}"));
        if key.kernel.is_coop() {
            if let Some(tool) = &modern {
                let file = dir.join(format!("v{count}-coop.spv"));
                assert_valid_spirv(
                    tool,
                    &file,
                    &without_workgroup_array_strides(&words),
                    &label,
                );
                coop_validated += 1;
            }
        } else if let Some(tool) = &debian {
            assert_valid_spirv(tool, &dir.join(format!("v{count}.spv")), &words, &label);
        }

        // Cooperative matrices of 16x16 (what the coop kernels use) exist on Vulkan only:
        // Metal's simdgroup matrices are 8x8 and DX12 has none in naga.
        if key.kernel.is_coop() {
            continue;
        }
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
    eprintln!(
        "{count} variants translated to SPIR-V, MSL and HLSL; {coop_validated} cooperative-matrix \
         ones validated by spirv-val 2025.5"
    );
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
        flash_attn_wgpu::modifiers::wgsl_snippets().map(|(name, text)| (name, text.to_string())),
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
