//! Variable-length sequences, packed: several sequences of different lengths laid end to end
//! with no padding, each attending only within itself (flash-attn's varlen API).

use crate::error::{Error, Result};

/// The sequence boundaries of a packed call. Sequence s holds query rows
/// `cu_seqlens_q[s]..cu_seqlens_q[s + 1]` and keys `cu_seqlens_kv[s]..cu_seqlens_kv[s + 1]`
/// (cumulative lengths, `sequences + 1` entries each, from 0 to the totals). A call with
/// `varlen` is a batch of 1 whose `seq_q` and `seq_kv` are the totals: q is
/// `[total_q, heads_q, head_dim]`, k and v `[total_kv, heads_kv, head_dim]`, lse
/// `[heads_q, total_q]` ([`crate::AttentionConfig::packed`] builds one).
///
/// Within a sequence every mask aligns as in a padded call of that sequence alone: row i of
/// sequence s is `i' = (i - cu_q[s]) + len_kv(s) - len_q(s)` against key `j - cu_kv[s]`
/// (causal, window, ALiBi). A sequence with no keys gives its rows out 0 and lse -inf (or the
/// sink). The block mask and dropout index the packed rows and keys (batch 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Varlen {
    /// Query row offsets: sequence s is rows `cu_seqlens_q[s]..cu_seqlens_q[s + 1]` (length sequences + 1, from 0).
    pub cu_seqlens_q: Vec<u32>,
    /// Key offsets, likewise.
    pub cu_seqlens_kv: Vec<u32>,
}

/// The largest packed total a varlen call takes: the per-sequence alignment shifts the band
/// by up to the totals, which must stay well inside the kernels' i32 offsets (2^30 stands
/// for an unbounded side).
pub const MAX_TOTAL: usize = 1 << 28;

impl Varlen {
    /// Boundaries from per-sequence lengths (`lens_q[s]` rows and `lens_kv[s]` keys).
    pub fn from_lengths(lens_q: &[u32], lens_kv: &[u32]) -> Varlen {
        let cumulative = |lens: &[u32]| {
            std::iter::once(0)
                .chain(lens.iter().scan(0u32, |acc, &n| {
                    *acc = acc.saturating_add(n);
                    Some(*acc)
                }))
                .collect()
        };
        Varlen {
            cu_seqlens_q: cumulative(lens_q),
            cu_seqlens_kv: cumulative(lens_kv),
        }
    }

    /// Number of sequences.
    pub fn sequences(&self) -> usize {
        self.cu_seqlens_q.len().saturating_sub(1)
    }

    /// The sequence holding packed query row `i`.
    pub fn sequence_of_row(&self, i: usize) -> usize {
        self.cu_seqlens_q.partition_point(|&c| c as usize <= i) - 1
    }

    /// Rows and keys of sequence s: `(q_begin, q_end, kv_begin, kv_end)`.
    pub fn bounds(&self, s: usize) -> (usize, usize, usize, usize) {
        (
            self.cu_seqlens_q[s] as usize,
            self.cu_seqlens_q[s + 1] as usize,
            self.cu_seqlens_kv[s] as usize,
            self.cu_seqlens_kv[s + 1] as usize,
        )
    }

    /// Checks the boundaries against a call of `batch`, `seq_q` x `seq_kv` (the totals).
    pub(crate) fn validate(&self, batch: usize, seq_q: usize, seq_kv: usize) -> Result<()> {
        if batch != 1 {
            return Err(Error::invalid(format!(
                "a varlen call packs its sequences into batch 1 (seq_q and seq_kv the totals), got batch = {batch}"
            )));
        }
        if self.cu_seqlens_q.len() < 2 || self.cu_seqlens_q.len() != self.cu_seqlens_kv.len() {
            return Err(Error::invalid(format!(
                "varlen.cu_seqlens_q and cu_seqlens_kv must both hold sequences + 1 >= 2 offsets, got {} and {}",
                self.cu_seqlens_q.len(),
                self.cu_seqlens_kv.len()
            )));
        }
        for (name, cu, total) in [
            ("cu_seqlens_q", &self.cu_seqlens_q, seq_q),
            ("cu_seqlens_kv", &self.cu_seqlens_kv, seq_kv),
        ] {
            if cu[0] != 0 {
                return Err(Error::invalid(format!(
                    "varlen.{name} must start at 0, got {}",
                    cu[0]
                )));
            }
            if let Some(s) = cu.windows(2).position(|w| w[1] < w[0]) {
                return Err(Error::invalid(format!(
                    "varlen.{name} must not decrease, got {name}[{}] = {} after {name}[{s}] = {}",
                    s + 1,
                    cu[s + 1],
                    cu[s]
                )));
            }
            let last = *cu.last().unwrap() as usize;
            if last != total {
                let which = if name == "cu_seqlens_q" {
                    "seq_q"
                } else {
                    "seq_kv"
                };
                return Err(Error::invalid(format!(
                    "varlen.{name} must end at the packed total ({which} = {total}), got {last}"
                )));
            }
            if total > MAX_TOTAL {
                return Err(Error::invalid(format!(
                    "a varlen call's packed totals must be at most {MAX_TOTAL}, got {total} ({name})"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_sequences_and_lookup_agree() {
        let v = Varlen::from_lengths(&[3, 0, 4], &[2, 5, 0]);
        assert_eq!(v.cu_seqlens_q, vec![0, 3, 3, 7]);
        assert_eq!(v.cu_seqlens_kv, vec![0, 2, 7, 7]);
        assert_eq!(v.sequences(), 3);
        let seqs: Vec<usize> = (0..7).map(|i| v.sequence_of_row(i)).collect();
        assert_eq!(seqs, vec![0, 0, 0, 2, 2, 2, 2]);
        assert_eq!(v.bounds(2), (3, 7, 7, 7));
        assert!(v.validate(1, 7, 7).is_ok());
        assert!(v.validate(2, 7, 7).is_err());
        assert!(v.validate(1, 8, 7).is_err());
    }
}
