//! User-defined score modifiers (PyTorch FlexAttention's `score_mod`): a function of a visible
//! pair's scaled score, written by the user as WGSL (and as CUDA C for the CUDA path), which
//! every kernel applies in its score chain after the built-in modifiers, forward and backward
//! (the backward through the user's derivative).
//!
//! The user's WGSL defines two functions, and may define helpers beside them:
//!
//! ```wgsl
//! fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { ... }
//! fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { ... } // d score_mod / ds
//! ```
//!
//! `s` is the pair's scaled score `q.k * scale` after the built-in score modifiers (softcap,
//! ALiBi, bias), in natural-log units as in PyTorch; `b` the batch, `h` the query head, `i` the
//! query row and `j` the key, the call's indices (packed rows and keys in a varlen call). The
//! snippet is checked when the [`ScoreMod`] is made: it must parse and validate on its own
//! (naga), define both functions with these signatures, declare no bindings, workgroup
//! variables or entry points and call no barrier; an error is [`Error::UserCode`] with the
//! compiler's message and the line in the snippet. Its pipelines are cached by its text.
//! A pair whose score is already -inf (an -inf bias entry) stays hidden: the modifier is not
//! applied to it. Masking stays with the masks (a score of -inf from `score_mod` hides a pair
//! too, but its tile is still visited).

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use super::{Data, Modifier, Pair, Score};
use crate::error::{Error, Result};
use crate::AttentionConfig;

/// A host function of (score, batch, query head, query row, key), for the f64 reference.
pub type HostScoreFn = Arc<dyn Fn(f64, usize, usize, usize, usize) -> f64 + Send + Sync>;

/// A user-defined score modifier: its WGSL (checked), its captured tensors, optionally its
/// CUDA C, optionally host functions for the f64 reference (see the module).
#[derive(Clone)]
pub struct ScoreMod {
    /// The user's WGSL, as given.
    source: &'static str,
    /// What the kernels include: the source, then its captured tensors' accessors.
    kernel_wgsl: &'static str,
    cuda: Option<&'static str>,
    captured: Arc<Vec<(String, Vec<f32>)>>,
    host: Option<(HostScoreFn, HostScoreFn)>,
}

impl ScoreMod {
    /// A modifier from its WGSL (the module's two functions and any helpers), checked: a
    /// typed [`Error::UserCode`] names what is wrong and where.
    pub fn wgsl(source: &str) -> Result<ScoreMod> {
        ScoreMod::wgsl_with(source, Vec::<(String, Vec<f32>)>::new())
    }

    /// A modifier whose WGSL reads captured tensors: small f32 arrays (a relative-position
    /// table, T5's buckets) that the snippet reads by name as `name(index: u32) -> f32`
    /// (an index past the end reads the last entry). They travel in the call's extras (a
    /// uniform array of 16,384 words shared with ALiBi slopes, sinks, key lengths, block-mask
    /// bits and varlen boundaries; more is `Error::DeviceLimit` at the call). A name must be
    /// an identifier the kernels do not use, each tensor non-empty and finite.
    pub fn wgsl_with<N: Into<String>>(
        source: &str,
        captured: impl IntoIterator<Item = (N, Vec<f32>)>,
    ) -> Result<ScoreMod> {
        let captured: Vec<(String, Vec<f32>)> =
            captured.into_iter().map(|(n, v)| (n.into(), v)).collect();
        check_captured(&captured)?;
        let mut accessors = String::new();
        let mut stubs = String::new();
        let mut offset = 0usize;
        for (name, values) in &captured {
            accessors.push_str(&format!(
                "fn {name}(i: u32) -> f32 {{ return extra(params.captured_base + {offset}u + \
                 min(i, {}u)); }}\n",
                values.len() - 1
            ));
            stubs.push_str(&format!("fn {name}(i: u32) -> f32 {{ return 0.0; }}\n"));
            offset += values.len();
        }
        check_wgsl(source, &stubs)?;
        Ok(ScoreMod {
            source: intern(source),
            kernel_wgsl: intern(&format!("{source}\n{accessors}")),
            cuda: None,
            captured: Arc::new(captured),
            host: None,
        })
    }

    /// The same functions as CUDA C, for the CUDA backend:
    /// `__device__ float score_mod(float s, unsigned int b, unsigned int h, unsigned int i,
    /// unsigned int j)` and `score_mod_ds` alike. Without it the CUDA backend refuses the
    /// call with a typed `Unsupported`. NVRTC compiles it with the kernels (its errors are
    /// `Error::CudaCompile`); here only the rules are checked (no shared memory, barriers,
    /// inline assembly or includes).
    pub fn with_cuda(mut self, source: &str) -> Result<ScoreMod> {
        check_tokens(
            "score_mod CUDA",
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
        for f in ["score_mod(", "score_mod_ds("] {
            if !source.contains(f) {
                return Err(user_error(
                    "score_mod CUDA",
                    None,
                    format!("expected a definition of `{f}..)`, found none"),
                ));
            }
        }
        self.cuda = Some(intern(source));
        Ok(self)
    }

    /// Host functions equal to `score_mod` and `score_mod_ds` (arguments as the module
    /// says), which the f64 reference (`unstable::reference`) applies; without them the
    /// reference gives NaN for a call with this modifier.
    pub fn with_reference(
        mut self,
        score: impl Fn(f64, usize, usize, usize, usize) -> f64 + Send + Sync + 'static,
        slope: impl Fn(f64, usize, usize, usize, usize) -> f64 + Send + Sync + 'static,
    ) -> ScoreMod {
        self.host = Some((Arc::new(score), Arc::new(slope)));
        self
    }

    /// The WGSL, as given.
    pub fn wgsl_source(&self) -> &'static str {
        self.source
    }

    /// The CUDA C, if given.
    pub fn cuda_source(&self) -> Option<&'static str> {
        self.cuda
    }

    /// The captured tensors' names and values, in order.
    pub fn captured(&self) -> &[(String, Vec<f32>)] {
        &self.captured
    }

    /// What the kernels include: the source and its captured tensors' accessors.
    pub(crate) fn kernel_wgsl(&self) -> &'static str {
        self.kernel_wgsl
    }

    /// The captured tensors as the extras hold them (f32 bits, in order).
    pub(crate) fn captured_words(&self) -> impl Iterator<Item = u32> + '_ {
        self.captured
            .iter()
            .flat_map(|(_, v)| v.iter().map(|x| x.to_bits()))
    }
}

impl PartialEq for ScoreMod {
    /// Two modifiers are equal when their code and captured tensors are (the host functions
    /// are not compared).
    fn eq(&self, other: &ScoreMod) -> bool {
        self.kernel_wgsl == other.kernel_wgsl
            && self.cuda == other.cuda
            && self.captured == other.captured
    }
}

impl fmt::Debug for ScoreMod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScoreMod")
            .field("wgsl", &self.source)
            .field("cuda", &self.cuda)
            .field(
                "captured",
                &self
                    .captured
                    .iter()
                    .map(|(n, v)| (n, v.len()))
                    .collect::<Vec<_>>(),
            )
            .field("host", &self.host.is_some())
            .finish()
    }
}

/// Compiled in: a call without one pays nothing; each snippet is its own pipelines. Its
/// captured tensors live in the extras.
pub(crate) const MODIFIER: Modifier = Modifier {
    name: "SCORE_MOD",
    bit: 1 << 13,
    compiled: true,
    data: Data::Extras,
    active: |cfg| cfg.score_mod.is_some(),
    check: super::no_check,
    encode: super::no_params,
    score: Score::Transform {
        apply: "score_mod_apply",
        slope: "score_mod_slope",
        reference: |cfg, at, s| host(cfg, at, s, 0),
        reference_slope: |cfg, at, s| host(cfg, at, s, 1),
    },
    wgsl: include_str!("../../shaders/modifiers/score_mod.wgsl"),
    cuda: include_str!("../../cuda/modifiers/score_mod.cuh"),
};

/// What pipelines without a user modifier take in its place (never called: their
/// SCORE_MOD() is false).
pub(crate) const WGSL_STUB: &str = "
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return s; }
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return 1.0; }
";

fn host(cfg: &AttentionConfig, (b, h, i, j): Pair, s: f64, which: usize) -> f64 {
    if s == f64::NEG_INFINITY {
        // hidden stays hidden (its probability is 0: no gradient flows through the slope)
        return [s, 0.0][which];
    }
    match cfg.score_mod.as_ref().and_then(|m| m.host.as_ref()) {
        Some((f, df)) => [f, df][which](s, b, h, i, j),
        None => f64::NAN,
    }
}

/// One copy of each snippet's text for the life of the process, so that pipeline keys (which
/// are `Copy`) can hold it; bounded by the distinct snippets a program makes.
fn intern(source: &str) -> &'static str {
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

fn user_error(what: &str, line: Option<usize>, message: String) -> Error {
    Error::UserCode {
        what: what.into(),
        line,
        message,
    }
}

/// Refuses source that holds any of `banned` (by line).
fn check_tokens(what: &str, source: &str, banned: &[&str]) -> Result<()> {
    for (n, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if let Some(b) = banned.iter().find(|b| code.contains(**b)) {
            return Err(user_error(
                what,
                Some(n + 1),
                format!(
                    "`{b}` is not allowed: a score modifier is a pure function of its \
                     arguments (no bindings, shared memory, barriers or entry points)"
                ),
            ));
        }
    }
    Ok(())
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

/// The captured tensors' names and values.
fn check_captured(captured: &[(String, Vec<f32>)]) -> Result<()> {
    for (k, (name, values)) in captured.iter().enumerate() {
        let what = format!("score_mod captured tensor `{name}`");
        let ident = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with("__");
        if !ident || name == "score_mod" || name == "score_mod_ds" {
            return Err(user_error(
                &what,
                None,
                "expected a WGSL identifier other than score_mod and score_mod_ds".into(),
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

/// The snippet's rules, then (off the web) naga on the snippet with `stubs` (its captured
/// tensors' accessors) after it, so that the snippet's lines keep their numbers.
fn check_wgsl(source: &str, stubs: &str) -> Result<()> {
    const WHAT: &str = "score_mod WGSL";
    check_tokens(
        WHAT,
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
    check_compiles(source, stubs)?;
    #[cfg(target_arch = "wasm32")]
    let _ = stubs;
    #[cfg(target_arch = "wasm32")]
    for name in ["score_mod", "score_mod_ds"] {
        if !source.contains(&format!("fn {name}(")) {
            return Err(user_error(
                WHAT,
                None,
                format!(
                    "expected `fn {name}(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32`, \
                     found no `{name}`"
                ),
            ));
        }
    }
    Ok(())
}

/// naga parses and validates the snippet alone, and its two functions have their signatures
/// and no name it defines is the kernels'.
#[cfg(not(target_arch = "wasm32"))]
fn check_compiles(source: &str, stubs: &str) -> Result<()> {
    const WHAT: &str = "score_mod WGSL";
    let whole = format!("{source}\n{stubs}");
    let lines = source.lines().count();
    // a line of the snippet, or none where the compiler points into the accessors
    let line = |l: u32| Some(l as usize).filter(|&l| l <= lines);
    let module = naga::front::wgsl::parse_str(&whole).map_err(|e| {
        user_error(
            WHAT,
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
            WHAT,
            e.location(&whole).and_then(|l| line(l.line_number)),
            e.as_inner().to_string(),
        )
    })?;
    use naga::{Scalar, TypeInner};
    let scalar = |ty: naga::Handle<naga::Type>| match module.types[ty].inner {
        TypeInner::Scalar(s) => Some(s),
        _ => None,
    };
    for name in ["score_mod", "score_mod_ds"] {
        let Some((_, f)) = module
            .functions
            .iter()
            .find(|(_, f)| f.name.as_deref() == Some(name))
        else {
            return Err(user_error(
                WHAT,
                None,
                format!(
                    "expected `fn {name}(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32`, \
                     found no `{name}`"
                ),
            ));
        };
        let args: Vec<_> = f.arguments.iter().map(|a| scalar(a.ty)).collect();
        let want = [
            Some(Scalar::F32),
            Some(Scalar::U32),
            Some(Scalar::U32),
            Some(Scalar::U32),
            Some(Scalar::U32),
        ];
        let ret = f.result.as_ref().and_then(|r| scalar(r.ty));
        if args != want || ret != Some(Scalar::F32) {
            let line = source
                .lines()
                .position(|l| l.contains(&format!("fn {name}(")))
                .map(|n| n + 1);
            return Err(user_error(
                WHAT,
                line,
                format!(
                    "`{name}` must be `fn {name}(s: f32, b: u32, h: u32, i: u32, j: u32) -> \
                     f32`"
                ),
            ));
        }
    }
    let mut defined: Vec<(String, Option<usize>)> = Vec::new();
    for (_, f) in module.functions.iter() {
        if let Some(n) = &f.name {
            let accessor = stubs.contains(&format!("fn {n}(i: u32)"));
            if n != "score_mod" && n != "score_mod_ds" && !accessor {
                defined.push((n.clone(), None));
            }
        }
    }
    for (_, c) in module.constants.iter() {
        defined.extend(c.name.clone().map(|n| (n, None)));
    }
    for (_, g) in module.global_variables.iter() {
        defined.extend(g.name.clone().map(|n| (n, None)));
    }
    for (_, t) in module.types.iter() {
        defined.extend(t.name.clone().map(|n| (n, None)));
    }
    if let Some((name, _)) = defined.iter().find(|(n, _)| reserved(n)) {
        let line = source
            .lines()
            .position(|l| l.contains(name.as_str()))
            .map(|n| n + 1);
        return Err(user_error(
            WHAT,
            line,
            format!("`{name}` is a name the kernels define; rename it"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: &str = "
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    return 2.0 * tanh(s / 2.0);
}
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    let t = tanh(s / 2.0);
    return 1.0 - t * t;
}
";

    fn line_of(e: Error) -> (Option<usize>, String) {
        match e {
            Error::UserCode { line, message, .. } => (line, message),
            e => panic!("expected UserCode, got {e:?}"),
        }
    }

    #[test]
    fn a_valid_snippet_is_accepted_and_interned() {
        let a = ScoreMod::wgsl(CAP).unwrap();
        let b = ScoreMod::wgsl(String::from(CAP).as_str()).unwrap();
        assert!(std::ptr::eq(a.wgsl_source(), b.wgsl_source()));
        assert_eq!(a, b);
    }

    #[test]
    fn bad_snippets_are_user_code_errors_with_the_line() {
        let (line, msg) =
            line_of(ScoreMod::wgsl(&CAP.replace("2.0 * tanh", "2.0 * tanh(")).unwrap_err());
        assert_eq!(line, Some(3), "{msg}");
        let (line, msg) = line_of(
            ScoreMod::wgsl(&format!(
                "{CAP}\n@group(0) @binding(9) var<storage> t: array<f32>;"
            ))
            .unwrap_err(),
        );
        assert_eq!(line, Some(10), "{msg}");
        assert!(msg.contains("@group"), "{msg}");
        let (_, msg) =
            line_of(ScoreMod::wgsl(&CAP.replace("fn score_mod_ds", "fn other")).unwrap_err());
        assert!(msg.contains("score_mod_ds"), "{msg}");
        let (line, msg) = line_of(
            ScoreMod::wgsl(&CAP.replace(
                "j: u32) -> f32 {\n    return 2",
                "j: i32) -> f32 {\n    return 2",
            ))
            .unwrap_err(),
        );
        assert_eq!(line, Some(2), "{msg}");
        let (_, msg) = line_of(
            ScoreMod::wgsl(&format!("{CAP}\nfn visible() -> f32 {{ return 1.0; }}")).unwrap_err(),
        );
        assert!(msg.contains("`visible`"), "{msg}");
        let (line, msg) = line_of(
            ScoreMod::wgsl(CAP)
                .unwrap()
                .with_cuda("__device__ float score_mod() { __syncthreads(); }")
                .unwrap_err(),
        );
        assert_eq!(line, Some(1), "{msg}");
    }
}
