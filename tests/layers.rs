//! The layers of the crate point one way: the spec (configs and modifiers, dtypes, errors, the
//! f64 reference, kernels as data, tiles, plans) knows nothing of a device; the wgpu backend
//! (device, tensors, recording, the calls) and the CUDA backend sit on it; the facade (the
//! backend trait, re-exports) on top. A spec file that names a backend's module is an import
//! that would close a circle: this test fails on it. Runs without a GPU.

use std::path::Path;

/// The spec layer: files and folders under src/.
const SPEC: [&str; 9] = [
    "config.rs",
    "dtype.rs",
    "kv_format.rs",
    "error.rs",
    "modifiers",
    "rotary.rs",
    "reference.rs",
    "kernels",
    "plan",
];

/// What the spec may not name: the backends' modules and types.
const BACKEND: [&str; 14] = [
    "crate::device",
    "crate::record",
    "crate::tensor",
    "crate::cuda",
    "crate::forward",
    "crate::backward",
    "crate::merge",
    "crate::kvcache",
    "crate::replay",
    "crate::roofline",
    "crate::checks",
    "crate::backend",
    "crate::Context",
    "crate::Tensor",
];

fn rust_files(path: &Path, out: &mut Vec<std::path::PathBuf>) {
    if path.is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            rust_files(&e.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

#[test]
fn the_spec_layer_names_no_backend() {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("src");
    let mut files = Vec::new();
    for s in SPEC {
        let p = src.join(s);
        if p.exists() {
            rust_files(&p, &mut files);
        }
    }
    assert!(files.len() >= 15, "{} spec files found", files.len());
    let mut problems = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            // code only: comments and doc links may point anywhere
            let code = line.split("//").next().unwrap_or("");
            for b in BACKEND {
                let hit = code.match_indices(b).any(|(i, _)| {
                    // a whole path segment: crate::merge, not crate::merge_x
                    !code[i + b.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
                });
                if hit {
                    problems.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the spec layer names a backend:\n{}",
        problems.join("\n")
    );
}
