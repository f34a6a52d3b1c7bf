//! The layers of the crate point one way: the spec (configs, the modifiers' values and their
//! registry, validation, dtypes, errors, the f64 reference, kernels as data, tiles, plans)
//! knows nothing of a device; the wgpu backend (device, tensors, recording, the calls) and the
//! CUDA backend sit on it; the facade (the backend trait, re-exports) on top. Every file of
//! src/ is parsed (syn), and every path it names is read: in `use` items and written inline in
//! code, types, patterns, attributes' arguments and macro arguments (`crate::`, `super::`,
//! `self::` and child modules), each followed through re-exports to the file that defines the
//! item. A spec file that reaches a backend's file fails the first test; an import circle
//! between files fails the second, with the circle printed. Comments and doc text are no code:
//! the parse leaves them out. Runs without a GPU.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

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
    "reference",
    "kernels",
    "plan",
];

/// What the spec may not reach: the backends' files and folders.
const BACKEND: [&str; 12] = [
    "device",
    "record.rs",
    "tensor.rs",
    "cuda",
    "forward.rs",
    "backward.rs",
    "merge.rs",
    "kvcache",
    "replay.rs",
    "roofline.rs",
    "checks.rs",
    "backend.rs",
];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            rust_files(&e.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

fn src() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("src")
}

/// Files under `dir` that lie in one of `parts` (files or folders of it).
fn within(dir: &Path, parts: &[&str], f: &Path) -> bool {
    parts.iter().any(|p| f.starts_with(dir.join(p)))
}

#[test]
fn the_spec_layer_reaches_no_backend() {
    let src = src();
    let graph = import_graph(&src);
    let spec: Vec<&PathBuf> = graph.keys().filter(|f| within(&src, &SPEC, f)).collect();
    assert!(spec.len() >= 15, "{} spec files found", spec.len());
    let rel = |f: &Path| f.strip_prefix(&src).unwrap().display().to_string();
    let mut problems = Vec::new();
    for f in spec {
        for to in &graph[f] {
            if within(&src, &BACKEND, to) {
                problems.push(format!("{} -> {}", rel(f), rel(to)));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the spec layer reaches a backend:\n{}",
        problems.join("\n")
    );
}

// ---- The parse: what each file names.

/// What one file's code names: its `use` items (public or not: a public one re-exports),
/// each path with the name it is bound to, and every other path written in it.
#[derive(Default)]
struct Names {
    uses: Vec<(bool, Vec<String>, String)>,
    inline: Vec<Vec<String>>,
    /// The first segment of every path in the code (`MemTracker`, `Context::new`), so that a
    /// `pub use` whose name the file's own code uses counts as an import of it too.
    heads: std::collections::HashSet<String>,
}

/// True for an item or module the unit tests alone compile (`#[cfg(test)]`): its paths are
/// the tests', and an inline `mod tests`' `super` is the file itself.
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// The paths of a `use` tree (`a::{b, c::d as e}` is `a::b` and `a::c::d`), each with the name
/// it binds (`*` for a glob).
fn use_tree(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_tree(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut path = prefix.clone();
            // `use a::{self}` binds `a`
            if name != "self" {
                path.push(name.clone());
            }
            let bound = if name == "self" {
                prefix.last().cloned().unwrap_or_default()
            } else {
                name
            };
            out.push((path, bound));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            path.push(r.ident.to_string());
            out.push((path, r.rename.to_string()));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), "*".into())),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_tree(t, prefix, out);
            }
        }
    }
}

/// The paths in a macro's tokens (`format!("{}", crate::a::b(x))`): runs of identifiers joined
/// by `::`, in every group; the macro's own text is not parsed as code, so read as tokens.
fn token_paths(
    tokens: TokenStream,
    out: &mut Vec<Vec<String>>,
    heads: &mut std::collections::HashSet<String>,
) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(g) => token_paths(g.stream(), out, heads),
            TokenTree::Ident(id) => {
                // a path starts where no `::` comes before
                let after_colons = i >= 2
                    && matches!((&tokens[i - 1], &tokens[i - 2]),
                        (TokenTree::Punct(a), TokenTree::Punct(b)) if a.as_char() == ':' && b.as_char() == ':');
                if !after_colons {
                    heads.insert(id.to_string());
                    let mut segs = vec![id.to_string()];
                    let mut k = i + 1;
                    while k + 2 < tokens.len()
                        && matches!((&tokens[k], &tokens[k + 1]),
                            (TokenTree::Punct(a), TokenTree::Punct(b)) if a.as_char() == ':' && b.as_char() == ':')
                    {
                        match &tokens[k + 2] {
                            TokenTree::Ident(next) => {
                                segs.push(next.to_string());
                                k += 3;
                            }
                            _ => break,
                        }
                    }
                    if segs.len() > 1 {
                        out.push(segs);
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
}

impl<'ast> Visit<'ast> for Names {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let public = !matches!(u.vis, syn::Visibility::Inherited);
        let mut found = Vec::new();
        use_tree(&u.tree, &mut Vec::new(), &mut found);
        self.uses
            .extend(found.into_iter().map(|(p, bound)| (public, p, bound)));
    }

    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match i {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(x) => &x.attrs,
            syn::Item::Use(x) => &x.attrs,
            syn::Item::Const(x) => &x.attrs,
            syn::Item::Static(x) => &x.attrs,
            syn::Item::Struct(x) => &x.attrs,
            syn::Item::Enum(x) => &x.attrs,
            syn::Item::Trait(x) => &x.attrs,
            syn::Item::Macro(x) => &x.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            syn::visit::visit_item(self, i);
        }
    }

    // a statement's `use` (inside a function) is a `use` too: visit_item_use sees it
    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(first) = segs.first() {
            self.heads.insert(first.clone());
        }
        if segs.len() > 1 {
            self.inline.push(segs);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        token_paths(m.tokens.clone(), &mut self.inline, &mut self.heads);
        syn::visit::visit_macro(self, m);
    }

    // doc comments are attributes: their text is no code
    fn visit_attribute(&mut self, a: &'ast syn::Attribute) {
        if !a.path().is_ident("doc") {
            syn::visit::visit_attribute(self, a);
        }
    }
}

fn names_of(file: &Path) -> Names {
    let text = std::fs::read_to_string(file).unwrap();
    let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut names = Names::default();
    names.visit_file(&ast);
    names
}

/// True for a file of re-exports only: `mod` declarations and `use` items (doc and `cfg`
/// attributes aside), as lib.rs, unstable.rs or a folder's mod.rs may be. Naming an item
/// through such a file depends on the file that defines it, not on the facade.
fn facade(file: &Path) -> bool {
    let text = std::fs::read_to_string(file).unwrap();
    let ast = syn::parse_file(&text).unwrap();
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    matches!(name, "lib.rs" | "unstable.rs")
        || ast.items.iter().all(|i| {
            matches!(
                i,
                syn::Item::Use(_) | syn::Item::Mod(syn::ItemMod { content: None, .. })
            )
        })
}

// ---- The crate's module tree and the import graph.

/// The crate's module tree: each file's module path (`src/a/b.rs` is `a::b`, `src/a/mod.rs`
/// is `a`), what each module re-exports (`pub use`), and which files are facades.
struct Modules {
    files: BTreeMap<Vec<String>, PathBuf>,
    reexports: HashMap<(Vec<String>, String), Vec<String>>,
    globs: HashMap<Vec<String>, Vec<Vec<String>>>,
    facades: BTreeSet<PathBuf>,
    names: BTreeMap<PathBuf, Names>,
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

impl Modules {
    fn read(src: &Path) -> Modules {
        let mut all = Vec::new();
        rust_files(src, &mut all);
        let mut m = Modules {
            files: BTreeMap::new(),
            reexports: HashMap::new(),
            globs: HashMap::new(),
            facades: BTreeSet::new(),
            names: BTreeMap::new(),
        };
        for f in all {
            let module = module_of(src, &f);
            let names = names_of(&f);
            for (public, path, bound) in &names.uses {
                if !public {
                    continue;
                }
                if bound == "*" {
                    m.globs
                        .entry(module.clone())
                        .or_default()
                        .push(path.clone());
                } else {
                    m.reexports
                        .insert((module.clone(), bound.clone()), path.clone());
                }
            }
            if facade(&f) {
                m.facades.insert(f.clone());
            }
            m.files.insert(module, f.clone());
            m.names.insert(f, names);
        }
        m
    }

    /// `segs` (`crate::`, `super::`, `self::` or a child module first) from module `m` as a
    /// path from the crate root; None for another crate's path, or an item of the file.
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
                    return None;
                }
            }
            None => return None,
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The files that the absolute path `segs` depends on: the one that defines what it
    /// names, and each file (not a facade) whose re-export the path goes through (naming
    /// `crate::forward::Forward` depends on forward.rs, which re-exports it, too).
    fn files_of(&self, segs: &[String], depth: usize, out: &mut Vec<PathBuf>) {
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
                let target = self
                    .reexports
                    .get(&(module.clone(), s.clone()))
                    .cloned()
                    .or_else(|| {
                        // a glob re-export: the first module it takes that holds the name
                        self.globs.get(&module)?.iter().find_map(|g| {
                            let mut t = self.absolute(&module, g)?;
                            t.push(s.clone());
                            self.files.contains_key(&t[..t.len() - 1]).then_some(t)
                        })
                    });
                if let Some(target) = target {
                    if let Some(f) = found {
                        if !self.facades.contains(f) {
                            out.push(f.clone());
                        }
                    }
                    if let Some(mut abs) = self.absolute(&module, &target) {
                        abs.extend(segs[i + 1..].iter().cloned());
                        self.files_of(&abs, depth + 1, out);
                    }
                    return;
                }
            }
            break;
        }
        out.extend(found.cloned());
    }
}

/// The files each file's code names through `crate::`, `super::`, `self::` and child-module
/// paths (in `use` items and inline), through re-exports to the defining file. A facade
/// (re-exports only) names nothing of its own.
fn import_graph(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let modules = Modules::read(src);
    let mut graph = BTreeMap::new();
    for (m, f) in &modules.files {
        if modules.facades.contains(f) {
            continue;
        }
        let names = &modules.names[f];
        // a `pub use` re-exports: a path through it reaches the defining file from the file
        // that names it, so it is an edge of this file only where its own code uses the name
        let paths = names
            .uses
            .iter()
            .filter(|(public, _, bound)| !public || names.heads.contains(bound))
            .map(|(_, p, _)| p)
            .chain(&names.inline);
        let mut to = BTreeSet::new();
        for segs in paths {
            let Some(abs) = modules.absolute(m, segs) else {
                continue;
            };
            let mut files = Vec::new();
            modules.files_of(&abs, 0, &mut files);
            for t in files {
                if &t != f && !modules.facades.contains(&t) {
                    to.insert(t);
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
    let src = src();
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

/// A small crate written out: its files as (path under the root, text).
fn small_crate(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

#[test]
fn the_circle_finder_finds_a_circle_and_reads_re_exports() {
    // a/inner.rs -> b.rs (a direct path) -> c.rs -> a/inner.rs (through a/mod.rs's re-export
    // and then the root's, both facades)
    let dir = small_crate(
        "circles",
        &[
            ("lib.rs", "mod a; mod b; mod c;\npub use a::Thing;\n"),
            ("a/mod.rs", "mod inner;\npub use inner::Thing;\n"),
            ("a/inner.rs", "pub struct Thing(crate::b::B);\n"),
            ("b.rs", "use crate::c::C;\npub struct B(C);\n"),
            (
                "c.rs",
                "// crate::b in a comment is no import\n/// nor `crate::b` in a doc\n\
                 pub struct C(Box<crate::Thing>);\n",
            ),
        ],
    );
    let found = circles(&import_graph(&dir));
    let want: Vec<PathBuf> = ["a/inner.rs", "b.rs", "c.rs"]
        .iter()
        .map(|f| dir.join(f))
        .collect();
    assert_eq!(found, vec![want]);
}

#[test]
fn paths_written_inline_and_through_a_files_own_re_exports_are_read() {
    // issue 61's two circles, in small: a call written inline in an expression
    // (`crate::kv::split(..)`), a path in a macro's arguments, and an import of a name a
    // file that is no facade re-exports (`crate::fwd::Out`, defined in out.rs); comments,
    // doc text and unit tests name nothing
    let dir = small_crate(
        "inline",
        &[
            ("lib.rs", "mod fwd; mod kv; mod out; mod reg; mod refr; mod m;\n"),
            ("out.rs", "pub struct Out;\n"),
            (
                "fwd.rs",
                "pub use crate::out::Out;\npub fn run() { crate::kv::split(1); }\n",
            ),
            ("kv.rs", "use crate::fwd::Out;\npub fn split(_: u8) -> Option<Out> { None }\n"),
            ("reg.rs", "mod alibi;\npub fn chain() -> f64 { alibi::f() }\n"),
            (
                "reg/alibi.rs",
                "pub fn f() -> f64 { let v = format!(\"{:?}\", crate::refr::aligned()); v.len() as f64 }\n",
            ),
            ("refr.rs", "pub fn aligned() -> u8 { 0 }\npub fn r() -> f64 { crate::reg::chain() }\n"),
            (
                "m.rs",
                "// crate::fwd::run()\n/// `crate::kv::split`\npub fn quiet() {}\n\
                 #[cfg(test)]\nmod tests { fn t() { crate::fwd::run(); } }\n",
            ),
        ],
    );
    let graph = import_graph(&dir);
    let found = circles(&graph);
    let files = |fs: &[&str]| {
        let mut v: Vec<PathBuf> = fs.iter().map(|f| dir.join(f)).collect();
        v.sort();
        v
    };
    assert_eq!(
        found,
        vec![
            files(&["fwd.rs", "kv.rs"]),
            files(&["refr.rs", "reg.rs", "reg/alibi.rs"])
        ],
        "{graph:#?}"
    );
    assert!(graph[&dir.join("m.rs")].is_empty(), "{graph:#?}");
}
