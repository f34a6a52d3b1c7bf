//! The modifiers as the kernels see them: each one's bit in `Params::flags`, its name in the
//! kernels (the WGSL function `NAME()`, the CUDA define `-DNAME`), whether it is compiled into
//! pipelines or read at run time, where its values live, how it acts on scores, and its WGSL and
//! CUDA snippets (shaders/modifiers/, cuda/modifiers/), which every kernel source includes. The
//! score chains the kernels call are generated here from the same table.
//!
//! This is the kernel side of a modifier and knows nothing of a call: its public value type
//! lives in `modifiers/`, its rules over a call (when it is on, its checks, its parameters,
//! its f64 reference) in `registry/`. The user-code checks read the kernels' sources, so this
//! table sits below both.

/// Where a modifier's values reach the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Data {
    /// Scalars in `Params` alone.
    Params,
    /// The extras: a uniform array of words every pipeline that reads such a bit binds.
    Extras,
    /// The pair data: a storage array (per-pair tensors, the block table).
    Pairs,
}

/// How a modifier acts on a visible pair's score (exp2 domain: x = q.k * scale * log2(e)).
/// The kernels' score chain applies the modifiers in bit order ([`wgsl_score_chain`],
/// [`cuda_score_chain`]); the f64 reference walks the same list (`registry::reference_chain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScoreHook {
    /// It does not touch scores.
    None,
    /// It replaces the score s by t = f(s). WGSL: `fn {apply}(s: f32, i: u32, j: u32) -> f32`
    /// and its derivative `fn {slope}(s: f32, t: f32, i: u32, j: u32) -> f32` (dt/ds, given
    /// both sides); CUDA the same with `(const CallShape& p, const HeadMods& hm, ...)` first.
    Transform {
        apply: &'static str,
        slope: &'static str,
    },
    /// It adds a term to the score. WGSL: `fn {term}(i: u32, j: u32) -> f32`; CUDA
    /// `(const CallShape& p, const HeadMods& hm, i, j)`.
    Term { term: &'static str },
}

/// One modifier, as the kernels see it.
#[derive(Debug)]
pub(crate) struct Hooks {
    /// Its name in the kernels: the WGSL function `NAME()` and the CUDA define `-DNAME`.
    pub name: &'static str,
    /// Its bit in `Params::flags`.
    pub bit: u32,
    /// Compiled into pipelines by default (per-score work that costs when merely tested),
    /// else read at run time (docs/PERFORMANCE.md, "Modifiers as run-time bits").
    pub compiled: bool,
    /// Where its values live.
    pub data: Data,
    /// How it acts on scores.
    pub score: ScoreHook,
    /// Its WGSL functions, included in every kernel source (may be empty).
    pub wgsl: &'static str,
    /// Its CUDA functions, included in every CUDA program (may be empty).
    pub cuda: &'static str,
}

/// The causal mask (bottom-right aligned): the band of `Params::band_lo` / `band_hi`.
pub(crate) const CAUSAL: Hooks = Hooks {
    name: "CAUSAL",
    bit: 1 << 0,
    compiled: false,
    data: Data::Params,
    score: ScoreHook::None,
    wgsl: "",
    cuda: "",
};

/// A sliding window, causal folded in: the same band.
pub(crate) const WINDOW: Hooks = Hooks {
    name: "WINDOW",
    bit: 1 << 1,
    compiled: false,
    data: Data::Params,
    score: ScoreHook::None,
    wgsl: "",
    cuda: "",
};

/// A tanh per score: compiled in, so that calls without a softcap pay nothing for it.
pub(crate) const SOFTCAP: Hooks = Hooks {
    name: "SOFTCAP",
    bit: 1 << 2,
    compiled: true,
    data: Data::Params,
    score: ScoreHook::Transform {
        apply: "softcap_score",
        slope: "softcap_slope",
    },
    wgsl: include_str!("../../shaders/modifiers/softcap.wgsl"),
    cuda: include_str!("../../cuda/modifiers/softcap.cuh"),
};

/// A run-time bit: a zero-cost test when off (docs/PERFORMANCE.md). Slopes in the extras.
pub(crate) const ALIBI: Hooks = Hooks {
    name: "ALIBI",
    bit: 1 << 3,
    compiled: false,
    data: Data::Extras,
    score: ScoreHook::Term { term: "alibi_term" },
    wgsl: include_str!("../../shaders/modifiers/alibi.wgsl"),
    cuda: include_str!("../../cuda/modifiers/alibi.cuh"),
};

/// A run-time bit: a zero-cost test when off (docs/PERFORMANCE.md). One logit per head in
/// the extras.
pub(crate) const SINKS: Hooks = Hooks {
    name: "SINKS",
    bit: 1 << 4,
    compiled: false,
    data: Data::Extras,
    score: ScoreHook::None,
    wgsl: include_str!("../../shaders/modifiers/sinks.wgsl"),
    cuda: "",
};

/// A run-time bit: a zero-cost test when off (docs/PERFORMANCE.md). Key ranges in the extras.
pub(crate) const SEQLENS: Hooks = Hooks {
    name: "SEQLENS",
    bit: 1 << 5,
    compiled: false,
    data: Data::Extras,
    score: ScoreHook::None,
    wgsl: include_str!("../../shaders/modifiers/seqlens.wgsl"),
    cuda: "",
};

/// A Philox block per four pairs: compiled in (docs/PERFORMANCE.md).
pub(crate) const DROPOUT: Hooks = Hooks {
    name: "DROPOUT",
    bit: 1 << 6,
    compiled: true,
    data: Data::Params,
    score: ScoreHook::None,
    wgsl: include_str!("../../shaders/modifiers/dropout.wgsl"),
    cuda: include_str!("../../cuda/modifiers/dropout.cuh"),
};

/// A run-time bit: a block mask's bits in the extras (its geometry: `Params::with_block_grid`,
/// from the whole call).
pub(crate) const BLOCKS: Hooks = Hooks {
    name: "BLOCKS",
    bit: 1 << 7,
    compiled: false,
    data: Data::Extras,
    score: ScoreHook::None,
    wgsl: include_str!("../../shaders/modifiers/blocks.wgsl"),
    cuda: "",
};

/// A run-time bit: a zero-cost test when off (docs/PERFORMANCE.md). The boundaries in the
/// extras.
pub(crate) const VARLEN: Hooks = Hooks {
    name: "VARLEN",
    bit: 1 << 8,
    compiled: false,
    data: Data::Extras,
    score: ScoreHook::None,
    wgsl: include_str!("../../shaders/modifiers/varlen.wgsl"),
    cuda: "",
};

/// A boolean mask, compiled in: its run-time test cost more than 2% switched off on lavapipe
/// (docs/PERFORMANCE.md). Its bits lead the pair data.
pub(crate) const MASK: Hooks = Hooks {
    name: "MASK",
    bit: 1 << 9,
    compiled: true,
    data: Data::Pairs,
    score: ScoreHook::None,
    wgsl: include_str!("../../shaders/modifiers/mask.wgsl"),
    cuda: "",
};

/// A load per score: compiled in (docs/PERFORMANCE.md). Its entries follow the boolean mask's
/// words in the pair data.
pub(crate) const BIAS: Hooks = Hooks {
    name: "BIAS",
    bit: 1 << 10,
    compiled: true,
    data: Data::Pairs,
    score: ScoreHook::Term { term: "pair_bias" },
    wgsl: include_str!("../../shaders/modifiers/bias.wgsl"),
    cuda: include_str!("../../cuda/modifiers/bias.cuh"),
};

/// A run-time bit. The block table follows the boolean mask's and the bias's words in the
/// pair data.
pub(crate) const PAGED: Hooks = Hooks {
    name: "PAGED",
    bit: 1 << 11,
    compiled: false,
    data: Data::Pairs,
    score: ScoreHook::None,
    wgsl: "",
    cuda: "",
};

/// Strided input views: a property of the tensors a call runs on, not of its config (the bit
/// is set per step at record time).
pub(crate) const VIEWS: Hooks = Hooks {
    name: "VIEWS",
    bit: 1 << 12,
    compiled: false,
    data: Data::Params,
    score: ScoreHook::None,
    wgsl: "",
    cuda: "",
};

/// A user's score modifier, compiled in: a call without one pays nothing; each snippet is its
/// own pipelines. Its captured tensors live in the extras.
pub(crate) const SCORE_MOD: Hooks = Hooks {
    name: "SCORE_MOD",
    bit: 1 << 13,
    compiled: true,
    data: Data::Extras,
    score: ScoreHook::Transform {
        apply: "score_mod_apply",
        slope: "score_mod_slope",
    },
    wgsl: include_str!("../../shaders/modifiers/score_mod.wgsl"),
    cuda: include_str!("../../cuda/modifiers/score_mod.cuh"),
};

/// A user's mask, compiled in, as the score modifier.
pub(crate) const MASK_MOD: Hooks = Hooks {
    name: "MASK_MOD",
    bit: 1 << 14,
    compiled: true,
    data: Data::Extras,
    score: ScoreHook::None,
    wgsl: include_str!("../../shaders/modifiers/mask_mod.wgsl"),
    cuda: include_str!("../../cuda/modifiers/mask_mod.cuh"),
};

/// A run-time bit: an MLA latent cache, whose values are the first `head_dim_v` dims of each
/// key row (`AttentionConfig::values_in_keys`): `v` is bound to k's buffer and read with
/// k's rows (`v_index`; an 8-bit cache's records are k's).
pub(crate) const LATENT: Hooks = Hooks {
    name: "LATENT",
    bit: 1 << 15,
    compiled: false,
    data: Data::Params,
    score: ScoreHook::None,
    wgsl: "",
    cuda: "",
};

/// Every modifier, in bit order (bit i is `1 << i`).
pub(crate) const ALL: [&Hooks; 16] = [
    &CAUSAL, &WINDOW, &SOFTCAP, &ALIBI, &SINKS, &SEQLENS, &DROPOUT, &BLOCKS, &VARLEN, &MASK, &BIAS,
    &PAGED, &VIEWS, &SCORE_MOD, &MASK_MOD, &LATENT,
];

/// What pipelines without a user score modifier take in its place (never called: their
/// SCORE_MOD() is false).
/// Its `score_mod_dt` (a trainable tensor's partial, which the gradient's kernel appends to a
/// real modifier: module `derive`) reads nothing.
pub(crate) const SCORE_MOD_STUB: &str = "
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return s; }
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return 1.0; }
var<private> score_mod__read: u32;
fn score_mod_dt(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { score_mod__read = 0xffffffffu; return 0.0; }
";

/// What pipelines without a user mask take in its place (never called).
pub(crate) const MASK_MOD_STUB: &str = "
fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return true; }
";

/// Both stand-ins, for pipelines without user code.
pub(crate) fn user_stubs() -> &'static str {
    static STUBS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    STUBS.get_or_init(|| format!("{SCORE_MOD_STUB}\n{MASK_MOD_STUB}"))
}

/// The bits of the modifiers compiled into pipelines by default.
pub(crate) const fn compiled_bits() -> u32 {
    let (mut bits, mut i) = (0, 0);
    while i < ALL.len() {
        if ALL[i].compiled {
            bits |= ALL[i].bit;
        }
        i += 1;
    }
    bits
}

/// The bits of the modifiers whose values live in `data`.
pub(crate) const fn bits_in(data: Data) -> u32 {
    let (mut bits, mut i) = (0, 0);
    while i < ALL.len() {
        if ALL[i].data as u8 == data as u8 {
            bits |= ALL[i].bit;
        }
        i += 1;
    }
    bits
}

/// Every modifier's WGSL snippet, with its file name, in bit order (for the repository's
/// shader lints; kernels include them all).
#[doc(hidden)]
pub fn wgsl_snippets() -> impl Iterator<Item = (String, &'static str)> {
    ALL.iter().filter(|m| !m.wgsl.is_empty()).map(|m| {
        (
            format!("modifiers/{}.wgsl", m.name.to_ascii_lowercase()),
            m.wgsl,
        )
    })
}

/// Every modifier's CUDA snippet, in bit order, then the score chain, as one text.
pub(crate) fn cuda_snippets() -> String {
    let mut s = ALL.iter().map(|m| m.cuda).collect::<Vec<_>>().join("\n");
    s.push_str(&cuda_score_chain());
    s
}

/// The kernels' score chain, generated from the registry: `score_chain(x, i, j)`, the score
/// softmax sees for a visible pair from x = q.k * scale * log2(e); `score_chain_slope`, the
/// same with d(score)/dx, which the backward takes (so that each transform's derivative is
/// its own, at its own input); `SCORE_TRANSFORMED()`, true when a transform is on.
pub(crate) fn wgsl_score_chain() -> String {
    let (mut chain, mut slope, mut any) = (String::new(), String::new(), Vec::new());
    for m in ALL {
        let on = format!("{}()", m.name);
        match m.score {
            ScoreHook::None => {}
            ScoreHook::Transform { apply, slope: d } => {
                chain.push_str(&format!("    if ({on}) {{ s = {apply}(s, i, j); }}\n"));
                slope.push_str(&format!(
                    "    if ({on}) {{ let t = {apply}(f.s, i, j); f.slope *= {d}(f.s, t, i, j); f.pre = f.s; f.s = t; }}\n"
                ));
                any.push(on);
            }
            ScoreHook::Term { term } => {
                chain.push_str(&format!("    if ({on}) {{ s += {term}(i, j); }}\n"));
                slope.push_str(&format!("    if ({on}) {{ f.s += {term}(i, j); }}\n"));
            }
        }
    }
    let any = if any.is_empty() {
        "false".to_string()
    } else {
        any.join(" || ")
    };
    format!(
        "// generated: the score chain (src/kernels/hooks.rs, from the modifiers in bit order)
fn score_chain(x: f32, i: u32, j: u32) -> f32 {{
    var s = x;
{chain}    return s;
}}

// A finished score, d(score)/dx at it, and the score the last transform took (the user's
// score_mod is last: its argument, kept for a trainable tensor's gradient).
struct Finished {{
    s: f32,
    slope: f32,
    pre: f32,
}}

fn score_chain_slope(x: f32, i: u32, j: u32) -> Finished {{
    var f = Finished(x, 1.0, x);
{slope}    return f;
}}

fn SCORE_TRANSFORMED() -> bool {{ return {any}; }}
"
    )
}

/// The CUDA score chain, as [`wgsl_score_chain`]: `score_chain(p, hm, x, i, j)` and
/// `score_chain_slope(p, hm, x, i, j)`, each modifier under its `#if`.
pub(crate) fn cuda_score_chain() -> String {
    let (mut chain, mut slope) = (String::new(), String::new());
    for m in ALL {
        let name = m.name;
        match m.score {
            ScoreHook::None => {}
            ScoreHook::Transform { apply, slope: d } => {
                chain.push_str(&format!(
                    "#if {name}\n    s = {apply}(p, hm, s, i, j);\n#endif\n"
                ));
                slope.push_str(&format!(
                    "#if {name}\n    {{\n        const float t = {apply}(p, hm, f.s, i, j);\n        \
                     f.slope *= {d}(p, hm, f.s, t, i, j);\n        f.s = t;\n    }}\n#endif\n"
                ));
            }
            ScoreHook::Term { term } => {
                chain.push_str(&format!(
                    "#if {name}\n    s += {term}(p, hm, i, j);\n#endif\n"
                ));
                slope.push_str(&format!(
                    "#if {name}\n    f.s += {term}(p, hm, i, j);\n#endif\n"
                ));
            }
        }
    }
    format!(
        "// generated: the score chain (src/kernels/hooks.rs, from the modifiers in bit order)
__device__ __forceinline__ float score_chain(const CallShape& p, const HeadMods& hm, float x,
                                             unsigned int i, unsigned int j) {{
    float s = x;
{chain}    return s;
}}
// a finished score and d(score)/dx at it
struct Finished {{
    float s, slope;
}};
__device__ __forceinline__ Finished score_chain_slope(const CallShape& p, const HeadMods& hm,
                                                      float x, unsigned int i, unsigned int j) {{
    Finished f{{x, 1.f}};
{slope}    return f;
}}
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_bit_order_with_unique_names() {
        for (i, m) in ALL.iter().enumerate() {
            assert_eq!(m.bit, 1 << i, "{}", m.name);
            assert_eq!(ALL.iter().filter(|o| o.name == m.name).count(), 1);
        }
    }
}
