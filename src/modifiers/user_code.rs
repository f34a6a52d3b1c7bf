//! What user-written kernel code (`ScoreMod`, `MaskMod`) shares: the rules a snippet keeps
//! and their checks (naga, off the web), captured tensors and their accessors, and the text
//! the kernels include, interned so that `Copy` pipeline keys can hold it.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use super::names::declarations;
use crate::dtype::ElemFormat;
use crate::error::{Error, Result};
use crate::kernels::{flags, Kernel, KernelKey};
use crate::kv_format::CacheFormat;

/// A user snippet, checked: its WGSL (interned) and its captured tensors. Equal when both are.
#[derive(Clone, PartialEq)]
pub(crate) struct Snippet {
    pub source: &'static str,
    pub captured: Arc<Vec<(String, Vec<f32>)>>,
}

impl Snippet {
    /// Checks `source` (`kind`: score_mod, mask_mod) with its captured tensors, which it must
    /// define `required` beside.
    pub(crate) fn new<N: Into<String>>(
        kind: &str,
        source: &str,
        captured: impl IntoIterator<Item = (N, Vec<f32>)>,
        required: &[Required],
    ) -> Result<Snippet> {
        let captured: Vec<(String, Vec<f32>)> =
            captured.into_iter().map(|(n, v)| (n.into(), v)).collect();
        check_captured(kind, &captured)?;
        let (_, stubs) = accessors(&captured, 0);
        check_wgsl(&format!("{kind} WGSL"), source, &stubs, required)?;
        Ok(Snippet {
            source: intern(source),
            captured: Arc::new(captured),
        })
    }
}

impl Snippet {
    /// The snippet as CUDA C (module `to_cuda`), interned, or why it cannot be: what a
    /// modifier runs on the CUDA backend when its caller gives no CUDA C of its own. Asked
    /// for by the CUDA backend only (wgpu never pays for it), and translated once a process
    /// per text.
    pub(crate) fn cuda(&self) -> std::result::Result<&'static str, String> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            static DONE: Memo<std::result::Result<&'static str, String>> = OnceLock::new();
            let names: Vec<&str> = self.captured.iter().map(|(n, _)| n.as_str()).collect();
            let made = memo(&DONE, self.source, &names, || {
                let (_, stubs) = accessors(&self.captured, 0);
                let c = super::to_cuda::translate(self.source, &stubs, &names);
                Ok::<_, std::convert::Infallible>(c.map(|c| intern(&c)))
            });
            match made {
                Ok(c) => c,
                Err(never) => match never {},
            }
        }
        #[cfg(target_arch = "wasm32")]
        Err("the wasm32 build translates no WGSL to CUDA C".into())
    }
}

impl fmt::Debug for Snippet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sizes: Vec<_> = self.captured.iter().map(|(n, v)| (n, v.len())).collect();
        f.debug_struct("Snippet")
            .field("wgsl", &self.source)
            .field("captured", &sizes)
            .finish()
    }
}

/// One copy of each snippet's text for the life of the process, so that pipeline keys (which
/// are `Copy`) can hold it; bounded by the distinct snippets a program makes.
pub(crate) fn intern(source: &str) -> &'static str {
    static TEXTS: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut texts = TEXTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(t) = texts.get(source) {
        return t;
    }
    let t: &'static str = Box::leak(source.to_owned().into_boxed_str());
    texts.insert(t);
    t
}

/// Values computed from a snippet's text and its captured tensors' names, once a process.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) type Memo<T> = OnceLock<Mutex<std::collections::HashMap<String, T>>>;

/// `make`'s value for (`source`, `names`), computed once a process where it succeeds: a
/// program that makes the same modifier every call (the Python package does) pays once.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn memo<T: Clone, E>(
    table: &Memo<T>,
    source: &str,
    names: &[&str],
    make: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    let key = format!("{source}\0{}", names.join(","));
    let lock = || {
        table
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    };
    if let Some(v) = lock().get(&key) {
        return Ok(v.clone());
    }
    let v = make()?;
    lock().insert(key, v.clone());
    Ok(v)
}

pub(crate) fn user_error(what: &str, line: Option<usize>, message: String) -> Error {
    Error::UserCode {
        what: what.into(),
        line,
        message,
    }
}

/// Refuses source that holds any of `banned` (by line).
pub(crate) fn check_tokens(what: &str, source: &str, banned: &[&str]) -> Result<()> {
    for (n, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if let Some(b) = banned.iter().find(|b| code.contains(**b)) {
            return Err(user_error(
                what,
                Some(n + 1),
                format!(
                    "`{b}` is not allowed: a user modifier is a pure function of its \
                     arguments (no bindings, shared memory, barriers or entry points)"
                ),
            ));
        }
    }
    Ok(())
}

/// A user modifier's CUDA C (`ScoreMod::with_cuda`, `MaskMod::with_cuda`), checked by the
/// rules NVRTC cannot see (no shared memory, barriers, inline assembly, includes, kernels or
/// extern declarations; each of `functions` defined) and interned. NVRTC compiles it with the
/// kernels; its errors are `Error::CudaCompile`.
pub(crate) fn check_cuda(what: &str, source: &str, functions: &[&str]) -> Result<&'static str> {
    check_tokens(
        what,
        source,
        &[
            "__shared__",
            "__syncthreads",
            "__syncwarp",
            "asm",
            "#include",
            "__global__",
            "extern",
        ],
    )?;
    for f in functions {
        if !source.contains(&format!("{f}(")) {
            return Err(user_error(
                what,
                None,
                format!("expected a definition of `{f}(..)`, found none"),
            ));
        }
    }
    Ok(intern(source))
}

/// The keys whose sources hold every module-scope name of every kernel a user snippet is
/// spliced into ([`Kernel::takes_user_code`]: the tiled families' three passes, the decode
/// kernel, the naive kernels that finish scores and the block-mask builder): each with every
/// modifier bit read at run time (so that the extras, the pair data and every modifier's
/// functions are declared) and the bias gradients' scratch, with and without a fixed subgroup
/// size and an 8-bit KV cache's loads, and with the tiled kernels' accumulate mode and the
/// decode kernel's wide reads: every option of [`KernelKey`] that declares names (shapes,
/// element formats and compiled bits change values and types, not names).
pub(crate) fn host_keys() -> Vec<KernelKey> {
    let mut keys = Vec::new();
    for kernel in Kernel::ALL.into_iter().filter(|k| k.takes_user_code()) {
        let base = KernelKey {
            runtime: flags::every(),
            elem: ElemFormat::F16Native,
            keeps_grads: kernel.keeps_grads(),
            keeps_scores: kernel.keeps_grads(),
            sums_table: kernel.sums_table(),
            ..KernelKey::plain(kernel)
        };
        for subgroup in [0, 8] {
            for kv in [None, Some(CacheFormat::Q8_0)] {
                keys.push(KernelKey {
                    subgroup,
                    kv,
                    ..base
                });
            }
        }
        if kernel.can_accumulate() {
            keys.push(KernelKey {
                accumulate: true,
                ..base
            });
        }
        if kernel.is_decode() {
            keys.push(KernelKey { wide: 1, ..base });
        }
    }
    keys
}

/// True for a name the kernels define, which a snippet may not define and a captured tensor
/// not take: every module-scope declaration ([`declarations`]) of the sources of
/// [`host_keys`], their generated preludes included (the bindings, the extras, the pair data,
/// the load and store functions, the shape constants), so that the set follows the kernels'
/// text. Computed once a process, the first time a snippet or a captured name is checked.
fn reserved(name: &str) -> bool {
    static NAMES: OnceLock<HashSet<String>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            host_keys()
                .iter()
                .flat_map(|k| declarations(&k.wgsl()))
                .map(|(name, _)| name)
                .collect()
        })
        .contains(name)
}

/// No name `source` declares is one the kernels define ([`reserved`]), but the functions it
/// must define (`required`), which take the place of the kernels' stand-ins.
fn check_declarations(what: &str, source: &str, required: &[Required]) -> Result<()> {
    for (name, line) in declarations(source) {
        if !required.iter().any(|r| r.name == name) && reserved(&name) {
            return Err(user_error(
                what,
                Some(line),
                format!("`{name}` is a name the kernels define; rename it"),
            ));
        }
    }
    Ok(())
}

/// The captured tensors' names and values (`kind`: score_mod, mask_mod).
pub(crate) fn check_captured(kind: &str, captured: &[(String, Vec<f32>)]) -> Result<()> {
    for (k, (name, values)) in captured.iter().enumerate() {
        let what = format!("{kind} captured tensor `{name}`");
        let ident = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with("__");
        if !ident || USER_FUNCTIONS.contains(&name.as_str()) {
            return Err(user_error(
                &what,
                None,
                format!(
                    "expected a WGSL identifier other than {}",
                    USER_FUNCTIONS.join(", ")
                ),
            ));
        }
        if reserved(name) {
            return Err(user_error(
                &what,
                None,
                format!("`{name}` is a name the kernels define; rename it"),
            ));
        }
        if captured[..k].iter().any(|(n, _)| n == name) {
            return Err(user_error(
                &what,
                None,
                "a name may be captured once".into(),
            ));
        }
        if values.is_empty() {
            return Err(user_error(
                &what,
                None,
                "expected at least one value, got none".into(),
            ));
        }
        if let Some((i, x)) = values.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(user_error(
                &what,
                None,
                format!("expected finite values, got {x} at index {i}"),
            ));
        }
    }
    Ok(())
}

/// A function a snippet must define: its name, its arguments' types and its result's, as
/// WGSL writes them (`f32`, `u32`, `bool`).
pub(crate) struct Required {
    pub name: &'static str,
    pub args: &'static [&'static str],
    pub ret: &'static str,
}

impl Required {
    fn signature(&self) -> String {
        const NAMES: [&str; 5] = ["s", "b", "h", "i", "j"];
        let skip = 5 - self.args.len();
        let args: Vec<String> = self
            .args
            .iter()
            .zip(&NAMES[skip..])
            .map(|(t, n)| format!("{n}: {t}"))
            .collect();
        format!("fn {}({}) -> {}", self.name, args.join(", "), self.ret)
    }
}

/// Every function name a user snippet defines for the kernels.
pub(crate) const USER_FUNCTIONS: [&str; 3] = ["score_mod", "score_mod_ds", "mask_mod"];

/// The accessors of captured tensors from extras word `offset` of the captured region on (the
/// kernels'), and their stand-ins for checking a snippet alone.
pub(crate) fn accessors(captured: &[(String, Vec<f32>)], mut offset: usize) -> (String, String) {
    let (mut real, mut stubs) = (String::new(), String::new());
    for (name, values) in captured {
        real.push_str(&format!(
            "fn {name}(i: u32) -> f32 {{ return extra(params.captured_base + {offset}u + \
             min(i, {}u)); }}\n",
            values.len() - 1
        ));
        stubs.push_str(&format!("fn {name}(i: u32) -> f32 {{ return 0.0; }}\n"));
        offset += values.len();
    }
    (real, stubs)
}

/// The snippet's rules, then (off the web) naga on the snippet with `stubs` (its captured
/// tensors' accessors) after it, so that the snippet's lines keep their numbers; then (on
/// every target) that it declares no name the kernels define.
pub(crate) fn check_wgsl(
    what: &str,
    source: &str,
    stubs: &str,
    required: &[Required],
) -> Result<()> {
    check_tokens(
        what,
        source,
        &[
            "@group",
            "@binding",
            "@compute",
            "@workgroup_size",
            "var<storage",
            "var<uniform",
            "var<workgroup",
            "workgroupBarrier",
            "storageBarrier",
            "textureBarrier",
            "workgroupUniformLoad",
            "enable ",
        ],
    )?;
    #[cfg(not(target_arch = "wasm32"))]
    check_compiles(what, source, stubs, required)?;
    #[cfg(target_arch = "wasm32")]
    let _ = stubs;
    #[cfg(target_arch = "wasm32")]
    for r in required {
        if !source.contains(&format!("fn {}(", r.name)) {
            return Err(user_error(
                what,
                None,
                format!("expected `{}`, found no `{}`", r.signature(), r.name),
            ));
        }
    }
    check_declarations(what, source, required)
}

/// naga parses and validates the snippet alone, and its functions have their signatures.
#[cfg(not(target_arch = "wasm32"))]
fn check_compiles(what: &str, source: &str, stubs: &str, required: &[Required]) -> Result<()> {
    let whole = format!("{source}\n{stubs}");
    let lines = source.lines().count();
    // a line of the snippet, or none where the compiler points into the accessors
    let line = |l: u32| Some(l as usize).filter(|&l| l <= lines);
    let module = naga::front::wgsl::parse_str(&whole).map_err(|e| {
        user_error(
            what,
            e.location(&whole).and_then(|l| line(l.line_number)),
            e.message().to_string(),
        )
    })?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .map_err(|e| {
        user_error(
            what,
            e.location(&whole).and_then(|l| line(l.line_number)),
            e.as_inner().to_string(),
        )
    })?;
    use naga::{Scalar, TypeInner};
    let type_name = |ty: naga::Handle<naga::Type>| match module.types[ty].inner {
        TypeInner::Scalar(Scalar::F32) => "f32",
        TypeInner::Scalar(Scalar::U32) => "u32",
        TypeInner::Scalar(Scalar::BOOL) => "bool",
        _ => "?",
    };
    for r in required {
        let Some((_, f)) = module
            .functions
            .iter()
            .find(|(_, f)| f.name.as_deref() == Some(r.name))
        else {
            return Err(user_error(
                what,
                None,
                format!("expected `{}`, found no `{}`", r.signature(), r.name),
            ));
        };
        let args: Vec<&str> = f.arguments.iter().map(|a| type_name(a.ty)).collect();
        let ret = f.result.as_ref().map_or("()", |r| type_name(r.ty));
        if args != r.args || ret != r.ret {
            let line = source
                .lines()
                .position(|l| l.contains(&format!("fn {}(", r.name)))
                .map(|n| n + 1);
            return Err(user_error(
                what,
                line,
                format!("`{}` must be `{}`", r.name, r.signature()),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{flags, Kernel};
    use crate::modifiers::names::{fresh_prefix, identifiers};
    use crate::{MaskMod, ScoreMod};

    /// A score modifier that reads a captured tensor `NAME`.
    const READS: &str =
        "fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return s + NAME(j); }
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return 1.0; }";

    /// `r` is `Error::UserCode` about `name`, at `line` of the snippet.
    fn refused<T: fmt::Debug>(r: Result<T>, name: &str, line: Option<usize>) {
        match r {
            Err(Error::UserCode {
                what,
                line: at,
                message,
            }) => {
                assert!(
                    message.contains(&format!("`{name}` is a name the kernels define")),
                    "{name}: {what}: {message}"
                );
                assert_eq!(at, line, "{name}: {what}: {message}");
            }
            other => panic!("{name}: expected Error::UserCode, got {other:?}"),
        }
    }

    #[test]
    fn names_the_kernels_bind_or_declare_are_refused_when_a_modifier_is_made() {
        // captured tensors named as the kernels' bindings: the forward's lse and q, the
        // extras the captured tensors ride in, the block-mask builder's blocks
        for name in ["lse", "q", "extras", "pair_data", "part_out", "probs"] {
            let src = READS.replace("NAME", name);
            refused(
                ScoreMod::wgsl_with(&src, [(name, vec![0.0; 4])]),
                name,
                None,
            );
        }
        let mask =
            "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return blocks(j) > 0.5; }";
        refused(
            MaskMod::wgsl_with(mask, [("blocks", vec![1.0])]),
            "blocks",
            None,
        );
        // a helper named as a binding, one named as a workgroup variable of the rows kernels,
        // with its line
        let helper =
            "fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return NAME(s); }
fn NAME(x: f32) -> f32 { return x; }
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return 1.0; }";
        for name in ["out", "pins"] {
            refused(ScoreMod::wgsl(&helper.replace("NAME", name)), name, Some(2));
        }
        // a private variable named as a binding of the decode kernel
        let private = format!(
            "{}\nvar<private> part_lse: f32;",
            READS.replace("NAME(j)", "0.0")
        );
        refused(ScoreMod::wgsl(&private), "part_lse", Some(3));
        // a mask that defines the score modifier's stand-in, which its pipelines include
        let both = "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return true; }
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return s; }";
        refused(MaskMod::wgsl(both), "score_mod", Some(2));
        // names the kernels do not use are the user's
        let t5 = READS.replace("NAME", "t5_bias");
        assert!(ScoreMod::wgsl_with(&t5, [("t5_bias", vec![0.0; 4])]).is_ok());
    }

    #[test]
    fn every_binding_of_every_kernel_user_code_joins_is_reserved() {
        let hosts: Vec<Kernel> = Kernel::ALL
            .into_iter()
            .filter(|k| k.reads_flags() & (flags::SCORE_MOD | flags::MASK_MOD) != 0)
            .collect();
        // the tiled families' three passes, decode, the naive path and the block-mask builder
        for k in [
            Kernel::Flash(crate::kernels::Variant::Rows, crate::kernels::Pass::DkDv),
            Kernel::Flash(crate::kernels::Variant::Coop, crate::kernels::Pass::Dq),
            Kernel::FlashDecode,
            Kernel::NaiveSoftmax,
            Kernel::MaskBlocks,
        ] {
            assert!(hosts.contains(&k), "{k:?}");
        }
        for k in &hosts {
            for b in k.bindings() {
                assert!(reserved(b.name), "{k:?}: binding `{}`", b.name);
            }
        }
        for name in ["params", "extras", "pair_data", "kept_grads"] {
            assert!(reserved(name), "`{name}`");
        }
    }

    /// Every module-scope name naga finds in the sources the reserved set is taken from is
    /// one the scan finds (and so reserved), every binding included.
    #[test]
    fn the_scan_finds_every_name_naga_finds_in_the_kernels() {
        // the keys at a head dim and tiles a device plans (naga evaluates the constants the
        // tiles size), which declare what the keys of no shape do
        let device = crate::kernels::enumerate::devices()[2];
        for key in host_keys() {
            let tiles = crate::kernels::choose_tiles(key.kernel, 64, device.caps);
            let shaped = KernelKey {
                head_dim: 64,
                tiles: tiles.unwrap_or_else(|e| panic!("{}: {e}", key.label())),
                ..key
            };
            let source = shaped.wgsl();
            let found: HashSet<String> = declarations(&source).into_iter().map(|d| d.0).collect();
            let unshaped: HashSet<String> =
                declarations(&key.wgsl()).into_iter().map(|d| d.0).collect();
            assert_eq!(found, unshaped, "{}", key.label());
            let key = shaped;
            let module = naga::front::wgsl::parse_str(&source)
                .unwrap_or_else(|e| panic!("{}: {}", key.label(), e.emit_to_string(&source)));
            let mut names: Vec<(String, bool)> = Vec::new();
            for (_, g) in module.global_variables.iter() {
                names.extend(g.name.clone().map(|n| (n, g.binding.is_some())));
            }
            for (_, f) in module.functions.iter() {
                names.extend(f.name.clone().map(|n| (n, false)));
            }
            for (_, c) in module.constants.iter() {
                names.extend(c.name.clone().map(|n| (n, false)));
            }
            for (_, o) in module.overrides.iter() {
                names.extend(o.name.clone().map(|n| (n, false)));
            }
            for (_, t) in module.types.iter() {
                // naga's own predeclared types are `__`-prefixed
                names.extend(
                    t.name
                        .clone()
                        .filter(|n| !n.starts_with("__"))
                        .map(|n| (n, false)),
                );
            }
            names.extend(module.entry_points.iter().map(|e| (e.name.clone(), false)));
            assert!(names.iter().filter(|n| n.1).count() > key.kernel.bindings().len());
            for (name, binding) in names {
                assert!(
                    found.contains(&name) && reserved(&name),
                    "{}: `{name}` (binding: {binding}) is not found by the scan",
                    key.label()
                );
            }
        }
        // comments, nested braces and address spaces
        let text = "/* fn a() { /* nested */ } */ // fn b()\n\
                    @group(0) @binding(1) var<storage, read_write> c: array<f32>;\n\
                    struct D { e: f32 }\nfn f(g: u32) -> u32 { let h = 1u; { var i = 2u; } return g; }\n\
                    const j = 1u; var<private> k: f32; override l: bool; alias m = f32;";
        let got: Vec<(String, usize)> = declarations(text);
        let want: Vec<(String, usize)> = [("c", 2), ("D", 3), ("f", 4), ("j", 5), ("k", 5)]
            .into_iter()
            .chain([("l", 5), ("m", 5)])
            .map(|(n, l)| (n.to_string(), l))
            .collect();
        assert_eq!(got, want);
    }

    /// Every pipeline the plans can ask for (`kernels::enumerate`) of a kernel user code joins
    /// declares only reserved names: no option of a key declares a name [`host_keys`] misses.
    #[test]
    fn every_enumerated_pipeline_of_those_kernels_declares_only_reserved_names() {
        use crate::kernels::enumerate::{devices, pipeline_keys};
        let keys = pipeline_keys(&devices());
        let mut kernels = HashSet::new();
        for key in keys.iter().filter(|k| k.kernel.takes_user_code()) {
            kernels.insert(key.kernel);
            for (name, _) in declarations(&key.wgsl()) {
                assert!(reserved(&name), "{}: `{name}`", key.label());
            }
        }
        assert_eq!(
            kernels.len(),
            Kernel::ALL.iter().filter(|k| k.takes_user_code()).count()
        );
    }

    /// Generated names (module `derive`'s twins, the CUDA translation's) begin with `gen`
    /// ([`fresh_prefix`]): no kernel, WGSL or CUDA, writes an identifier that does, so no
    /// generated name can meet one of theirs.
    #[test]
    fn no_kernel_writes_a_name_that_begins_as_generated_names_do() {
        for key in host_keys() {
            let source = key.wgsl();
            let hit = identifiers(&source)
                .into_iter()
                .find(|w| w.starts_with("gen"));
            assert!(hit.is_none(), "{}: `{hit:?}`", key.label());
        }
        for arch in [80, 90] {
            for key in crate::cuda::kernels::CudaKey::all_for_arch(arch) {
                let source = key.program();
                let hit = identifiers(&source)
                    .into_iter()
                    .find(|w| w.starts_with("gen"));
                assert!(hit.is_none(), "{}: `{hit:?}`", key.label());
            }
        }
        // and the prefix steps past every name of the user's that begins with it
        assert_eq!(fresh_prefix(&["fn f() {}"]), "gen_");
        assert_eq!(fresh_prefix(&["const gen_a0 = 1.0;", "gen1_x"]), "gen2_");
    }
}
