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
