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

use std::fmt;
use std::sync::Arc;

use super::user_code::{self, Required, Snippet};
use crate::error::Result;

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
    /// mask_mod(unsigned int b, unsigned int h, unsigned int i, unsigned int j)`. Without it
    /// the CUDA backend refuses the call with a typed `Unsupported`. Checked as
    /// [`ScoreMod::with_cuda`](crate::ScoreMod::with_cuda)'s.
    pub fn with_cuda(mut self, source: &str) -> Result<MaskMod> {
        self.cuda = Some(user_code::check_cuda(
            "mask_mod CUDA",
            source,
            &["mask_mod"],
        )?);
        Ok(self)
    }

    /// The CUDA C, if given.
    pub fn cuda_source(&self) -> Option<&'static str> {
        self.cuda
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
