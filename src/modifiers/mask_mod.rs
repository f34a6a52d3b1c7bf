//! User-defined masks (PyTorch FlexAttention's `mask_mod`): a predicate over (batch, query
//! head, row, key) written as WGSL, which every kernel applies with the other masks, and a
//! block mask computed from it on the GPU (`Context::create_block_mask`, FlexAttention's
//! `create_block_mask`) so that blocks it hides entirely are never visited.
//!
//! The user's WGSL defines, beside any helpers:
//!
//! ```wgsl
//! fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { ... } // true: the pair takes part
//! ```
//!
//! with the indices of `score_mod` (the call's batch, query head, row and key). The checks,
//! the captured tensors (`MaskMod::wgsl_with`) and the errors are `ScoreMod`'s. The CUDA
//! backend takes the same predicate as CUDA C ([`MaskMod::with_cuda`]), which reads the
//! captured tensors by the same names. A call with a
//! `mask_mod` and no block mask evaluates it at every pair of every tile; with the block mask
//! `create_block_mask` gives, only in the blocks it leaves on.
//!
//! Masks combine as FlexAttention's do: [`MaskMod::and_masks`], [`MaskMod::or_masks`] and
//! [`MaskMod::noop_mask`] build one mask from others, WGSL, CUDA C and host predicate alike.
//!
//! The indices are `u32`, so FlexAttention's `kv_idx - q_idx` wraps where the key comes
//! before the row. Write a signed distance as `i32(j) - i32(i)` (CUDA:
//! `(int)j - (int)i`): exact for every index a call can have (each below 2^31).

use std::fmt;
use std::sync::Arc;

use super::user_code::{self, Required, Snippet};
use crate::error::{Error, Result};

/// A host predicate of (batch, query head, row, key), for the f64 reference.
pub type HostMaskFn = Arc<dyn Fn(usize, usize, usize, usize) -> bool + Send + Sync>;

/// The function a mask modifier's WGSL defines.
const REQUIRED: [Required; 1] = [Required {
    name: "mask_mod",
    args: &["u32", "u32", "u32", "u32"],
    ret: "bool",
}];

/// A user-defined mask: its WGSL (checked), its captured tensors, optionally a host predicate
/// for the f64 reference (see the module).
#[derive(Clone)]
pub struct MaskMod {
    code: Snippet,
    /// The caller's CUDA C (`with_cuda`); without it the WGSL's translation is asked for.
    cuda: Option<&'static str>,
    host: Option<HostMaskFn>,
}

impl MaskMod {
    /// A mask from its WGSL, checked: a typed [`crate::Error::UserCode`] names what is wrong
    /// and where.
    pub fn wgsl(source: &str) -> Result<MaskMod> {
        MaskMod::wgsl_with(source, Vec::<(String, Vec<f32>)>::new())
    }

    /// A mask whose WGSL reads captured tensors by name (as `ScoreMod::wgsl_with`; a call's
    /// score and mask modifiers capture different names).
    pub fn wgsl_with<N: Into<String>>(
        source: &str,
        captured: impl IntoIterator<Item = (N, Vec<f32>)>,
    ) -> Result<MaskMod> {
        Ok(MaskMod {
            code: Snippet::new("mask_mod", source, captured, &REQUIRED)?,
            cuda: None,
            host: None,
        })
    }

    /// The same predicate as CUDA C, for the CUDA backend: `__device__ bool
    /// mask_mod(unsigned int b, unsigned int h, unsigned int i, unsigned int j)`, in place of
    /// the WGSL's translation (which a snippet the translation does not take lacks: the CUDA
    /// backend then refuses the call with a typed `Unsupported`). Checked as
    /// [`ScoreMod::with_cuda`](crate::ScoreMod::with_cuda)'s.
    pub fn with_cuda(mut self, source: &str) -> Result<MaskMod> {
        self.cuda = Some(user_code::check_cuda(
            "mask_mod CUDA",
            source,
            &["mask_mod"],
        )?);
        Ok(self)
    }

    /// The CUDA C: as given to [`with_cuda`](Self::with_cuda), else the WGSL translated;
    /// `None` where the translation does not take the snippet
    /// ([`cuda_missing`](Self::cuda_missing) says why).
    pub fn cuda_source(&self) -> Option<&'static str> {
        self.cuda.or_else(|| self.code.cuda().ok())
    }

    /// Why the snippet has no CUDA C (what the translation does not take), if it has none.
    pub fn cuda_missing(&self) -> Option<String> {
        self.cuda.map_or_else(|| self.code.cuda().err(), |_| None)
    }

    /// The host predicate equal to `mask_mod`, which the f64 reference applies; without it
    /// the reference hides every pair (out 0, lse -inf).
    pub fn with_reference(
        mut self,
        mask: impl Fn(usize, usize, usize, usize) -> bool + Send + Sync + 'static,
    ) -> MaskMod {
        self.host = Some(Arc::new(mask));
        self
    }

    /// The WGSL, as given.
    pub fn wgsl_source(&self) -> &'static str {
        self.code.source
    }

    /// The captured tensors' names and values, in order.
    pub fn captured(&self) -> &[(String, Vec<f32>)] {
        &self.code.captured
    }

    /// The host predicate at (b, h, i, j): false without one.
    pub(crate) fn host(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        self.host.as_ref().is_some_and(|f| f(b, h, i, j))
    }
}

impl MaskMod {
    /// The mask that lets every pair through (FlexAttention's `noop_mask`), with its CUDA C
    /// and host predicate: the identity of [`and_masks`](Self::and_masks).
    pub fn noop_mask() -> MaskMod {
        MaskMod::wgsl("fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return true; }")
            .and_then(|m| {
                m.with_cuda(
                    "__device__ bool mask_mod(unsigned int b, unsigned int h, unsigned int i, \
                     unsigned int j) { return true; }",
                )
            })
            .expect("the noop mask's code passes the checks (a unit test holds it)")
            .with_reference(|_, _, _, _| true)
    }

    /// The mask that lets a pair through where every one of `masks` does (FlexAttention's
    /// `and_masks`). Each mask's functions and captured tensors are renamed apart (so two
    /// masks may share helper or tensor names), and the result is checked as any mask; it
    /// has CUDA C where every mask has, and a host predicate where every mask has. No mask
    /// is a typed error.
    pub fn and_masks(masks: &[&MaskMod]) -> Result<MaskMod> {
        compose(masks, "and")
    }

    /// The mask that lets a pair through where any of `masks` does (FlexAttention's
    /// `or_masks`), built as [`and_masks`](Self::and_masks).
    pub fn or_masks(masks: &[&MaskMod]) -> Result<MaskMod> {
        compose(masks, "or")
    }
}

/// `masks` joined by `op` ("and", "or"): each one's module-scope names and captured tensors
/// prefixed by `{op}{k}_`, then a `mask_mod` that asks each in turn.
fn compose(masks: &[&MaskMod], op: &str) -> Result<MaskMod> {
    if masks.is_empty() {
        return Err(Error::invalid(format!(
            "{op}_masks needs at least one mask, got none"
        )));
    }
    let (mut wgsl, mut cuda, mut captured, mut calls) =
        (String::new(), Some(String::new()), Vec::new(), Vec::new());
    for (k, m) in masks.iter().enumerate() {
        let prefix = format!("{op}{k}_");
        let renamed = |n: &str| format!("{prefix}{n}");
        let names: std::collections::HashMap<String, String> =
            super::names::declarations(m.wgsl_source())
                .into_iter()
                .map(|(n, _)| n)
                .chain(m.captured().iter().map(|(n, _)| n.clone()))
                .map(|n| (n.clone(), renamed(&n)))
                .collect();
        wgsl.push_str(&super::names::rename_identifiers(m.wgsl_source(), &names));
        wgsl.push('\n');
        cuda = match (cuda, m.cuda_source()) {
            (Some(mut c), Some(src)) => {
                c.push_str(&super::names::rename_identifiers(src, &names));
                c.push('\n');
                Some(c)
            }
            _ => None,
        };
        captured.extend(m.captured().iter().map(|(n, v)| (renamed(n), v.clone())));
        calls.push(format!("{}(b, h, i, j)", renamed("mask_mod")));
    }
    let joined = calls.join(if op == "and" { " && " } else { " || " });
    wgsl.push_str(&format!(
        "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool {{ return {joined}; }}\n"
    ));
    let mut out = MaskMod::wgsl_with(&wgsl, captured)?;
    if let Some(mut c) = cuda {
        c.push_str(&format!(
            "__device__ __forceinline__ bool mask_mod(unsigned int b, unsigned int h, \
             unsigned int i, unsigned int j) {{ return {joined}; }}\n"
        ));
        out = out.with_cuda(&c)?;
    }
    let hosts: Option<Vec<HostMaskFn>> = masks.iter().map(|m| m.host.clone()).collect();
    if let Some(fs) = hosts {
        let all = op == "and";
        out.host = Some(Arc::new(move |b, h, i, j| {
            if all {
                fs.iter().all(|f| f(b, h, i, j))
            } else {
                fs.iter().any(|f| f(b, h, i, j))
            }
        }));
    }
    Ok(out)
}

impl PartialEq for MaskMod {
    /// Two masks are equal when their code (WGSL and CUDA C) and captured tensors are.
    fn eq(&self, other: &MaskMod) -> bool {
        self.code == other.code && self.cuda == other.cuda
    }
}

impl fmt::Debug for MaskMod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaskMod")
            .field("code", &self.code)
            .field("cuda", &self.cuda)
            .field("host", &self.host.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(w: u32) -> MaskMod {
        // two masks may share helper and tensor names: the composition renames them apart
        MaskMod::wgsl_with(
            &format!(
                "fn near(i: u32, j: u32) -> bool {{ return abs(i32(j) - i32(i)) <= {w}; }}\n\
                 fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool {{ return near(i, j) && t(0u) > 0.0; }}"
            ),
            [("t", vec![1.0])],
        )
        .unwrap()
        .with_cuda(&format!(
            "__device__ bool near(unsigned int i, unsigned int j) {{ return abs((int)j - (int)i) <= {w}; }}\n\
             __device__ bool mask_mod(unsigned int b, unsigned int h, unsigned int i, unsigned int j) \
             {{ return near(i, j) && t(0u) > 0.f; }}"
        ))
        .unwrap()
        .with_reference(move |_, _, i, j| (j as i64 - i as i64).abs() <= w as i64)
    }

    #[test]
    fn masks_compose_with_their_names_apart_in_wgsl_cuda_and_on_the_host() {
        let (a, b) = (window(2), window(5));
        let and = MaskMod::and_masks(&[&a, &b, &MaskMod::noop_mask()]).unwrap();
        let or = MaskMod::or_masks(&[&a, &b]).unwrap();
        for (m, want) in [(&and, [true, false, false]), (&or, [true, true, false])] {
            for (k, (i, j)) in [(10, 8), (10, 14), (10, 30)].into_iter().enumerate() {
                assert_eq!(m.host(0, 0, i, j), want[k], "{i} {j}");
            }
            let names: Vec<&str> = m.captured().iter().map(|(n, _)| n.as_str()).collect();
            assert!(
                names.len() >= 2 && names.iter().all(|n| n.ends_with("_t")),
                "{names:?}"
            );
        }
        let w = and.wgsl_source();
        assert!(
            w.contains("and0_near(i, j)") && w.contains("fn and1_near("),
            "{w}"
        );
        assert!(w.contains("and0_mask_mod(b, h, i, j) && and1_mask_mod(b, h, i, j)"));
        let c = or.cuda_source().unwrap();
        assert!(c.contains("or1_t(0u)") && c.contains("or0_mask_mod(b, h, i, j) || or1_mask_mod"));
        // a mask without CUDA C of its own has its WGSL's translation; a mask without a host
        // predicate makes one whose reference is absent (false); no mask is an error
        let bare =
            MaskMod::wgsl("fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return i >= j; }")
                .unwrap();
        // the translation's parameters under the generated prefix (modifiers/names.rs)
        let translated = bare.cuda_source().unwrap();
        assert!(
            translated.contains("bool mask_mod(unsigned int gen_a0, unsigned int gen_a1"),
            "{translated}"
        );
        let mixed = MaskMod::and_masks(&[&a, &bare]).unwrap();
        assert!(mixed.cuda_source().is_some() && mixed.host.is_none());
        assert!(
            matches!(MaskMod::or_masks(&[]), Err(Error::InvalidConfig(m)) if m.contains("or_masks"))
        );
        // compositions compose
        assert!(MaskMod::or_masks(&[&and, &or]).unwrap().host(0, 0, 10, 14));
    }
}
