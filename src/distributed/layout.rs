//! Which rows of a sequence each rank holds: the sequence of `n` rows cut into chunks, in
//! the contiguous layout (rank r holds chunk r of `ranks`) or the zigzag layout (rank r holds
//! chunks r and 2R - 1 - r of 2R, so that under a causal mask every rank has as many visible
//! pairs as the others: ring attention's load balance). Where the chunks do not divide `n`,
//! the first `n % chunks` chunks take one row more (documented in docs/USAGE.md). Pure; and
//! [`take_rows`], a rank's rows of a whole tensor.

use std::ops::Range;

use crate::error::{Error, Result};

/// How a sequence is spread over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Rank r holds rows `r * n / R ..`: chunk r of R (non-causal calls).
    Contiguous,
    /// Rank r holds chunks r and 2R - 1 - r of 2R, in that order: under a causal mask each
    /// rank then sees the same number of pairs (the early chunk's few and the late chunk's
    /// many).
    Zigzag,
}

impl Layout {
    /// The layout ring attention uses for a call: zigzag where the call is causal, contiguous
    /// otherwise.
    pub fn for_causal(causal: bool) -> Layout {
        if causal {
            Layout::Zigzag
        } else {
            Layout::Contiguous
        }
    }

    /// The chunks of `n` rows, in order: R contiguous chunks or 2R zigzag ones (none for no
    /// ranks).
    pub fn chunks(self, n: usize, ranks: usize) -> Vec<Range<usize>> {
        if ranks == 0 {
            return Vec::new();
        }
        let count = match self {
            Layout::Contiguous => ranks,
            Layout::Zigzag => 2 * ranks,
        };
        let (base, extra) = (n / count, n % count);
        let mut at = 0;
        (0..count)
            .map(|c| {
                let len = base + usize::from(c < extra);
                let r = at..at + len;
                at += len;
                r
            })
            .collect()
    }

    /// The row ranges rank `rank` of `ranks` holds, in the order its local tensors lay them
    /// (none for a rank outside the ring, `rank >= ranks`).
    pub fn rows(self, n: usize, ranks: usize, rank: usize) -> Vec<Range<usize>> {
        if rank >= ranks {
            return Vec::new();
        }
        let chunks = self.chunks(n, ranks);
        match self {
            Layout::Contiguous => vec![chunks[rank].clone()],
            Layout::Zigzag => vec![chunks[rank].clone(), chunks[2 * ranks - 1 - rank].clone()],
        }
    }

    /// Rows rank `rank` holds in all.
    pub fn local_len(self, n: usize, ranks: usize, rank: usize) -> usize {
        self.rows(n, ranks, rank).iter().map(|r| r.len()).sum()
    }
}

/// The rows `ranges` of each batch of a `[batch, n, width]` tensor (`width` the elements of a
/// row: heads times head dim), concatenated batch by batch: a rank's part of a whole tensor,
/// with `ranges` its `ContextParallel::local_rows` (what `forward` and `backward` take), or a
/// shard's keys for `decode_sharded`. A `x` of another length, or a range past `n`, is a
/// typed error naming it.
pub fn take_rows<T: Copy>(
    x: &[T],
    (batch, n, width): (usize, usize, usize),
    ranges: &[Range<usize>],
) -> Result<Vec<T>> {
    let want = batch.checked_mul(n).and_then(|bn| bn.checked_mul(width));
    if want != Some(x.len()) {
        return Err(Error::invalid(format!(
            "take_rows: x must hold batch * n * width = {batch} * {n} * {width} elements, got {}",
            x.len()
        )));
    }
    if let Some(r) = ranges.iter().find(|r| r.start > r.end || r.end > n) {
        return Err(Error::invalid(format!(
            "take_rows: each range must lie within 0..{n} (n), got {r:?}"
        )));
    }
    Ok(rows_of(x, (batch, n, width), ranges))
}

/// [`take_rows`] without its checks, for callers that made the shapes.
pub(super) fn rows_of<T: Copy>(
    x: &[T],
    (batch, n, width): (usize, usize, usize),
    ranges: &[Range<usize>],
) -> Vec<T> {
    let mut out = Vec::with_capacity(batch * width * ranges.iter().map(|r| r.len()).sum::<usize>());
    for b in 0..batch {
        for r in ranges {
            out.extend_from_slice(&x[(b * n + r.start) * width..(b * n + r.end) * width]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_held_once_and_the_first_chunks_take_the_remainder() {
        for (n, ranks) in [(8192, 2), (1000, 4), (7, 4), (13, 3), (3, 4)] {
            for layout in [Layout::Contiguous, Layout::Zigzag] {
                let mut seen = vec![0u32; n];
                for r in 0..ranks {
                    for range in layout.rows(n, ranks, r) {
                        range.for_each(|i| seen[i] += 1);
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "{layout:?} {n} over {ranks}");
                let lens: Vec<usize> = layout.chunks(n, ranks).iter().map(|c| c.len()).collect();
                assert!(
                    lens.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1),
                    "{lens:?}"
                );
            }
        }
        assert_eq!(Layout::Zigzag.rows(16, 4, 1), vec![2..4, 12..14]);
        assert_eq!(Layout::Contiguous.rows(10, 4, 3), vec![8..10]);
    }

    #[test]
    fn zigzag_gives_every_rank_the_same_causal_work() {
        // visible pairs of a rank's rows under a causal mask: row i sees i + 1 keys
        let n = 4096;
        for ranks in [2, 4, 8] {
            let work: Vec<usize> = (0..ranks)
                .map(|r| {
                    Layout::Zigzag
                        .rows(n, ranks, r)
                        .into_iter()
                        .flatten()
                        .map(|i| i + 1)
                        .sum()
                })
                .collect();
            let (lo, hi) = (work.iter().min().unwrap(), work.iter().max().unwrap());
            assert_eq!(lo, hi, "{ranks} ranks: {work:?}");
        }
    }

    #[test]
    fn a_ranks_rows_are_taken_batch_by_batch_and_bad_arguments_are_typed_errors() {
        // [2 batches, 6 rows, width 2]: element = batch * 100 + row * 10 + column
        let x: Vec<u32> = (0..2)
            .flat_map(|b| (0..6).flat_map(move |r| (0..2).map(move |c| b * 100 + r * 10 + c)))
            .collect();
        let rows = Layout::Zigzag.rows(6, 2, 0); // chunks 0 and 3 of 4: rows 0..2, 5..6
        assert_eq!(rows, vec![0..2, 5..6]);
        assert_eq!(
            take_rows(&x, (2, 6, 2), &rows).unwrap(),
            vec![0, 1, 10, 11, 50, 51, 100, 101, 110, 111, 150, 151]
        );
        let short = take_rows(&x[1..], (2, 6, 2), &rows)
            .unwrap_err()
            .to_string();
        assert!(short.contains("2 * 6 * 2 elements, got 23"), "{short}");
        let past = take_rows(&x, (2, 6, 2), &[0..1, 4..7])
            .unwrap_err()
            .to_string();
        assert!(past.contains("within 0..6 (n), got 4..7"), "{past}");
        let huge = take_rows(&x, (usize::MAX, 2, 2), &[])
            .unwrap_err()
            .to_string();
        assert!(huge.contains("elements, got 24"), "{huge}");
        // no ranks, or a rank outside the ring: no rows, no panic
        assert!(Layout::Zigzag.chunks(6, 0).is_empty());
        assert!(Layout::Contiguous.rows(6, 2, 2).is_empty());
    }
}
