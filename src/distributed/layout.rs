//! Which rows of a sequence each rank holds: the sequence of `n` rows cut into chunks, in
//! the contiguous layout (rank r holds chunk r of `ranks`) or the zigzag layout (rank r holds
//! chunks r and 2R - 1 - r of 2R, so that under a causal mask every rank has as many visible
//! pairs as the others: ring attention's load balance). Where the chunks do not divide `n`,
//! the first `n % chunks` chunks take one row more (documented in docs/USAGE.md). Pure.

use std::ops::Range;

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

    /// The chunks of `n` rows, in order: R contiguous chunks or 2R zigzag ones.
    pub fn chunks(self, n: usize, ranks: usize) -> Vec<Range<usize>> {
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

    /// The row ranges rank `rank` of `ranks` holds, in the order its local tensors lay them.
    pub fn rows(self, n: usize, ranks: usize, rank: usize) -> Vec<Range<usize>> {
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
}
