//! The modifiers a call can have: masks (causal, window, key ranges, block-sparse, boolean,
//! varlen), score terms (softcap, ALiBi, bias, a user's `score_mod`), sinks, dropout, and K/V
//! layouts (paged, strided views). Each lives in one module here, which owns what the rest of the crate needs
//! of it: its public types and their validation, its bit in `Params::flags`, its encoding into
//! the parameters, and its WGSL and CUDA snippets (shaders/modifiers/, cuda/modifiers/), which
//! every kernel source includes. The kernels' shared code (shaders/common.wgsl,
//! cuda/common.cuh) composes the snippets at the hooks where modifiers act (`begin_head`,
//! `visible`, `finish_score`, the pair gradients); docs/ARCHITECTURE.md lists what a new
//! modifier touches.
//!
//! The registry (`Modifier`, crate-internal) is the one list of them: the flag bits, the
//! compile-time defaults, the validation loop and the snippet lists are all read from it.

pub(crate) mod alibi;
pub(crate) mod band;
pub mod bias;
pub mod block_mask;
pub mod bool_mask;
pub mod dropout;
pub mod mask_mod;
pub mod paged;
pub mod score_mod;
pub(crate) mod seqlens;
pub(crate) mod sinks;
pub(crate) mod softcap;
pub(crate) mod user_code;
pub mod varlen;

use crate::error::Result;
use crate::kernels::params::Params;
use crate::AttentionConfig;

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
/// [`cuda_score_chain`]); the f64 reference walks the same list.
#[derive(Clone, Copy)]
pub(crate) enum Score {
    /// It does not touch scores.
    None,
    /// It replaces the score s by t = f(s). WGSL: `fn {apply}(s: f32, i: u32, j: u32) -> f32`
    /// and its derivative `fn {slope}(s: f32, t: f32, i: u32, j: u32) -> f32` (dt/ds, given
    /// both sides); CUDA the same with `(const CallShape& p, const HeadMods& hm, ...)` first.
    /// The reference: the same two in f64, at natural-log scores.
    Transform {
        apply: &'static str,
        slope: &'static str,
        reference: fn(&AttentionConfig, Pair, f64) -> f64,
        reference_slope: fn(&AttentionConfig, Pair, f64) -> f64,
    },
    /// It adds a term to the score. WGSL: `fn {term}(i: u32, j: u32) -> f32`; CUDA
    /// `(const CallShape& p, const HeadMods& hm, i, j)`; the reference: at natural-log scores.
    Term {
        term: &'static str,
        reference: fn(&AttentionConfig, Pair) -> f64,
    },
}

/// A pair of a call: (batch, query head, query row, key).
pub(crate) type Pair = (usize, usize, usize, usize);

/// One modifier, as the rest of the crate sees it.
pub(crate) struct Modifier {
    /// Its name in the kernels: the WGSL function `NAME()` and the CUDA define `-DNAME`.
    pub name: &'static str,
    /// Its bit in `Params::flags`.
    pub bit: u32,
    /// Compiled into pipelines by default (per-score work that costs when merely tested),
    /// else read at run time (docs/PERFORMANCE.md, "Modifiers as run-time bits").
    pub compiled: bool,
    /// Where its values live.
    pub data: Data,
    /// The call has it.
    pub active: fn(&AttentionConfig) -> bool,
    /// Its part of `AttentionConfig::validate`: a typed error for a bad value.
    pub check: fn(&AttentionConfig) -> Result<()>,
    /// Its scalars in the parameter block (extras offsets are `params::extras_layout`'s).
    pub encode: fn(&AttentionConfig, &mut Params),
    /// How it acts on scores.
    pub score: Score,
    /// Its WGSL functions, included in every kernel source.
    pub wgsl: &'static str,
    /// Its CUDA functions, included in every CUDA program (may be empty).
    pub cuda: &'static str,
}

fn never(_: &AttentionConfig) -> bool {
    false
}
fn no_check(_: &AttentionConfig) -> Result<()> {
    Ok(())
}
fn no_params(_: &AttentionConfig, _: &mut Params) {}

/// Strided input views: a property of the tensors a call runs on, not of its config (the bit
/// is set per step at record time).
pub(crate) const VIEWS: Modifier = Modifier {
    name: "VIEWS",
    bit: 1 << 12,
    compiled: false,
    data: Data::Params,
    active: never,
    check: no_check,
    encode: no_params,
    score: Score::None,
    wgsl: "",
    cuda: "",
};

/// Every modifier, in bit order (bit i is `1 << i`).
pub(crate) const ALL: [&Modifier; 15] = [
    &band::CAUSAL,
    &band::WINDOW,
    &softcap::MODIFIER,
    &alibi::MODIFIER,
    &sinks::MODIFIER,
    &seqlens::MODIFIER,
    &dropout::MODIFIER,
    &block_mask::MODIFIER,
    &varlen::MODIFIER,
    &bool_mask::MODIFIER,
    &bias::MODIFIER,
    &paged::MODIFIER,
    &VIEWS,
    &score_mod::MODIFIER,
    &mask_mod::MODIFIER,
];

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
            Score::None => {}
            Score::Transform {
                apply, slope: d, ..
            } => {
                chain.push_str(&format!("    if ({on}) {{ s = {apply}(s, i, j); }}\n"));
                slope.push_str(&format!(
                    "    if ({on}) {{ let t = {apply}(f.s, i, j); f.slope *= {d}(f.s, t, i, j); f.s = t; }}\n"
                ));
                any.push(on);
            }
            Score::Term { term, .. } => {
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
        "// generated: the score chain (src/modifiers/mod.rs, from the modifiers in bit order)
fn score_chain(x: f32, i: u32, j: u32) -> f32 {{
    var s = x;
{chain}    return s;
}}

// A finished score and d(score)/dx at it.
struct Finished {{
    s: f32,
    slope: f32,
}}

fn score_chain_slope(x: f32, i: u32, j: u32) -> Finished {{
    var f = Finished(x, 1.0);
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
            Score::None => {}
            Score::Transform {
                apply, slope: d, ..
            } => {
                chain.push_str(&format!(
                    "#if {name}\n    s = {apply}(p, hm, s, i, j);\n#endif\n"
                ));
                slope.push_str(&format!(
                    "#if {name}\n    {{\n        const float t = {apply}(p, hm, f.s, i, j);\n        \
                     f.slope *= {d}(p, hm, f.s, t, i, j);\n        f.s = t;\n    }}\n#endif\n"
                ));
            }
            Score::Term { term, .. } => {
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
        "// generated: the score chain (src/modifiers/mod.rs, from the modifiers in bit order)
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

/// The f64 reference's score chain for a visible pair from its raw (natural-log) score x:
/// the finished score and d(score)/dx.
pub(crate) fn reference_chain(cfg: &AttentionConfig, at: Pair, x: f64) -> (f64, f64) {
    let (mut s, mut slope) = (x, 1.0);
    for m in ALL.iter().filter(|m| (m.active)(cfg)) {
        match m.score {
            Score::None => {}
            Score::Transform {
                reference,
                reference_slope,
                ..
            } => {
                slope *= reference_slope(cfg, at, s);
                s = reference(cfg, at, s);
            }
            Score::Term { reference, .. } => s += reference(cfg, at),
        }
    }
    (s, slope)
}

/// Entries between one grid of a `[batch, heads, ...]` tensor of `grid`-entry grids and the
/// next batch's, and the next head's: 0 along a broadcast dimension (a size of 1). The masks'
/// and the bias's strides.
pub(crate) fn broadcast_strides(batch: usize, heads: usize, grid: u64) -> (u64, u64) {
    let h = if heads > 1 { grid } else { 0 };
    let b = if batch > 1 { heads as u64 * grid } else { 0 };
    (b, h)
}

/// Runs every modifier's validation, in bit order.
pub(crate) fn check_all(cfg: &AttentionConfig) -> Result<()> {
    ALL.iter().try_for_each(|m| (m.check)(cfg))
}

/// Writes every modifier's scalars into `p`.
pub(crate) fn encode_all(cfg: &AttentionConfig, p: &mut Params) {
    for m in ALL {
        (m.encode)(cfg, p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_is_in_bit_order_with_unique_names() {
        for (i, m) in ALL.iter().enumerate() {
            assert_eq!(m.bit, 1 << i, "{}", m.name);
            assert_eq!(ALL.iter().filter(|o| o.name == m.name).count(), 1);
        }
    }
}
