//! FlexAttention's sparse form of a block mask (the tensors of its `BlockMask`), to and from
//! [`BlockMask`], so that a mask built for FlexAttention ports as it is.

use super::block_mask::BlockMask;
use crate::error::{Error, Result};

/// A block mask in FlexAttention's form, each tensor row-major and `int32` as there. Per row
/// of query blocks of each (batch, head): `kv_num_blocks` key blocks at the front of its row
/// of `kv_indices` are visited with the mask evaluated (partial blocks), and
/// `full_kv_num_blocks` at the front of its row of `full_kv_indices` are visited without it
/// (full blocks); a block in neither is skipped. The `q_*` tensors say the same per column
/// of key blocks (FlexAttention's backward reads them). Entries past a row's count are the
/// remaining blocks in ascending order, as FlexAttention lays them out (they are not read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlexBlocks {
    /// (batch, heads, query blocks, key blocks): batch and heads 1 where they broadcast.
    pub shape: (usize, usize, usize, usize),
    /// `[batch, heads, query blocks]`.
    pub kv_num_blocks: Vec<i32>,
    /// `[batch, heads, query blocks, key blocks]`.
    pub kv_indices: Vec<i32>,
    /// `[batch, heads, query blocks]`; None: no block is full.
    pub full_kv_num_blocks: Option<Vec<i32>>,
    /// `[batch, heads, query blocks, key blocks]`, with `full_kv_num_blocks`.
    pub full_kv_indices: Option<Vec<i32>>,
    /// `[batch, heads, key blocks]`.
    pub q_num_blocks: Vec<i32>,
    /// `[batch, heads, key blocks, query blocks]`.
    pub q_indices: Vec<i32>,
    /// `[batch, heads, key blocks]`, with the full blocks.
    pub full_q_num_blocks: Option<Vec<i32>>,
    /// `[batch, heads, key blocks, query blocks]`, with the full blocks.
    pub full_q_indices: Option<Vec<i32>>,
}

/// Per grid line (a row of `n` blocks, `lines` of them), the count of blocks `pick` takes and
/// their indices, ascending, then the others ascending: FlexAttention's layout.
fn sparse(lines: usize, n: usize, pick: impl Fn(usize, usize) -> bool) -> (Vec<i32>, Vec<i32>) {
    let (mut counts, mut indices) = (Vec::with_capacity(lines), Vec::with_capacity(lines * n));
    for l in 0..lines {
        let (on, off): (Vec<usize>, Vec<usize>) = (0..n).partition(|&k| pick(l, k));
        counts.push(on.len() as i32);
        indices.extend(on.iter().chain(&off).map(|&k| k as i32));
    }
    (counts, indices)
}

impl BlockMask {
    /// This mask in FlexAttention's form for a call of `seq_q x seq_kv` (the grid's size):
    /// the on blocks that are not full as partial blocks, the full ones as full blocks
    /// (`full_*` None where [`BlockMask::full`] is), on both sides.
    pub fn to_flex(&self, seq_q: usize, seq_kv: usize) -> FlexBlocks {
        let (rows, cols) = self.grid(seq_q, seq_kv);
        let grids = self.batch * self.heads;
        let at = |g: usize, r: usize, c: usize| (g * rows + r) * cols + c;
        let full = |k: usize| self.full.as_ref().is_some_and(|f| f[k]);
        let partial = |k: usize| self.blocks[k] && !full(k);
        // a line is (grid, row) on the kv side and (grid, column) on the q side
        let kv = |pick: &dyn Fn(usize) -> bool| {
            sparse(grids * rows, cols, |l, c| pick(at(l / rows, l % rows, c)))
        };
        let q = |pick: &dyn Fn(usize) -> bool| {
            sparse(grids * cols, rows, |l, r| pick(at(l / cols, r, l % cols)))
        };
        let (kv_num_blocks, kv_indices) = kv(&partial);
        let (q_num_blocks, q_indices) = q(&partial);
        let (full_kv, full_q) = match self.full {
            Some(_) => (Some(kv(&full)), Some(q(&full))),
            None => (None, None),
        };
        FlexBlocks {
            shape: (self.batch, self.heads, rows, cols),
            kv_num_blocks,
            kv_indices,
            full_kv_num_blocks: full_kv.as_ref().map(|f| f.0.clone()),
            full_kv_indices: full_kv.map(|f| f.1),
            q_num_blocks,
            q_indices,
            full_q_num_blocks: full_q.as_ref().map(|f| f.0.clone()),
            full_q_indices: full_q.map(|f| f.1),
        }
    }

    /// The block mask of FlexAttention's form, with blocks of `block_q x block_kv`: on where
    /// a block is partial or full, full where it is full (the mask it goes with is the
    /// caller's to set: `mask_mod`). Read from the kv side; the q side,
    /// where given (non-empty), must say the same. Typed errors name the tensor: a length
    /// that is not its shape's, a count past the blocks of a row, an index out of range or
    /// listed twice in a row, a block both partial and full, a q side that disagrees.
    pub fn from_flex(block_q: usize, block_kv: usize, flex: &FlexBlocks) -> Result<BlockMask> {
        let (batch, heads, rows, cols) = flex.shape;
        let lines = batch * heads * rows;
        let read = |name: &str, counts: &[i32], indices: &[i32]| -> Result<Vec<bool>> {
            if counts.len() != lines || indices.len() != lines * cols {
                return Err(Error::invalid(format!(
                    "flex.{name}_num_blocks and flex.{name}_indices must hold [batch, heads, \
                     query blocks] = {lines} and [.., key blocks] = {} entries (shape {:?}), \
                     got {} and {}",
                    lines * cols,
                    flex.shape,
                    counts.len(),
                    indices.len()
                )));
            }
            let mut on = vec![false; lines * cols];
            for (l, &n) in counts.iter().enumerate() {
                if n < 0 || n as usize > cols {
                    return Err(Error::invalid(format!(
                        "flex.{name}_num_blocks[{l}] must be in 0..={cols} (key blocks a row), \
                         got {n}"
                    )));
                }
                for &c in &indices[l * cols..l * cols + n as usize] {
                    if c < 0 || c as usize >= cols {
                        return Err(Error::invalid(format!(
                            "flex.{name}_indices row {l} lists key block {c}, outside 0..{cols}"
                        )));
                    }
                    if std::mem::replace(&mut on[l * cols + c as usize], true) {
                        return Err(Error::invalid(format!(
                            "flex.{name}_indices row {l} lists key block {c} twice"
                        )));
                    }
                }
            }
            Ok(on)
        };
        let partial = read("kv", &flex.kv_num_blocks, &flex.kv_indices)?;
        let full = match (&flex.full_kv_num_blocks, &flex.full_kv_indices) {
            (Some(n), Some(i)) => Some(read("full_kv", n, i)?),
            (None, None) => None,
            _ => {
                return Err(Error::invalid(
                    "flex.full_kv_num_blocks and flex.full_kv_indices come together, got one",
                ))
            }
        };
        if let Some(k) = full
            .as_ref()
            .and_then(|f| (0..f.len()).find(|&k| f[k] && partial[k]))
        {
            return Err(Error::invalid(format!(
                "block {k} is listed both partial (flex.kv_indices) and full \
                 (flex.full_kv_indices): a block is one or the other"
            )));
        }
        let blocks: Vec<bool> = (0..partial.len())
            .map(|k| partial[k] || full.as_ref().is_some_and(|f| f[k]))
            .collect();
        let mask = BlockMask {
            block_q,
            block_kv,
            batch,
            heads,
            blocks,
            full,
            mask_mod: None,
        };
        if !flex.q_num_blocks.is_empty() {
            let back = mask.to_flex(rows * block_q, cols * block_kv);
            let sides = [
                ("q_num_blocks", &flex.q_num_blocks, &back.q_num_blocks),
                ("q_indices", &flex.q_indices, &back.q_indices),
            ];
            for (name, given, derived) in sides {
                if !same_lists(
                    name,
                    given,
                    derived,
                    rows,
                    &flex.q_num_blocks,
                    &back.q_num_blocks,
                ) {
                    return Err(Error::invalid(format!(
                        "flex.{name} disagrees with the kv side (the same blocks per column of \
                         key blocks, as its transpose)"
                    )));
                }
            }
        }
        Ok(mask)
    }
}

/// The q side's counts are equal, or its index lists name the same blocks in each column's
/// counted prefix (an order of the caller's own is allowed).
fn same_lists(
    name: &str,
    given: &[i32],
    derived: &[i32],
    rows: usize,
    given_counts: &[i32],
    counts: &[i32],
) -> bool {
    if name.ends_with("num_blocks") {
        return given == derived;
    }
    if given.len() != derived.len() || given_counts != counts {
        return false;
    }
    counts.iter().enumerate().all(|(l, &n)| {
        let take = |v: &[i32]| {
            let mut x = v[l * rows..l * rows + n as usize].to_vec();
            x.sort_unstable();
            x
        };
        take(given) == take(derived)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_mask_goes_to_flexattention_s_form_and_back() {
        // 2 heads of a 3 x 4 grid: head 0 by hand, head 1 a pattern with full blocks
        let on = [
            [
                true, false, true, false, false, false, false, false, true, true, true, true,
            ],
            [
                true, true, false, false, false, true, true, false, true, true, true, true,
            ],
        ];
        let full = [
            [
                false, false, true, false, false, false, false, false, false, true, false, true,
            ],
            [
                true, false, false, false, false, false, true, false, true, true, false, false,
            ],
        ];
        let m = BlockMask {
            block_q: 16,
            block_kv: 8,
            batch: 1,
            heads: 2,
            blocks: on.concat(),
            full: Some(full.concat()),
            mask_mod: None,
        };
        let f = m.to_flex(40, 30);
        assert_eq!(f.shape, (1, 2, 3, 4));
        // head 0, row 0: block 0 partial, block 2 full; row 1: none; row 2: 8, 10 partial
        assert_eq!(&f.kv_num_blocks[..3], &[1, 0, 2]);
        assert_eq!(&f.kv_indices[..4], &[0, 1, 2, 3]);
        assert_eq!(&f.kv_indices[8..12], &[0, 2, 1, 3]);
        assert_eq!(&f.full_kv_num_blocks.as_ref().unwrap()[..3], &[1, 0, 2]);
        assert_eq!(&f.full_kv_indices.as_ref().unwrap()[..4], &[2, 0, 1, 3]);
        // the q side: head 0, column 0 partial in rows 0 and 2
        assert_eq!(&f.q_num_blocks[..4], &[2, 0, 1, 0]);
        assert_eq!(&f.q_indices[..3], &[0, 2, 1]);
        let back = BlockMask::from_flex(16, 8, &f).unwrap();
        assert_eq!(back, m);
        // without full blocks
        let plain = BlockMask {
            full: None,
            ..m.clone()
        };
        let f = plain.to_flex(40, 30);
        assert!(f.full_kv_indices.is_none() && f.full_q_num_blocks.is_none());
        assert_eq!(BlockMask::from_flex(16, 8, &f).unwrap(), plain);
    }

    #[test]
    fn random_masks_round_trip_and_bad_forms_are_named() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut bit = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % 3
        };
        for (b, h, sq, skv, bq, bk) in [(2, 3, 70, 50, 16, 8), (1, 1, 9, 200, 4, 32)] {
            let mut full = Vec::new();
            let mut m = BlockMask::from_fn(bq, bk, (b, h, sq, skv), |_, _, _, _| {
                let x = bit();
                full.push(x == 2);
                x > 0
            });
            m.full = Some(full);
            assert_eq!(
                BlockMask::from_flex(bq, bk, &m.to_flex(sq, skv)).unwrap(),
                m
            );
        }
        let m = BlockMask::from_fn(4, 4, (1, 1, 8, 12), |_, _, r, c| r <= c);
        let good = m.to_flex(8, 12);
        let bad = |edit: &dyn Fn(&mut FlexBlocks), want: &str| {
            let mut f = good.clone();
            edit(&mut f);
            match BlockMask::from_flex(4, 4, &f) {
                Err(Error::InvalidConfig(msg)) => assert!(msg.contains(want), "{msg}"),
                other => panic!("expected an error naming {want}, got {other:?}"),
            }
        };
        bad(&|f| f.kv_indices.pop().map(|_| ()).unwrap(), "kv_indices");
        bad(&|f| f.kv_num_blocks[1] = 4, "kv_num_blocks[1]");
        bad(&|f| f.kv_indices[0] = 7, "outside 0..3");
        bad(&|f| f.kv_indices[1] = f.kv_indices[0], "twice");
        bad(&|f| f.q_indices[0] = 1, "q_indices");
        bad(
            &|f| {
                f.full_kv_num_blocks = Some(vec![1, 0]);
                f.full_kv_indices = Some(vec![0, 1, 2, 0, 1, 2]);
            },
            "both partial",
        );
        bad(
            &|f| f.full_kv_num_blocks = Some(vec![0, 0]),
            "come together",
        );
    }
}
