//! `Context::create_block_mask`: a user mask's block mask, evaluated on the GPU
//! (FlexAttention's `create_block_mask`).

use crate::error::Result;
use crate::{BlockMask, Context, MaskMod};

impl Context {
    /// The block mask of a user mask (FlexAttention's `create_block_mask`): block
    /// `(b, h, r, c)` of `block_q x block_kv` pairs is on when `mask` lets some pair of it
    /// through, and full when it lets every pair through (where the kernels skip evaluating
    /// it), evaluated on the GPU (each block's pairs in turn, until both are decided). `batch`
    /// and `heads` are the call's, or 1 for a mask that does not depend on them (evaluated at
    /// 0, the block mask broadcasts). It depends only on the mask, the shape and the block
    /// sizes: make it once and reuse it across calls and layers. With it in
    /// `AttentionConfig::block_mask` beside the same `mask_mod`, the kernels skip every tile
    /// whose blocks are all off and evaluate the mask pair by pair in the others.
    pub fn create_block_mask(
        &self,
        mask: &MaskMod,
        (batch, heads, seq_q, seq_kv): (usize, usize, usize, usize),
        (block_q, block_kv): (usize, usize),
    ) -> Result<BlockMask> {
        let plan =
            crate::plan::mask_blocks(mask, (batch, heads, seq_q, seq_kv), (block_q, block_kv))?;
        let out = self.execute(&plan, &[])?;
        let flags: Vec<f32> = self.download(&out[0])?;
        Ok(crate::plan::mask_blocks::block_mask(
            mask,
            &flags,
            (batch, heads),
            (block_q, block_kv),
        ))
    }
}
