//! Dropout on the attention probabilities, and the counter-based RNG that decides it.
//!
//! Every kernel (WGSL: `dropout_scale` in shaders/modifiers/dropout.wgsl; CUDA: `dropout_bits`
//! in cuda/modifiers/dropout.cuh) and the f64 reference decide each pair with the same function,
//! [`Dropout::keeps`], so the backward regenerates exactly the forward's mask without storing it
//! and tests can require the kernels' dropped set to equal the reference's.
//!
//! The RNG is Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
//! SC 2011), keyed by the 64-bit `seed`. Pair (query row i, key j) of batch b and query head h
//! takes word `j % 4` of the block at counter
//! `(lo64 = offset + j / 4, c2 = i, c3 = b * heads_q + h)`: a 64-bit position along the stream
//! (advanced by `offset`, as curand's offset) and a 64-bit stream id (row and head). The pair is
//! kept iff that word is at least `threshold = min(round(p * 2^32), 2^32 - 1)`, so each pair is
//! dropped with probability p (to within 2^-32). A caller that draws fresh masks for repeated
//! calls with one seed advances `offset` by at least `ceil(seq_kv / 4)` per call.

/// Dropout of attention probabilities: each (row, key) pair of the softmax is dropped with
/// probability `p`; kept ones scale by `1 / (1 - p)`. The lse returned is that of the
/// undropped softmax (as flash-attn's). `seed` and `offset` choose the mask (see the module).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Probability of dropping a pair, in [0, 1).
    pub p: f32,
    /// Philox key: one seed gives one mask.
    pub seed: u64,
    /// Philox counter offset: advance it between calls that must drop differently.
    pub offset: u64,
}

impl Dropout {
    /// A dropout of probability `p` with its Philox seed and offset.
    pub fn new(p: f32, seed: u64, offset: u64) -> Dropout {
        Dropout { p, seed, offset }
    }

    /// Random words below this drop their pair.
    pub fn threshold(&self) -> u32 {
        let t = (self.p as f64 * 4_294_967_296.0).round();
        t.min(u32::MAX as f64) as u32
    }

    /// What a kept pair's probability is multiplied by: `1 / (1 - p)`, in f32 as the kernels
    /// use it.
    pub fn keep_scale(&self) -> f32 {
        (1.0 / (1.0 - self.p as f64)) as f32
    }

    /// True when pair (query row i, key j) of batch b and query head h (`bh = b * heads_q + h`)
    /// is kept. Indices are the whole call's.
    pub fn keeps(&self, bh: u32, i: u32, j: u32) -> bool {
        let pos = self.offset.wrapping_add((j / 4) as u64);
        let ctr = [pos as u32, (pos >> 32) as u32, i, bh];
        let key = [self.seed as u32, (self.seed >> 32) as u32];
        philox4x32_10(ctr, key)[(j % 4) as usize] >= self.threshold()
    }
}

const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

/// Philox 4x32 with 10 rounds: the block of four random words at counter `ctr` under `key`.
pub fn philox4x32_10(mut ctr: [u32; 4], mut key: [u32; 2]) -> [u32; 4] {
    for _ in 0..10 {
        let p0 = PHILOX_M0 as u64 * ctr[0] as u64;
        let p1 = PHILOX_M1 as u64 * ctr[2] as u64;
        ctr = [
            (p1 >> 32) as u32 ^ ctr[1] ^ key[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ ctr[3] ^ key[1],
            p0 as u32,
        ];
        key = [
            key[0].wrapping_add(PHILOX_W0),
            key[1].wrapping_add(PHILOX_W1),
        ];
    }
    ctr
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors of the Random123 distribution (kat_vectors, philox4x32 10 rounds).
    #[test]
    fn philox_matches_the_published_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn the_kept_fraction_follows_p() {
        for p in [0.1f32, 0.5, 0.9] {
            let d = Dropout::new(p, 0x1234_5678_9abc_def0, 7);
            let n = 40_000u32;
            let kept = (0..n).filter(|&x| d.keeps(x % 3, x / 200, x % 200)).count() as f64;
            let want = (1.0 - p as f64) * n as f64;
            // 5 standard deviations of a binomial count
            let sd = (n as f64 * p as f64 * (1.0 - p as f64)).sqrt();
            assert!(
                (kept - want).abs() < 5.0 * sd,
                "p {p}: kept {kept}, expected {want}"
            );
        }
        let none = Dropout::new(0.0, 1, 2);
        assert!((0..1000).all(|x| none.keeps(0, x, x)));
    }

    #[test]
    fn seed_offset_and_position_change_the_mask() {
        let a = Dropout::new(0.5, 1, 0);
        let mask = |d: &Dropout, bh: u32| (0..256).map(|j| d.keeps(bh, 3, j)).collect::<Vec<_>>();
        let base = mask(&a, 0);
        assert_ne!(base, mask(&Dropout::new(0.5, 2, 0), 0));
        assert_ne!(base, mask(&Dropout::new(0.5, 1, 64), 0));
        assert_ne!(base, mask(&a, 1));
        assert_eq!(base, mask(&a.clone(), 0));
    }
}
