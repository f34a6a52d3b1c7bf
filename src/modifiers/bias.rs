//! An additive bias over (query row, key) pairs (PyTorch's float `attn_mask`, relative
//! position biases, learned score offsets), with an optional gradient.

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// A bias `[batch, heads, seq_q, seq_kv]`, row-major, in one of the dtypes the inputs take,
/// where `batch` is 1 or the call's batch and `heads` is 1 or its heads_q (a dimension of 1
/// is broadcast). Entry (b, h, i, j) is added to the scaled score of pair (i, j) of (batch b,
/// query head h) after the softcap and ALiBi, before masking and softmax. A -inf entry hides
/// its pair; NaN and +inf are refused. The call's q, k and v must share the bias's dtype.
/// In a packed varlen call the rows and keys are the packed ones (batch 1, the totals).
///
/// With `grad`, the backward also returns `d_bias` (the gradient of the loss with respect to
/// the bias), of the bias's own shape and dtype: summed over the dimensions it broadcasts,
/// in a fixed order (deterministic, no atomics).
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreBias {
    /// 1 (broadcast over the batch) or the call's batch.
    pub batch: usize,
    /// 1 (broadcast over the heads) or the call's heads_q.
    pub heads: usize,
    /// The call's seq_q.
    pub seq_q: usize,
    /// The call's seq_kv.
    pub seq_kv: usize,
    /// Whether the backward returns `d_bias` (`Gradients::d_bias`).
    pub grad: bool,
    dtype: DType,
    /// The entries in `dtype`'s storage: one per word (f32) or two (f16, bf16; entry k in the
    /// low half of word k / 2 when k is even).
    words: Vec<u32>,
}

impl ScoreBias {
    /// A bias of shape `(batch, heads, seq_q, seq_kv)` from its entries, row-major, in `T`
    /// (the dtype of the calls it joins). `Error::InvalidConfig` when their number is not the
    /// shape's or an entry is NaN or +inf.
    pub fn new<T: Element>(shape: (usize, usize, usize, usize), values: &[T]) -> Result<ScoreBias> {
        let (batch, heads, seq_q, seq_kv) = shape;
        let n = [batch, heads, seq_q, seq_kv]
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        if n != Some(values.len()) {
            return Err(Error::invalid(format!(
                "bias entries must be [batch, heads, seq_q, seq_kv] = [{batch}, {heads}, \
                 {seq_q}, {seq_kv}] = {} values, got {}",
                n.map_or("more than 2^64".to_string(), |n| n.to_string()),
                values.len()
            )));
        }
        if let Some((i, x)) = values
            .iter()
            .map(|v| v.to_f32())
            .enumerate()
            .find(|(_, x)| x.is_nan() || *x == f32::INFINITY)
        {
            return Err(Error::invalid(format!(
                "bias entries must be finite or -inf (which hides the pair), got {x} at index {i}"
            )));
        }
        let words = match T::DTYPE {
            DType::F32 => bytemuck::cast_slice::<T, u32>(values).to_vec(),
            _ => bytemuck::cast_slice::<T, u16>(values)
                .chunks(2)
                .map(|c| c[0] as u32 | (c.get(1).copied().unwrap_or(0) as u32) << 16)
                .collect(),
        };
        Ok(ScoreBias {
            batch,
            heads,
            seq_q,
            seq_kv,
            grad: false,
            dtype: T::DTYPE,
            words,
        })
    }

    /// A bias of shape `(batch, heads, seq_q, seq_kv)` with entry (b, h, i, j) =
    /// `value(b, h, i, j)`; errors as [`ScoreBias::new`].
    pub fn from_fn<T: Element>(
        shape: (usize, usize, usize, usize),
        mut value: impl FnMut(usize, usize, usize, usize) -> T,
    ) -> Result<ScoreBias> {
        let (batch, heads, seq_q, seq_kv) = shape;
        let mut values = Vec::with_capacity(batch * heads * seq_q * seq_kv);
        for b in 0..batch {
            for h in 0..heads {
                for i in 0..seq_q {
                    for j in 0..seq_kv {
                        values.push(value(b, h, i, j));
                    }
                }
            }
        }
        ScoreBias::new(shape, &values)
    }

    /// The same bias in `T` (rounded to nearest even; `grad` kept), for calls in `T`.
    pub fn cast<T: Element>(&self) -> Result<ScoreBias> {
        let shape = (self.batch, self.heads, self.seq_q, self.seq_kv);
        let mut b = ScoreBias::from_fn(shape, |b, h, i, j| T::from_f32(self.value((b, h, i, j))))?;
        b.grad = self.grad;
        Ok(b)
    }

    /// The same bias, asking the backward for `d_bias`.
    pub fn with_grad(mut self) -> ScoreBias {
        self.grad = true;
        self
    }

    /// The entries' dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape `[batch, heads, seq_q, seq_kv]` (also `d_bias`'s).
    pub fn shape(&self) -> [usize; 4] {
        [self.batch, self.heads, self.seq_q, self.seq_kv]
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    /// True when the bias has no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entry (b, h, i, j) as f32 (exact); broadcast dimensions read their one entry.
    pub fn value(&self, (b, h, i, j): (usize, usize, usize, usize)) -> f32 {
        let (b, h) = (b.min(self.batch - 1), h.min(self.heads - 1));
        let k = ((b * self.heads + h) * self.seq_q + i) * self.seq_kv + j;
        match self.dtype {
            DType::F32 => f32::from_bits(self.words[k]),
            half_type => {
                let bits = (self.words[k / 2] >> (16 * (k % 2))) as u16;
                match half_type {
                    DType::F16 => half::f16::from_bits(bits).to_f32(),
                    _ => half::bf16::from_bits(bits).to_f32(),
                }
            }
        }
    }

    /// Entries between one batch's grid and the next, and one head's and the next: 0 along a
    /// broadcast dimension.
    pub fn strides(&self) -> (u64, u64) {
        super::broadcast_strides(self.batch, self.heads, (self.seq_q * self.seq_kv) as u64)
    }

    /// The entries in their dtype's storage, as 32-bit words (what the kernels read).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Checks the bias against a call of `batch x heads_q`, `seq_q x seq_kv`.
    pub(crate) fn validate(
        &self,
        batch: usize,
        heads_q: usize,
        seq_q: usize,
        seq_kv: usize,
    ) -> Result<()> {
        super::check_pair_tensor(
            "bias",
            (self.batch, self.heads, self.seq_q, self.seq_kv),
            (batch, heads_q, seq_q, seq_kv),
            self.words.len(),
            4 / self.dtype.size_bytes() as u64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_in_every_dtype() {
        let f = |b: usize, h: usize, i: usize, j: usize| {
            (b * 7 + h * 5 + i * 3 + j) as f32 * 0.25 - 3.0
        };
        let shape = (2, 3, 5, 7);
        let b32 = ScoreBias::from_fn(shape, f).unwrap();
        let b16 =
            ScoreBias::from_fn(shape, |b, h, i, j| half::f16::from_f32(f(b, h, i, j))).unwrap();
        let bb =
            ScoreBias::from_fn(shape, |b, h, i, j| half::bf16::from_f32(f(b, h, i, j))).unwrap();
        assert_eq!(b32.words().len(), 210);
        assert_eq!(b16.words().len(), 105);
        for b in 0..2 {
            for h in 0..3 {
                for i in 0..5 {
                    for j in 0..7 {
                        let x = f(b, h, i, j);
                        assert_eq!(b32.value((b, h, i, j)), x);
                        assert_eq!(b16.value((b, h, i, j)), x);
                        assert_eq!(bb.value((b, h, i, j)), x);
                    }
                }
            }
        }
        assert_eq!(b32.strides(), (105, 35));
        let shared = ScoreBias::new(
            (1, 1, 2, 3),
            &[1.0f32, 2.0, 3.0, 4.0, 5.0, f32::NEG_INFINITY],
        )
        .unwrap();
        assert_eq!(shared.strides(), (0, 0));
        assert_eq!(shared.value((3, 2, 1, 1)), 5.0);
        assert!(shared.validate(4, 8, 2, 3).is_ok());
        assert!(shared.validate(4, 8, 2, 4).is_err());
        assert!(b32.validate(3, 3, 5, 7).is_err());
        assert!(ScoreBias::new((1, 1, 2, 3), &[0.0f32; 5]).is_err());
        assert!(ScoreBias::new((1, 1, 1, 2), &[0.0f32, f32::NAN]).is_err());
        assert!(ScoreBias::new((1, 1, 1, 2), &[f32::INFINITY, 0.0]).is_err());
        assert!(!shared.grad && shared.clone().with_grad().grad);
    }
}
