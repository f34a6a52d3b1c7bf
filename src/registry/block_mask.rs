//! The block mask's rules over a call ([`BlockMask`](crate::BlockMask)); its geometry is
//! `Params::with_block_grid`'s, from the whole call.

use super::modifier::{Modifier, Reference};
use crate::kernels::hooks;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::BLOCKS,
    active: |cfg| cfg.block_mask.is_some(),
    check: |cfg| match &cfg.block_mask {
        Some(m) => {
            m.validate(cfg.batch, cfg.heads_q, cfg.seq_q, cfg.seq_kv)?;
            m.check_mask(cfg.mask_mod.as_ref())
        }
        None => Ok(()),
    },
    encode: super::modifier::no_params,
    reference: Reference::None,
};
