//! The layers of the crate point one way: the spec (configs, the modifiers' values and their
//! registry, validation, dtypes, errors, the f64 reference, kernels as data, tiles, plans)
//! knows nothing of a device; the wgpu backend
//! (device, tensors, recording, the calls) and the CUDA backend sit on it; the facade (the
//! backend trait, re-exports) on top. A spec file that names a backend's module is an import
//! that would close a circle: this test fails on it. A second test finds every import circle
//! between the files of src/ (paths through `crate::`, `super::`, `self::` and child modules,
//! followed through re-exports to the defining file) and fails on any, with the circle
//! printed. Runs without a GPU.

use std::path::Path;

/// The spec layer: files and folders under src/.
const SPEC: [&str; 11] = [
    "config.rs",
    "validate.rs",
    "registry",
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

// ---- Import circles between the files of src/ (issue 51).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

/// The crate's module tree: each file's module path (`src/a/b.rs` is `a::b`, `src/a/mod.rs`
/// is `a`), and what each module re-exports (`pub use`), so that a path through a re-export
/// reaches the file that defines the item.
struct Modules {
    files: BTreeMap<Vec<String>, PathBuf>,
    reexports: HashMap<(Vec<String>, String), Vec<String>>,
}

fn module_of(src: &Path, f: &Path) -> Vec<String> {
    let rel = f.strip_prefix(src).unwrap().with_extension("");
    let mut m: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if matches!(m.last().map(String::as_str), Some("mod" | "lib")) {
        m.pop();
    }
    m
}

/// A file's code without its comments (a line's text from `//` on) and without its unit tests
/// (from `#[cfg(test)]` on: an inline `mod tests`, whose `super` is the file itself).
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        // a doc attribute's text is a comment too
        .filter(|l| !l.contains("doc = \""))
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a `use` tree names (`a::{b, c::d as e}` is `a::b` and `a::c::d`), each with the
/// name it is bound to.
fn use_tree(tree: &str) -> Vec<(Vec<String>, String)> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let prefix: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let (mut parts, mut depth, mut cur) = (Vec::new(), 0, String::new());
        for c in inner.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
            cur.push(c);
        }
        parts.push(cur);
        return parts
            .iter()
            .filter(|p| !p.trim().is_empty())
            .flat_map(|p| {
                use_tree(p).into_iter().map(|(segs, alias)| {
                    let mut all = prefix.clone();
                    all.extend(segs);
                    (all, alias)
                })
            })
            .collect();
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p, Some(a.trim().to_string())),
        None => (tree, None),
    };
    let segs: Vec<String> = path
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let alias = alias.unwrap_or_else(|| segs.last().cloned().unwrap_or_default());
    vec![(segs, alias)]
}

/// The `use` statements of `code` (each starting a line, perhaps after a visibility): (public,
/// the tree).
fn uses(code: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let mut offset = 0;
    for line in code.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let t = line.trim_start();
        let (public, rest) = if let Some(r) = t.strip_prefix("use ") {
            (false, r)
        } else if let Some(r) = ["pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find_map(|p| t.strip_prefix(p))
        {
            (true, r)
        } else {
            continue;
        };
        let from = start + (line.len() - rest.len());
        let end = code[from..].find(';').map_or(code.len(), |n| from + n);
        out.push((public, code[from..end].to_string()));
    }
    out
}

impl Modules {
    fn read(src: &Path) -> Modules {
        let mut all = Vec::new();
        rust_files(src, &mut all);
        let mut files = BTreeMap::new();
        let mut reexports = HashMap::new();
        for f in all {
            let m = module_of(src, &f);
            let code = code_of(&std::fs::read_to_string(&f).unwrap());
            for (public, tree) in uses(&code) {
                if public {
                    for (segs, alias) in use_tree(&tree) {
                        reexports.insert((m.clone(), alias), segs);
                    }
                }
            }
            files.insert(m, f);
        }
        Modules { files, reexports }
    }

    /// `segs` (`crate::`, `super::`, `self::` or a child module first) from module `m` as a
    /// path from the crate root; None for another crate's path.
    fn absolute(&self, m: &[String], segs: &[String]) -> Option<Vec<String>> {
        let mut base: Vec<String> = m.to_vec();
        let mut rest = segs;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                let mut child = base.clone();
                child.push(first.to_string());
                if !self.files.contains_key(&child) {
                    return None; // another crate, or an item of this file
                }
            }
            None => return None,
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The file that defines what the absolute path `segs` names.
    fn file_of(&self, segs: &[String], depth: usize) -> Option<&PathBuf> {
        let mut module: Vec<String> = Vec::new();
        let mut found = self.files.get(&module);
        for (i, s) in segs.iter().enumerate() {
            let mut next = module.clone();
            next.push(s.clone());
            if let Some(f) = self.files.get(&next) {
                module = next;
                found = Some(f);
                continue;
            }
            if depth < 8 {
                if let Some(target) = self.reexports.get(&(module.clone(), s.clone())) {
                    let mut abs = self.absolute(&module, target)?;
                    abs.extend(segs[i + 1..].iter().cloned());
                    return self.file_of(&abs, depth + 1);
                }
            }
            break;
        }
        found
    }
}

/// The files each file's code names through `crate::`, `super::` and `self::` paths (in `use`
/// statements and inline), through re-exports to the defining file. The crate root and
/// `unstable.rs` (facades that only re-export) are left out.
fn import_graph(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let modules = Modules::read(src);
    let facade = |f: &Path| f == src.join("lib.rs") || f == src.join("unstable.rs");
    let mut graph = BTreeMap::new();
    for (m, f) in &modules.files {
        if facade(f) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        // a `pub use` re-exports (read by `Modules`): a path through it reaches the defining
        // file, so it is no edge of its own
        let mut paths: Vec<Vec<String>> = uses(&code)
            .into_iter()
            .filter(|(public, _)| !public)
            .flat_map(|(_, tree)| use_tree(&tree).into_iter().map(|(segs, _)| segs))
            .collect();
        let own: String = code
            .lines()
            .filter(|l| !l.trim_start().starts_with("pub") || !l.contains(" use "))
            .collect::<Vec<_>>()
            .join("\n");
        for head in ["crate::", "super::", "self::"] {
            for (at, _) in own.match_indices(head) {
                if own[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let segs: Vec<String> = own[at..]
                    .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .next()
                    .unwrap_or("")
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
                paths.push(segs);
            }
        }
        let mut to = BTreeSet::new();
        for segs in paths {
            let Some(abs) = modules.absolute(m, &segs) else {
                continue;
            };
            if let Some(t) = modules.file_of(&abs, 0) {
                if t != f && !facade(t) {
                    to.insert(t.clone());
                }
            }
        }
        graph.insert(f.clone(), to);
    }
    graph
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        graph: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: HashMap<&'a PathBuf, usize>,
        low: HashMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a PathBuf) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let Some((w, _)) = s.graph.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        graph,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// No two files of src/ import each other, directly or through others: each file depends
/// one way (the modifiers' values below the config, the config below the registry, the
/// kernels' hooks below the user-code checks). A circle fails with each of its files and the
/// files of the circle it imports.
#[test]
fn no_import_circle_in_src() {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("src");
    let graph = import_graph(&src);
    assert!(graph.len() >= 40, "{} files read", graph.len());
    let rel = |f: &PathBuf| f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
    let show = |c: &[PathBuf]| {
        // each file with the files of its circle it imports
        c.iter()
            .map(|f| {
                let to: Vec<String> = graph[f].iter().filter(|t| c.contains(t)).map(rel).collect();
                format!("  {} -> {}", rel(f), to.join(", "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let found: Vec<String> = circles(&graph).iter().map(|c| show(c)).collect();
    assert!(
        found.is_empty(),
        "import circles in src/:\n{}",
        found.join("\n\n")
    );
}

#[test]
fn the_circle_finder_finds_a_circle_and_reads_re_exports() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("circles");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(
        dir.join("lib.rs"),
        "mod a; mod b; mod c;\npub use a::Thing;\n",
    )
    .unwrap();
    std::fs::write(dir.join("a/mod.rs"), "mod inner;\npub use inner::Thing;\n").unwrap();
    // a/inner.rs -> b.rs (through the root's re-export of nothing: a direct path) -> c.rs ->
    // a/inner.rs (through a/mod.rs's re-export and then the root's)
    std::fs::write(dir.join("a/inner.rs"), "pub struct Thing(crate::b::B);\n").unwrap();
    std::fs::write(dir.join("b.rs"), "use crate::c::C;\npub struct B(C);\n").unwrap();
    std::fs::write(
        dir.join("c.rs"),
        "// crate::b in a comment is no import\npub struct C(Box<crate::Thing>);\n",
    )
    .unwrap();
    let graph = import_graph(&dir);
    let found = circles(&graph);
    let want: Vec<PathBuf> = ["a/inner.rs", "b.rs", "c.rs"]
        .iter()
        .map(|f| dir.join(f))
        .collect();
    assert_eq!(found, vec![want], "{graph:#?}");
}
