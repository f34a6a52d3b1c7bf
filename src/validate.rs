//! Validation of a call's config, as its own step over the config and the modifiers' registry:
//! the shape, the head dims and the addressable sizes, then every modifier's check in bit
//! order (`registry::check_all`). It sits above both, so that neither imports the other back.

use crate::config::{AttentionConfig, MAX_HEAD_DIM_QK, MAX_HEAD_DIM_V, MAX_KV_SPLITS};
use crate::error::{Error, Result};

impl AttentionConfig {
    /// Checks everything that does not depend on the device.
    pub fn validate(&self) -> Result<()> {
        let dims = [
            ("batch", self.batch),
            ("seq_q", self.seq_q),
            ("seq_kv", self.seq_kv),
            ("heads_q", self.heads_q),
            ("heads_kv", self.heads_kv),
            ("head_dim", self.head_dim),
        ];
        for (name, v) in dims {
            if v == 0 {
                return Err(Error::invalid(format!("{name} must be at least 1, got 0")));
            }
        }
        if self.head_dim > MAX_HEAD_DIM_QK {
            return Err(Error::invalid(format!(
                "head_dim must be in 1..={MAX_HEAD_DIM_QK}, got {}",
                self.head_dim
            )));
        }
        if self.head_dim_v == Some(0) || self.dv() > MAX_HEAD_DIM_V {
            return Err(Error::invalid(format!(
                "head_dim_v (head_dim where it is None) must be in 1..={MAX_HEAD_DIM_V}, got {}",
                self.dv()
            )));
        }
        if let Some(n) = self.kv_splits {
            if n == 0 || n > MAX_KV_SPLITS {
                return Err(Error::invalid(format!(
                    "kv_splits must be in 1..={MAX_KV_SPLITS} (or None: the heuristic), got {n}"
                )));
            }
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(Error::invalid(format!(
                "heads_q must be a multiple of heads_kv (GQA/MQA), got heads_q = {} and heads_kv = {}",
                self.heads_q, self.heads_kv
            )));
        }
        match self.block {
            // the modifiers' values are the whole call's (a block mask's grid, ...)
            Some(b) => self.check_block(b)?,
            None => crate::registry::check_all(self)?,
        }
        if let Some(s) = self.softmax_scale {
            if !s.is_finite() {
                return Err(Error::invalid(format!(
                    "softmax_scale must be finite, got {s}"
                )));
            }
        }
        // Kernels index with u32; each tensor must stay addressable.
        // Checked: the product of four dimensions can overflow any integer type.
        let limit = u32::MAX as u64;
        for (name, shape) in [
            ("q", self.q_shape()),
            ("k", self.kv_shape()),
            ("v", self.v_shape()),
            ("out", self.out_shape()),
        ] {
            let n = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
            match n {
                Some(n) if n <= limit => {}
                Some(n) => {
                    return Err(Error::invalid(format!(
                        "{name} {shape:?} has {n} elements; at most {limit} are addressable by the kernels"
                    )))
                }
                None => {
                    return Err(Error::invalid(format!(
                        "{name} {shape:?} has more elements than fit in 64 bits; at most {limit} are addressable by the kernels"
                    )))
                }
            }
        }
        Ok(())
    }

    /// A block call ([`crate::Block`]): its ranges within the whole call, the whole call
    /// valid, and none of what a block does not take.
    fn check_block(&self, b: crate::Block) -> Result<()> {
        for (what, first, len, whole, field) in [
            (
                "rows",
                b.q0,
                self.seq_q,
                b.whole_seq_q,
                "q0 + seq_q <= whole_seq_q",
            ),
            (
                "keys",
                b.k0,
                self.seq_kv,
                b.whole_seq_kv,
                "k0 + seq_kv <= whole_seq_kv",
            ),
        ] {
            if first.checked_add(len).is_none_or(|end| end > whole) {
                return Err(Error::invalid(format!(
                    "block: the {what} {first}..{} lie outside the whole call's {whole}                      ({field})",
                    first.saturating_add(len)
                )));
            }
        }
        let refused = [
            (
                self.bias.is_some(),
                "a bias (its tensor is the block call's shape)",
            ),
            (
                self.mask.is_some(),
                "a boolean mask (its tensor is the block call's shape)",
            ),
            (self.seqlens_kv.is_some(), "per-batch key lengths"),
            (self.varlen.is_some(), "varlen (packed sequences)"),
            (self.paged.is_some(), "a paged KV cache"),
            (self.values_in_keys, "a latent cache"),
            (self.leftpad_kv.is_some(), "left-padded caches"),
            (
                self.score_mod
                    .as_ref()
                    .is_some_and(|m| m.trainable().is_some()),
                "a trainable captured tensor",
            ),
        ];
        if let Some((_, what)) = refused.iter().find(|(on, _)| *on) {
            return Err(Error::Unsupported {
                feature: format!("a block of a call with {what}"),
                backend: crate::Backend::Wgpu,
                reason: "a block call takes the position-aware masks and modifiers (causal, \
                         window, ALiBi, score_mod, mask_mod, block masks, dropout, softcap, \
                         sinks); run this call whole"
                    .into(),
            });
        }
        self.whole_call().validate()
    }
}
