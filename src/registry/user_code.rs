//! A call's user code as its kernels take it: the score and mask modifiers' WGSL with their
//! captured tensors' accessors (or the stand-ins), the CUDA accessors, the captured words in the
//! extras, and the rule that the two modifiers capture disjoint names. The snippets' own checks
//! are `modifiers::user_code`'s.

use crate::error::Result;
use crate::kernels::hooks;
use crate::modifiers::user_code::{accessors, intern, user_error};
use crate::AttentionConfig;

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
        score.map_or(hooks::SCORE_MOD_STUB, |m| m.wgsl_source()),
        mask.map_or(hooks::MASK_MOD_STUB, |m| m.wgsl_source()),
    )))
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
