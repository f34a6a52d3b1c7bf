//! A block of a larger call (`AttentionConfig::block`) in its steps' parameters: planned for
//! the block's own sizes and tensors, every step then sees the whole call's positions, as the
//! parts of a call cut into binding windows do (split.rs): the causal diagonal and the window
//! aligned in the whole call and moved to the block's numbering, the row and key bases that
//! ALiBi's distances, a user's `score_mod` and `mask_mod`, dropout's random numbers and a
//! block mask read, and the block mask's grid of the whole call.

use super::Plan;
use crate::config::AttentionConfig;
use crate::kernels::Params;

/// Moves `plan` (planned for `cfg`, a block call) to the whole call's positions; nothing for
/// a whole call.
pub(super) fn apply(plan: &mut Plan, cfg: &AttentionConfig) {
    let Some(b) = cfg.block else {
        return;
    };
    let whole = cfg.whole_call();
    let mut band = Params::from_config(&whole);
    band.shift_band(b.q0, b.k0);
    let offset = (whole.causal_offset() + b.q0 as i64 - b.k0 as i64)
        .clamp(i32::MIN as i64, i32::MAX as i64) as i32;
    for s in &mut plan.steps {
        let p = &mut s.params;
        p.causal_offset = offset;
        (p.band_lo, p.band_hi) = (band.band_lo, band.band_hi);
        p.q_base += b.q0 as u32;
        p.kv_base += b.k0 as u32;
        *p = p.with_block_grid(&whole);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Block, Window};
    use crate::dtype::DType;

    #[test]
    fn a_blocks_steps_see_the_whole_calls_diagonal_window_and_bases() {
        // rows 64..96 and keys 32..64 of a causal call of 100 rows over 120 keys, window 10
        let mut cfg = AttentionConfig::new(1, 32, 32, 2, 1, 16);
        cfg.causal = true;
        cfg.window = Window::new(Some(10), None);
        cfg.block = Some(Block {
            whole_seq_q: 100,
            whole_seq_kv: 120,
            q0: 64,
            k0: 32,
        });
        let env = super::super::tests::env(
            crate::kernels::Variant::Blocks,
            crate::dtype::HalfStorage::Packed,
        );
        let plan = super::super::forward(&cfg, DType::F32, &env).unwrap();
        let p = plan.steps[0].params;
        // whole: row i sees keys up to i + 20; block row i is row 64 + i, key j is 32 + j
        assert_eq!(p.causal_offset, 20 + 64 - 32);
        assert_eq!((p.q_base, p.kv_base), (64, 32));
        // the window: keys from i - 10 in the whole numbering, so j >= i + 64 - 32 - 10 + 20
        let whole = cfg.whole_call();
        let mut w = Params::from_config(&whole);
        w.shift_band(64, 32);
        assert_eq!((p.band_lo, p.band_hi), (w.band_lo, w.band_hi));
        assert_ne!(p.band_lo, Params::from_config(&cfg).band_lo);
    }
}
