//! Block-sparse attention: a mask over blocks of (query rows x keys) that the kernels consult
//! per pair and per tile, skipping tiles whose blocks are all off.

use super::mask_mod::MaskMod;
use crate::error::{Error, Result};

pub use super::flex_blocks::FlexBlocks;

/// A block mask (block-sparse FlashAttention): query rows and keys are cut into blocks of
/// `block_q` rows and `block_kv` keys, and pair (i, j) takes part only when block
/// `(i / block_q, j / block_kv)` is on (and the other masks let it). `blocks` is
/// `[batch, heads, ceil(seq_q / block_q), ceil(seq_kv / block_kv)]`, row-major, where `batch`
/// is 1 or the call's batch and `heads` is 1 or its heads_q (a dimension of 1 is broadcast).
/// Block sizes are the caller's and need not match the kernels' tiles: a tile whose blocks are
/// all off is skipped, one that is partly on is masked pair by pair.
///
/// Non-exhaustive (it gained `full`, then `mask_mod`): make one with [`BlockMask::new`],
/// [`BlockMask::from_fn`], [`BlockMask::from_flex`] or `Context::create_block_mask`, then set
/// the fields you need.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BlockMask {
    /// Query rows per block.
    pub block_q: usize,
    /// Keys per block.
    pub block_kv: usize,
    /// 1 (broadcast) or the call's batch.
    pub batch: usize,
    /// 1 (broadcast) or the call's heads_q.
    pub heads: usize,
    /// `[batch, heads, ceil(seq_q / block_q), ceil(seq_kv / block_kv)]`, row-major: true visits the block.
    pub blocks: Vec<bool>,
    /// With a user mask (`AttentionConfig::mask_mod`): the blocks every pair of which it lets
    /// through, in `blocks`' layout, where the kernels skip evaluating it
    /// (`Context::create_block_mask` fills it; FlexAttention's full blocks). Each must be on.
    /// None: the mask is evaluated in every visited block.
    pub full: Option<Vec<bool>>,
    /// The user mask it was made from (`Context::create_block_mask` sets it, as
    /// FlexAttention's block mask keeps its `mask_mod`): a call with this block mask must
    /// carry that same mask (`Error::InvalidConfig` otherwise), since its full blocks skip
    /// that mask's evaluation. None for a block mask made by hand, whose full blocks are
    /// taken at their word.
    pub mask_mod: Option<MaskMod>,
}

impl BlockMask {
    /// A mask of `batch x heads` grids of blocks of `block_q` rows and `block_kv` keys, from
    /// their bits (`blocks`, laid out as the field says); no full blocks, no user mask.
    pub fn new(
        block_q: usize,
        block_kv: usize,
        batch: usize,
        heads: usize,
        blocks: Vec<bool>,
    ) -> BlockMask {
        BlockMask {
            block_q,
            block_kv,
            batch,
            heads,
            blocks,
            full: None,
            mask_mod: None,
        }
    }

    /// A mask of `batch x heads` grids of blocks for a call of `seq_q x seq_kv`, every block
    /// set by `on(b, h, block_row, block_col)`.
    pub fn from_fn(
        block_q: usize,
        block_kv: usize,
        (batch, heads, seq_q, seq_kv): (usize, usize, usize, usize),
        mut on: impl FnMut(usize, usize, usize, usize) -> bool,
    ) -> BlockMask {
        let (rows, cols) = (
            seq_q.div_ceil(block_q.max(1)),
            seq_kv.div_ceil(block_kv.max(1)),
        );
        let mut blocks = Vec::with_capacity(batch * heads * rows * cols);
        for b in 0..batch {
            for h in 0..heads {
                for r in 0..rows {
                    for c in 0..cols {
                        blocks.push(on(b, h, r, c));
                    }
                }
            }
        }
        BlockMask {
            block_q,
            block_kv,
            batch,
            heads,
            blocks,
            full: None,
            mask_mod: None,
        }
    }

    /// Block rows and columns of a call of `seq_q x seq_kv`.
    pub fn grid(&self, seq_q: usize, seq_kv: usize) -> (usize, usize) {
        (seq_q.div_ceil(self.block_q), seq_kv.div_ceil(self.block_kv))
    }

    /// True when the block holding pair (i, j) of (batch b, query head h) is on.
    pub fn allows(
        &self,
        seq_q: usize,
        seq_kv: usize,
        (b, h, i, j): (usize, usize, usize, usize),
    ) -> bool {
        let (rows, cols) = self.grid(seq_q, seq_kv);
        let (b, h) = (b.min(self.batch - 1), h.min(self.heads - 1));
        self.blocks[((b * self.heads + h) * rows + i / self.block_q) * cols + j / self.block_kv]
    }

    /// Strides, in blocks, between one batch's grids and the next, and one head's grid and
    /// the next: 0 along a broadcast dimension.
    pub fn strides(&self, seq_q: usize, seq_kv: usize) -> (usize, usize) {
        let (rows, cols) = self.grid(seq_q, seq_kv);
        let (b, h) = super::broadcast_strides(self.batch, self.heads, (rows * cols) as u64);
        (b as usize, h as usize)
    }

    /// The blocks packed 32 to a word, block k at bit k % 32 of word k / 32.
    pub fn bits(&self) -> Vec<u32> {
        pack(&self.blocks)
    }

    /// The full blocks (`full`) packed as [`BlockMask::bits`]; empty without them.
    pub fn full_bits(&self) -> Vec<u32> {
        self.full.as_deref().map_or(Vec::new(), pack)
    }

    /// Fraction of blocks on.
    pub fn density(&self) -> f64 {
        self.blocks.iter().filter(|&&x| x).count() as f64 / self.blocks.len().max(1) as f64
    }

    /// Tiles of `tile_q` rows x `tile_kv` keys, summed over the mask's grids (one per batch
    /// and head it holds), that hold at least one pair of an on block: the tiles a kernel
    /// with those tiles visits (before the causal and window band cuts more).
    pub fn visited_tiles(&self, seq_q: usize, seq_kv: usize, tile_q: usize, tile_kv: usize) -> u64 {
        let (rows, cols) = self.grid(seq_q, seq_kv);
        let (tiles_q, tiles_kv) = (seq_q.div_ceil(tile_q), seq_kv.div_ceil(tile_kv));
        let mut visited = 0u64;
        let mut any = vec![false; cols];
        for grid in self.blocks.chunks(rows * cols) {
            for tq in 0..tiles_q {
                let (first, last) = (tq * tile_q, ((tq + 1) * tile_q).min(seq_q) - 1);
                any.fill(false);
                for r in first / self.block_q..=last / self.block_q {
                    for (a, &on) in any.iter_mut().zip(&grid[r * cols..(r + 1) * cols]) {
                        *a |= on;
                    }
                }
                visited += (0..tiles_kv)
                    .filter(|&tk| {
                        let c1 = (((tk + 1) * tile_kv).min(seq_kv) - 1) / self.block_kv;
                        any[tk * tile_kv / self.block_kv..=c1].iter().any(|&a| a)
                    })
                    .count() as u64;
            }
        }
        visited
    }

    /// Checks the mask against a call of `batch x heads_q`, `seq_q x seq_kv`.
    /// A block mask made from a user mask goes with that mask: `call` is the call's.
    pub(crate) fn check_mask(&self, call: Option<&MaskMod>) -> Result<()> {
        match (&self.mask_mod, call) {
            (Some(made), Some(given)) if made != given => Err(Error::invalid(
                "block_mask was made (create_block_mask) from another mask_mod than the call's: \
                 its full blocks skip that mask's evaluation; give the call the mask it was \
                 made from (block_mask.mask_mod)",
            )),
            (Some(_), None) => Err(Error::invalid(
                "block_mask was made (create_block_mask) from a mask_mod and the call has none: \
                 set mask_mod to block_mask.mask_mod (FlexAttention applies it), or clear \
                 block_mask.mask_mod for block sparsity alone",
            )),
            _ => Ok(()),
        }
    }

    pub(crate) fn validate(
        &self,
        batch: usize,
        heads_q: usize,
        seq_q: usize,
        seq_kv: usize,
    ) -> Result<()> {
        for (name, v) in [("block_q", self.block_q), ("block_kv", self.block_kv)] {
            if v == 0 || v > u32::MAX as usize {
                return Err(Error::invalid(format!(
                    "block_mask.{name} must be in 1..=2^32-1 (rows or keys per block), got {v}"
                )));
            }
        }
        super::check_broadcast("block_mask", (self.batch, self.heads), (batch, heads_q))?;
        let (rows, cols) = self.grid(seq_q, seq_kv);
        let want = [self.batch, self.heads, rows, cols]
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        if want != Some(self.blocks.len()) {
            return Err(Error::invalid(format!(
                "block_mask.blocks must hold [batch, heads, ceil(seq_q / block_q), ceil(seq_kv / block_kv)] = [{}, {}, {rows}, {cols}] = {} entries, got {}",
                self.batch,
                self.heads,
                want.map_or("more than 2^64".to_string(), |n| n.to_string()),
                self.blocks.len()
            )));
        }
        if let Some(full) = &self.full {
            if full.len() != self.blocks.len() {
                return Err(Error::invalid(format!(
                    "block_mask.full must hold one flag per block ({}), got {}",
                    self.blocks.len(),
                    full.len()
                )));
            }
            if let Some(k) = (0..full.len()).find(|&k| full[k] && !self.blocks[k]) {
                return Err(Error::invalid(format!(
                    "block_mask.full[{k}] is set but block {k} is off: a full block must be on"
                )));
            }
        }
        Ok(())
    }
}

/// Flags packed 32 to a word, flag k at bit k % 32 of word k / 32.
fn pack(flags: &[bool]) -> Vec<u32> {
    let mut words = vec![0u32; flags.len().div_ceil(32)];
    for (k, _) in flags.iter().enumerate().filter(|(_, &on)| on) {
        words[k / 32] |= 1 << (k % 32);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_strides_and_lookup_agree() {
        // batch 2 (full), heads broadcast; 10 x 7 call in blocks of 4 x 3: a 3 x 3 grid
        let m = BlockMask::from_fn(4, 3, (2, 1, 10, 7), |b, _, r, c| (b + r * 3 + c) % 3 == 0);
        assert_eq!(m.blocks.len(), 2 * 9);
        assert_eq!(m.strides(10, 7), (9, 0));
        let bits = m.bits();
        for b in 0..2 {
            for h in 0..5 {
                for i in 0..10 {
                    for j in 0..7 {
                        let k = b * 9 + (i / 4) * 3 + j / 3;
                        let bit = bits[k / 32] >> (k % 32) & 1 == 1;
                        assert_eq!(m.allows(10, 7, (b, h, i, j)), bit);
                        assert_eq!(bit, (b + (i / 4) * 3 + j / 3) % 3 == 0);
                    }
                }
            }
        }
        assert!(m.validate(2, 5, 10, 7).is_ok());
        // visited tiles against a pair-by-pair count
        for (tq, tk) in [(1, 1), (2, 2), (4, 3), (3, 4), (8, 8), (16, 16)] {
            let mut want = 0;
            for b in 0..2 {
                for r in 0..10usize.div_ceil(tq) {
                    for c in 0..7usize.div_ceil(tk) {
                        let on = (r * tq..(r * tq + tq).min(10)).any(|i| {
                            (c * tk..(c * tk + tk).min(7)).any(|j| m.allows(10, 7, (b, 0, i, j)))
                        });
                        want += on as u64;
                    }
                }
            }
            assert_eq!(m.visited_tiles(10, 7, tq, tk), want, "tiles {tq} x {tk}");
        }
        assert!(m.validate(3, 5, 10, 7).is_err());
        assert!(m.validate(2, 5, 13, 7).is_err());
    }
}
