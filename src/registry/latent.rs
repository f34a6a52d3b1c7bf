//! An MLA latent cache's rule over a call ([`AttentionConfig::values_in_keys`]): the values
//! are the first `head_dim_v` dims of each key row, so they cannot be wider than the keys.

use super::modifier::{Modifier, Reference};
use crate::error::Error;
use crate::kernels::hooks;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::LATENT,
    active: |cfg| cfg.values_in_keys,
    check: |cfg| {
        if cfg.values_in_keys && cfg.dv() > cfg.head_dim {
            return Err(Error::invalid(format!(
                "values_in_keys: the values are the first head_dim_v dims of each key row, so \
                 head_dim_v must be at most head_dim ({}), got {}",
                cfg.head_dim,
                cfg.dv()
            )));
        }
        Ok(())
    },
    encode: |_, _| {},
    reference: Reference::None,
};
