//! What user-written kernel code (`ScoreMod`, `MaskMod`) shares: the rules a snippet keeps
//! and their checks (naga, off the web), captured tensors and their accessors, and the text
//! the kernels include, interned so that `Copy` pipeline keys can hold it.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::AttentionConfig;

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

impl fmt::Debug for Snippet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sizes: Vec<_> = self.captured.iter().map(|(n, v)| (n, v.len())).collect();
        f.debug_struct("Snippet")
            .field("wgsl", &self.source)
            .field("captured", &sizes)
            .finish()
    }
}

/// The user code a call's kernels include: the score modifier's WGSL, the mask modifier's,
/// their captured tensors' accessors (the score modifier's first in the extras), and a
/// stand-in for whichever is absent; `None` without either.
pub(crate) fn kernel_wgsl(cfg: &AttentionConfig) -> Option<&'static str> {
    let (score, mask) = (cfg.score_mod.as_ref(), cfg.mask_mod.as_ref());
    if score.is_none() && mask.is_none() {
        return None;
    }
    let score_captured = score.map_or(&[][..], |m| m.captured());
    let (a, _) = accessors(score_captured, 0);
    let offset = score_captured.iter().map(|(_, v)| v.len()).sum();
    let (b, _) = accessors(mask.map_or(&[][..], |m| m.captured()), offset);
    Some(intern(&format!(
        "{}\n{}\n{a}{b}",
        score.map_or(super::score_mod::WGSL_STUB, |m| m.wgsl_source()),
        mask.map_or(super::mask_mod::WGSL_STUB, |m| m.wgsl_source()),
    )))
}

/// What pipelines without user code take in its place (never called: their SCORE_MOD() and
/// MASK_MOD() are false).
pub(crate) fn stubs() -> &'static str {
    static STUBS: OnceLock<String> = OnceLock::new();
    STUBS.get_or_init(|| {
        format!(
            "{}\n{}",
            super::score_mod::WGSL_STUB,
            super::mask_mod::WGSL_STUB
        )
    })
}

/// The CUDA C accessors of a call's captured tensors (the score modifier's, then the mask
/// modifier's, as [`kernel_wgsl`] lays them out), put before the user's CUDA C:
/// `float NAME(unsigned int i)` reads entry i (clamped to the tensor) through
/// `flash_captured`, a constant pointer the host sets to the call's first captured word before
/// it launches. `None` without captured tensors.
pub(crate) fn kernel_cuda_captured(cfg: &AttentionConfig) -> Option<&'static str> {
    let mut text = String::new();
    let mut offset = 0;
    for (name, values) in captured(cfg) {
        text.push_str(&format!(
            "__device__ __forceinline__ float {name}(unsigned int i) {{ \
             return __ldg(flash_captured + {offset}u + min(i, {}u)); }}\n",
            values.len() - 1
        ));
        offset += values.len();
    }
    if text.is_empty() {
        return None;
    }
    Some(intern(&format!(
        "// the call's captured tensors (extras from Params::captured_base), set by the host\n\
         __constant__ const float* flash_captured;\n{text}"
    )))
}

/// The captured tensors of a call's user code, as the extras hold them (f32 bits; the score
/// modifier's, then the mask modifier's).
pub(crate) fn captured_words(cfg: &AttentionConfig) -> Vec<u32> {
    captured(cfg)
        .flat_map(|(_, v)| v.iter().map(|x| x.to_bits()))
        .collect()
}

/// A call's captured tensors in the extras' order: the score modifier's, then the mask
/// modifier's.
fn captured(cfg: &AttentionConfig) -> impl Iterator<Item = &(String, Vec<f32>)> {
    let score = cfg.score_mod.iter().flat_map(|m| m.captured());
    score.chain(cfg.mask_mod.iter().flat_map(|m| m.captured()))
}

/// A call's score and mask modifiers capture disjoint names.
pub(crate) fn check_names(cfg: &AttentionConfig) -> Result<()> {
    let (Some(s), Some(m)) = (&cfg.score_mod, &cfg.mask_mod) else {
        return Ok(());
    };
    match m
        .captured()
        .iter()
        .find(|(n, _)| s.captured().iter().any(|(o, _)| o == n))
    {
        Some((name, _)) => Err(user_error(
            &format!("mask_mod captured tensor `{name}`"),
            None,
            "the score_mod captures the same name; rename one".into(),
        )),
        None => Ok(()),
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

/// The names the kernels' own WGSL defines, which a snippet may not redefine.
#[cfg(not(target_arch = "wasm32"))]
fn reserved(name: &str) -> bool {
    static NAMES: OnceLock<HashSet<String>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            // every kernel's whole source, its generated prelude with every modifier included
            let mut text = String::new();
            for k in crate::kernels::Kernel::ALL {
                let key = crate::kernels::KernelKey {
                    runtime: crate::kernels::flags::every(),
                    elem: crate::dtype::ElemFormat::F16Native,
                    ..crate::kernels::KernelKey::plain(k)
                };
                text.push_str(&key.wgsl());
            }
            let mut names = HashSet::new();
            for word in ["fn", "struct", "const", "var<private>", "alias", "override"] {
                for part in text.split(&format!("{word} ")).skip(1) {
                    let name: String = part
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    names.insert(name);
                }
            }
            for n in [
                "params", "LN2", "LOG2E", "HEAD_DIM", "BR", "BC", "main", "item",
            ] {
                names.insert(n.to_string());
            }
            names
        })
        .contains(name)
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
        #[cfg(not(target_arch = "wasm32"))]
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
/// tensors' accessors) after it, so that the snippet's lines keep their numbers.
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
    Ok(())
}

/// naga parses and validates the snippet alone, its functions have their signatures and no
/// name it defines is the kernels'.
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
    let mut defined: Vec<String> = Vec::new();
    for (_, f) in module.functions.iter() {
        if let Some(n) = &f.name {
            let accessor = stubs.contains(&format!("fn {n}(i: u32)"));
            if !USER_FUNCTIONS.contains(&n.as_str()) && !accessor {
                defined.push(n.clone());
            }
        }
    }
    defined.extend(module.constants.iter().filter_map(|(_, c)| c.name.clone()));
    defined.extend(
        module
            .global_variables
            .iter()
            .filter_map(|(_, g)| g.name.clone()),
    );
    defined.extend(module.types.iter().filter_map(|(_, t)| t.name.clone()));
    if let Some(name) = defined.iter().find(|n| reserved(n)) {
        let line = source
            .lines()
            .position(|l| l.contains(name.as_str()))
            .map(|n| n + 1);
        return Err(user_error(
            what,
            line,
            format!("`{name}` is a name the kernels define; rename it"),
        ));
    }
    Ok(())
}
