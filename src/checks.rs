//! Argument checks shared by every entry point: tensor shapes and dtypes, host slice lengths
//! and lse values. Each failure names the tensor, what was expected and what was given.

use crate::config::AttentionConfig;
use crate::dtype::DType;
use crate::error::{Error, Result, TensorRole};

/// A tensor of any backend, its owner checked: the shape the config implies, the call's dtype.
pub(crate) fn check_meta(
    role: TensorRole,
    shape: &[usize],
    got: DType,
    expected: &[usize],
    dtype: DType,
) -> Result<()> {
    if shape != expected {
        return Err(Error::Shape {
            tensor: role,
            expected: expected.to_vec(),
            got: shape.to_vec(),
        });
    }
    if got != dtype {
        return Err(Error::DType {
            tensor: role.to_string(),
            expected: dtype,
            got,
        });
    }
    Ok(())
}

/// A host slice holds exactly the elements of `expected`.
pub(crate) fn check_slice(role: TensorRole, len: usize, expected: &[usize]) -> Result<()> {
    let n: usize = expected.iter().product();
    if len != n {
        return Err(Error::SliceLength {
            tensor: role,
            expected: n,
            got: len,
            shape: format!("{expected:?}"),
        });
    }
    Ok(())
}

/// lse values are what a forward can produce: finite, -inf (a row that sees no key) or NaN (a
/// row that saw a NaN; its gradients come back NaN). +inf cannot come from a forward and would
/// silently zero the row's gradients, so it is refused.
pub(crate) fn check_lse_values(lse: &[f32]) -> Result<()> {
    if let Some(index) = lse.iter().position(|x| *x == f32::INFINITY) {
        return Err(Error::InvalidValue {
            tensor: TensorRole::Lse,
            index,
            value: lse[index],
            expected: "a finite value, -inf (a row that sees no key) or NaN (a row that saw a \
                       NaN), as the forward returns it"
                .into(),
        });
    }
    Ok(())
}

/// The checks of a forward from host slices, on every backend: the config, then q, k and v.
pub(crate) fn check_forward_host<T>(
    cfg: &AttentionConfig,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<()> {
    cfg.validate()?;
    check_slice(TensorRole::Q, q.len(), &cfg.q_shape())?;
    check_slice(TensorRole::K, k.len(), &cfg.kv_shape())?;
    check_slice(TensorRole::V, v.len(), &cfg.v_shape())
}

/// The checks of a backward from host slices, on every backend: the forward's, then out, lse
/// (lengths and values) and d_out.
pub(crate) fn check_backward_host<T>(
    cfg: &AttentionConfig,
    (q, k, v): (&[T], &[T], &[T]),
    out: &[T],
    lse: &[f32],
    d_out: &[T],
) -> Result<()> {
    check_forward_host(cfg, q, k, v)?;
    check_slice(TensorRole::Out, out.len(), &cfg.out_shape())?;
    check_slice(TensorRole::Lse, lse.len(), &cfg.lse_shape())?;
    check_slice(TensorRole::DOut, d_out.len(), &cfg.out_shape())?;
    check_lse_values(lse)
}

/// What a merge checks of one shard: out's shape and dtype, lse's shape and dtype.
pub(crate) struct ShardMeta<'a> {
    pub out: (&'a [usize], DType),
    pub lse: (&'a [usize], DType),
}

/// Every shard's out is `[batch, seq_q, heads_q, head_dim]` (shard 0's shape) in shard 0's
/// dtype, every lse f32 `[batch, heads_q, seq_q]`; at least one shard. Returns out's shape and
/// dtype; errors name the shard, what was expected and what was given.
pub(crate) fn check_shards(shards: &[ShardMeta<'_>]) -> Result<([usize; 4], DType)> {
    let Some(first) = shards.first() else {
        return Err(Error::invalid(
            "merge: at least one shard (out, lse) is needed, got none",
        ));
    };
    let shape: [usize; 4] = first.out.0.try_into().map_err(|_| {
        Error::invalid(format!(
            "merge: shard 0's out has shape {:?}, expected 4 dimensions [batch, seq_q, \
             heads_q, head_dim]",
            first.out.0
        ))
    })?;
    shape_elements(&shape)?;
    if shape[3] > crate::MAX_HEAD_DIM_V {
        return Err(Error::invalid(format!(
            "merge: head_dim (out's last dimension) is {}, at most {} (MAX_HEAD_DIM_V)",
            shape[3],
            crate::MAX_HEAD_DIM_V
        )));
    }
    let dtype = first.out.1;
    let [batch, seq_q, heads, _] = shape;
    let lse_shape = [batch, heads, seq_q];
    for (i, s) in shards.iter().enumerate() {
        if s.out.0 != shape {
            return Err(Error::invalid(format!(
                "merge: shard {i}'s out has shape {:?}, expected {shape:?} (shard 0's)",
                s.out.0
            )));
        }
        if s.out.1 != dtype {
            return Err(Error::DType {
                tensor: format!("shard {i}'s out"),
                expected: dtype,
                got: s.out.1,
            });
        }
        if s.lse.0 != lse_shape {
            return Err(Error::invalid(format!(
                "merge: shard {i}'s lse has shape {:?}, expected {lse_shape:?} ([batch, \
                 heads_q, seq_q] of out {shape:?})",
                s.lse.0
            )));
        }
        if s.lse.1 != DType::F32 {
            return Err(Error::DType {
                tensor: format!("shard {i}'s lse"),
                expected: DType::F32,
                got: s.lse.1,
            });
        }
    }
    Ok((shape, dtype))
}

/// Element count of a shape: every dimension at least 1, and the product must fit.
pub(crate) fn shape_elements(shape: &[usize]) -> Result<usize> {
    if shape.is_empty() || shape.contains(&0) {
        return Err(Error::invalid(format!(
            "a tensor needs a non-empty shape with no zero dimension, got {shape:?}"
        )));
    }
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            Error::invalid(format!(
                "shape {shape:?} has more elements than fit in usize"
            ))
        })
}
