//! A paged K/V layout's rules over a call ([`PagedKv`](crate::PagedKv)): the block table
//! follows the boolean mask's and the bias's words in the pair data.

use super::modifier::{Modifier, Reference};
use crate::error::Error;
use crate::kernels::hooks;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::PAGED,
    active: |cfg| cfg.paged.is_some(),
    check: |cfg| {
        let Some(p) = &cfg.paged else { return Ok(()) };
        p.check(cfg.batch, cfg.seq_kv)?;
        if cfg.varlen.is_some() {
            return Err(Error::invalid(
                "paged: a paged call is a padded batch of sequences; varlen must be None",
            ));
        }
        Ok(())
    },
    encode: |cfg, p| {
        p.pages_base = (cfg.mask.as_ref().map_or(0, |m| m.words().len())
            + cfg.bias.as_ref().map_or(0, |b| b.words().len())) as u32;
        p.page_size = cfg.paged.as_ref().map_or(1, |p| p.page_size as u32);
        p.pages_per_seq = cfg.paged.as_ref().map_or(1, |p| p.pages_per_seq as u32);
    },
    reference: Reference::None,
};
