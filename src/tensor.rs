//! Device-resident tensors: a storage buffer, its shape and its element type.

use crate::device::{Context, TrackedBuffer};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result, TensorRole};

/// A tensor in device memory, row-major, of one element type.
///
/// Half-precision tensors hold two elements per 4-byte word (or `array<f16>` where the
/// adapter has `SHADER_F16`: the same bytes); a buffer is padded to a whole word.
#[derive(Debug)]
pub struct Tensor {
    buf: TrackedBuffer,
    shape: Vec<usize>,
    dtype: DType,
    role: Option<TensorRole>,
}

impl Tensor {
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Which result this tensor is (out, lse, dq, ...), for tensors a call created.
    pub fn role(&self) -> Option<TensorRole> {
        self.role
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of device memory the tensor's buffer holds.
    pub fn size_bytes(&self) -> u64 {
        self.buf.buffer.size()
    }

    /// The underlying buffer, for chaining with your own wgpu work.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buf.buffer
    }

    pub(crate) fn with_role(mut self, role: TensorRole) -> Self {
        self.role = Some(role);
        self
    }

    /// How errors name this tensor: its role, or "tensor" and its shape.
    pub(crate) fn describe(&self) -> String {
        match self.role {
            Some(r) => r.to_string(),
            None => format!("tensor of shape {:?}", self.shape),
        }
    }
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

impl Context {
    /// A typed error unless `t` was created by this context (its buffer belongs to this
    /// context's device; another context's buffer would read unrelated memory or fault).
    pub(crate) fn check_owned(&self, t: &Tensor, name: impl FnOnce() -> String) -> Result<()> {
        if t.buf.belongs_to(&self.mem) {
            Ok(())
        } else {
            Err(Error::ForeignTensor { tensor: name() })
        }
    }

    /// Copies host data to a new device tensor of the given shape. `T` is f32, `half::f16`
    /// or `half::bf16`, and the tensor takes that dtype.
    pub fn upload<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let n = shape_elements(shape)?;
        if data.len() != n {
            return Err(Error::invalid(format!(
                "upload: {} values given for shape {shape:?}, which holds {n}",
                data.len()
            )));
        }
        let buf = self.upload_bytes(bytemuck::cast_slice(data), "tensor")?;
        Ok(Tensor {
            buf,
            shape: shape.to_vec(),
            dtype: T::DTYPE,
            role: None,
        })
    }

    /// A new zero-filled f32 device tensor.
    pub fn zeros(&self, shape: &[usize]) -> Result<Tensor> {
        self.zeros_of(shape, DType::F32)
    }

    /// A new zero-filled device tensor of `dtype`.
    pub fn zeros_of(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = shape_elements(shape)?;
        let bytes = dtype
            .buffer_bytes(n as u64)
            .ok_or_else(|| Error::invalid(format!("shape {shape:?} of {dtype} is too large")))?;
        let buf = self.create_storage(bytes, "tensor")?;
        Ok(Tensor {
            buf,
            shape: shape.to_vec(),
            dtype,
            role: None,
        })
    }

    /// A new tensor holding `t` (f32) rounded to `dtype` on the device, to nearest even.
    pub fn cast(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        self.check_owned(t, || t.describe())?;
        if t.dtype != DType::F32 {
            return Err(Error::DType {
                tensor: t.describe(),
                expected: DType::F32,
                got: t.dtype,
            });
        }
        if t.len() > u32::MAX as usize {
            return Err(Error::invalid(format!(
                "cast: {} elements, at most {} per call",
                t.len(),
                u32::MAX
            )));
        }
        let plan = crate::plan::cast(&t.shape, dtype, &self.plan_env());
        let out = self.execute(&plan, &[t])?.pop();
        out.map(|o| Tensor { role: None, ..o })
            .ok_or_else(|| Error::Device("internal: cast plan without output".into()))
    }

    /// Copies a device tensor back to the host as `T`, which must be the tensor's dtype.
    pub fn download<T: Element>(&self, t: &Tensor) -> Result<Vec<T>> {
        self.check_owned(t, || t.describe())?;
        if t.dtype != T::DTYPE {
            return Err(Error::DType {
                tensor: t.describe(),
                expected: t.dtype,
                got: T::DTYPE,
            });
        }
        self.read_buffer::<T>(t.buffer(), t.len())
    }
}
