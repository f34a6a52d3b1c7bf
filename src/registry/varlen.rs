//! Packed variable-length sequences' rules over a call ([`Varlen`](crate::Varlen)).

use super::modifier::{Modifier, Reference};
use crate::error::Error;
use crate::kernels::hooks;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::VARLEN,
    active: |cfg| cfg.varlen.is_some(),
    check: |cfg| {
        let Some(v) = &cfg.varlen else { return Ok(()) };
        v.validate(cfg.batch, cfg.seq_q, cfg.seq_kv)?;
        if cfg.per_batch_keys() {
            return Err(Error::invalid(
                "seqlens_kv and leftpad_kv must be None in a varlen call (cu_seqlens_kv \
                 gives each sequence's keys), got one of them",
            ));
        }
        Ok(())
    },
    encode: |cfg, p| p.sequences = cfg.varlen.as_ref().map_or(0, |v| v.sequences() as u32),
    reference: Reference::None,
};
