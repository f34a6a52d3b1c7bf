//! A boolean mask over (query row, key) pairs (PyTorch's boolean `attn_mask`): true means the
//! pair takes part. Stored one bit per pair, so that a mask costs 1/32 of an f32 bias.

use crate::error::{Error, Result};

/// A boolean mask `[batch, heads, seq_q, seq_kv]`, row-major, where `batch` is 1 or the call's
/// batch and `heads` is 1 or its heads_q (a dimension of 1 is broadcast). Pair (i, j) of
/// (batch b, query head h) takes part only when its entry is true (and the other masks let
/// it). A row with no true entry gets out 0 and lse -inf (or the sink's lse). In a packed
/// varlen call the rows and keys are the packed ones (batch 1, the totals).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoolMask {
    /// 1 (broadcast) or the call's batch.
    pub batch: usize,
    /// 1 (broadcast) or the call's heads_q.
    pub heads: usize,
    /// The call's seq_q.
    pub seq_q: usize,
    /// The call's seq_kv.
    pub seq_kv: usize,
    /// Entry k (row-major) at bit k % 32 of word k / 32.
    words: Vec<u32>,
}

/// Most entries a mask may hold: the kernels index its bits in 32 bits.
pub const MAX_MASK_ENTRIES: u64 = super::MAX_PAIR_ENTRIES;

impl BoolMask {
    /// A mask of shape `(batch, heads, seq_q, seq_kv)`, entry (b, h, i, j) = `on(b, h, i, j)`.
    pub fn from_fn(
        shape: (usize, usize, usize, usize),
        mut on: impl FnMut(usize, usize, usize, usize) -> bool,
    ) -> BoolMask {
        let mut m = BoolMask::filled(shape, false);
        let (batch, heads, seq_q, seq_kv) = shape;
        let mut k = 0usize;
        for b in 0..batch {
            for h in 0..heads {
                for i in 0..seq_q {
                    for j in 0..seq_kv {
                        if on(b, h, i, j) {
                            m.words[k / 32] |= 1 << (k % 32);
                        }
                        k += 1;
                    }
                }
            }
        }
        m
    }

    /// A mask of shape `(batch, heads, seq_q, seq_kv)` with every entry `value` (edit it with
    /// [`BoolMask::set`]).
    pub fn filled(
        (batch, heads, seq_q, seq_kv): (usize, usize, usize, usize),
        value: bool,
    ) -> BoolMask {
        let n = batch * heads * seq_q * seq_kv;
        let mut words = vec![if value { u32::MAX } else { 0 }; n.div_ceil(32)];
        if value && n % 32 != 0 {
            if let Some(last) = words.last_mut() {
                *last = (1u32 << (n % 32)) - 1;
            }
        }
        BoolMask {
            batch,
            heads,
            seq_q,
            seq_kv,
            words,
        }
    }

    /// Sets entry (b, h, i, j) (of the mask's own dimensions) to `value`.
    pub fn set(&mut self, (b, h, i, j): (usize, usize, usize, usize), value: bool) {
        let k = self.entry(b, h) + (i * self.seq_kv + j) as u64;
        let (w, bit) = ((k / 32) as usize, 1u32 << (k % 32));
        if value {
            self.words[w] |= bit;
        } else {
            self.words[w] &= !bit;
        }
    }

    /// A mask from its entries, row-major over `(batch, heads, seq_q, seq_kv)`;
    /// `Error::InvalidConfig` when their number is not the shape's.
    pub fn from_bools(shape: (usize, usize, usize, usize), entries: &[bool]) -> Result<BoolMask> {
        let (batch, heads, seq_q, seq_kv) = shape;
        let n = [batch, heads, seq_q, seq_kv]
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        if n != Some(entries.len()) {
            return Err(Error::invalid(format!(
                "mask entries must be [batch, heads, seq_q, seq_kv] = [{batch}, {heads}, \
                 {seq_q}, {seq_kv}] = {} values, got {}",
                n.map_or("more than 2^64".to_string(), |n| n.to_string()),
                entries.len()
            )));
        }
        let (hs, bs) = (seq_q * seq_kv, heads * seq_q * seq_kv);
        Ok(BoolMask::from_fn(shape, |b, h, i, j| {
            entries[b * bs + h * hs + i * seq_kv + j]
        }))
    }

    /// True when pair (i, j) of (batch b, query head h) takes part (broadcast dimensions
    /// read their one entry).
    pub fn allows(&self, (b, h, i, j): (usize, usize, usize, usize)) -> bool {
        let k = self.entry(b, h) + (i * self.seq_kv + j) as u64;
        self.words[(k / 32) as usize] >> (k % 32) & 1 == 1
    }

    /// The entry of (b, h)'s pair (0, 0).
    fn entry(&self, b: usize, h: usize) -> u64 {
        let (b, h) = (b.min(self.batch - 1), h.min(self.heads - 1));
        ((b * self.heads + h) * self.seq_q * self.seq_kv) as u64
    }

    /// Entries between one batch's grid and the next, and one head's and the next: 0 along a
    /// broadcast dimension.
    pub fn strides(&self) -> (u64, u64) {
        super::broadcast_strides(self.batch, self.heads, (self.seq_q * self.seq_kv) as u64)
    }

    /// The entries packed 32 to a word (what the kernels read).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Fraction of entries that are true.
    pub fn density(&self) -> f64 {
        let on: u64 = self.words.iter().map(|w| w.count_ones() as u64).sum();
        let n = (self.batch * self.heads * self.seq_q * self.seq_kv).max(1);
        on as f64 / n as f64
    }

    /// Checks the mask against a call of `batch x heads_q`, `seq_q x seq_kv`.
    pub(crate) fn validate(
        &self,
        batch: usize,
        heads_q: usize,
        seq_q: usize,
        seq_kv: usize,
    ) -> Result<()> {
        super::check_pair_tensor(
            "mask",
            (self.batch, self.heads, self.seq_q, self.seq_kv),
            (batch, heads_q, seq_q, seq_kv),
            self.words.len(),
            32,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_strides_and_lookup_agree() {
        let on = |b: usize, h: usize, i: usize, j: usize| (b * 7 + h * 5 + i * 3 + j) % 4 != 1;
        let m = BoolMask::from_fn((2, 3, 5, 9), on);
        assert_eq!(m.words().len(), (2 * 3 * 5 * 9usize).div_ceil(32));
        assert_eq!(m.strides(), (3 * 45, 45));
        for b in 0..2 {
            for h in 0..3 {
                for i in 0..5 {
                    for j in 0..9 {
                        assert_eq!(m.allows((b, h, i, j)), on(b, h, i, j));
                    }
                }
            }
        }
        let entries: Vec<bool> = (0..45).map(|k| k % 3 == 0).collect();
        let shared = BoolMask::from_bools((1, 1, 5, 9), &entries).unwrap();
        assert_eq!(shared.strides(), (0, 0));
        assert!(shared.allows((1, 2, 4, 8)) == entries[44]);
        assert!(shared.validate(4, 8, 5, 9).is_ok());
        assert!(m.validate(2, 3, 5, 9).is_ok());
        assert!(m.validate(3, 3, 5, 9).is_err());
        assert!(m.validate(2, 3, 5, 8).is_err());
        assert!(BoolMask::from_bools((1, 1, 5, 9), &entries[1..]).is_err());
        let mut f = BoolMask::filled((1, 2, 3, 7), true);
        assert!((f.density() - 1.0).abs() < 1e-12);
        f.set((0, 1, 2, 6), false);
        assert!(!f.allows((0, 1, 2, 6)) && f.allows((0, 1, 2, 5)) && f.allows((0, 0, 2, 6)));
        assert_eq!(BoolMask::filled((1, 1, 3, 7), false).density(), 0.0);
    }
}
