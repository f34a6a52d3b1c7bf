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
        crate::registry::check_all(self)?;
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
}
