//! Argument checks shared by every entry point: tensor shapes and dtypes, host slice lengths
//! and lse values. Each failure names the tensor, what was expected and what was given.

use crate::device::Context;
use crate::dtype::DType;
use crate::error::{Error, Result, TensorRole};
use crate::tensor::Tensor;

/// A device tensor belongs to `ctx`, has the shape the config implies and the call's dtype.
pub(crate) fn check_tensor(
    ctx: &Context,
    role: TensorRole,
    t: &Tensor,
    expected: &[usize],
    dtype: DType,
) -> Result<()> {
    ctx.check_owned(t, || role.to_string())?;
    if t.shape() != expected {
        return Err(Error::Shape {
            tensor: role,
            expected: expected.to_vec(),
            got: t.shape().to_vec(),
        });
    }
    if t.dtype() != dtype {
        return Err(Error::DType {
            tensor: role.to_string(),
            expected: dtype,
            got: t.dtype(),
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

/// lse values are finite or -inf (a row that sees no key).
pub(crate) fn check_lse_values(lse: &[f32]) -> Result<()> {
    if let Some(x) = lse.iter().find(|x| x.is_nan() || **x == f32::INFINITY) {
        return Err(Error::invalid(format!(
            "lse must be finite or -inf (a row that sees no key), got {x}"
        )));
    }
    Ok(())
}
