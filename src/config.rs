//! What the caller asks for: shapes, masking, scale and algorithm, and their validation.

use crate::error::{Error, Result};

/// Largest head dimension the kernels are built for.
pub const MAX_HEAD_DIM: usize = 256;

/// Which implementation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// FlashAttention: Q/K/V tiles in workgroup memory, online softmax, no seq_q x seq_kv buffer.
    #[default]
    Tiled,
    /// Standard attention: S = scale * Q K^T and P = softmax(S) materialized in global memory.
    Naive,
}

/// Shapes and options of one attention call.
///
/// Layouts (row-major): q and out are `[batch, seq_q, heads_q, head_dim]`, k and v are
/// `[batch, seq_kv, heads_kv, head_dim]`, lse is `[batch, heads_q, seq_q]` (natural log).
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionConfig {
    pub batch: usize,
    pub seq_q: usize,
    pub seq_kv: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    /// Bottom-right aligned causal mask: query i sees key j iff `j <= i + seq_kv - seq_q`.
    pub causal: bool,
    /// `None` means `1 / sqrt(head_dim)`.
    pub softmax_scale: Option<f32>,
    pub algorithm: Algorithm,
}

impl AttentionConfig {
    pub fn new(
        batch: usize,
        seq_q: usize,
        seq_kv: usize,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
    ) -> Self {
        Self {
            batch,
            seq_q,
            seq_kv,
            heads_q,
            heads_kv,
            head_dim,
            causal: false,
            softmax_scale: None,
            algorithm: Algorithm::default(),
        }
    }

    pub fn scale(&self) -> f32 {
        self.softmax_scale
            .unwrap_or_else(|| 1.0 / (self.head_dim.max(1) as f32).sqrt())
    }

    /// Query heads per kv head.
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv.max(1)
    }

    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.seq_q, self.heads_q, self.head_dim]
    }

    pub fn kv_shape(&self) -> [usize; 4] {
        [self.batch, self.seq_kv, self.heads_kv, self.head_dim]
    }

    pub fn lse_shape(&self) -> [usize; 3] {
        [self.batch, self.heads_q, self.seq_q]
    }

    /// Key offset of the causal diagonal: query i sees keys `j <= i + causal_offset()`.
    pub fn causal_offset(&self) -> i64 {
        self.seq_kv as i64 - self.seq_q as i64
    }

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
        if self.head_dim > MAX_HEAD_DIM {
            return Err(Error::invalid(format!(
                "head_dim must be in 1..={MAX_HEAD_DIM}, got {}",
                self.head_dim
            )));
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(Error::invalid(format!(
                "heads_q must be a multiple of heads_kv (GQA/MQA), got heads_q = {} and heads_kv = {}",
                self.heads_q, self.heads_kv
            )));
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
        for (name, shape) in [("q", self.q_shape()), ("k/v", self.kv_shape())] {
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

    pub(crate) fn lse_len(&self) -> usize {
        self.lse_shape().iter().product()
    }
}
