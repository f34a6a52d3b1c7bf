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
    buf: Storage,
    /// Byte offset of element 0 in the buffer (a wrapped buffer's view; 0 otherwise).
    offset: u64,
    shape: Vec<usize>,
    dtype: DType,
    role: Option<TensorRole>,
}

/// A tensor's buffer: made (and counted) by the context, or a caller's, wrapped without a copy
/// ([`Context::tensor_from_buffer`]), tagged with the context it was wrapped for.
#[derive(Debug)]
enum Storage {
    Owned(TrackedBuffer),
    Wrapped {
        buffer: wgpu::Buffer,
        owner: std::sync::Arc<crate::device::buffers::MemTracker>,
    },
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

    /// Bytes of device memory the tensor takes: its buffer's, or a wrapped view's (its
    /// elements, padded to a whole 4-byte word).
    pub fn size_bytes(&self) -> u64 {
        match &self.buf {
            Storage::Owned(b) => b.buffer.size(),
            Storage::Wrapped { .. } => self
                .dtype
                .buffer_bytes(self.len() as u64)
                .unwrap_or(u64::MAX),
        }
    }

    /// The underlying buffer, for chaining with your own wgpu work; the tensor starts at
    /// [`offset`](Tensor::offset) in it.
    pub fn buffer(&self) -> &wgpu::Buffer {
        match &self.buf {
            Storage::Owned(b) => &b.buffer,
            Storage::Wrapped { buffer, .. } => buffer,
        }
    }

    /// Byte offset of element 0 in [`buffer`](Tensor::buffer): 0 unless the tensor wraps a
    /// caller's buffer at an offset.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The byte window of the buffer the tensor covers, where it is not the whole buffer
    /// (a wrapped view).
    pub(crate) fn view(&self) -> Option<crate::plan::Window> {
        match &self.buf {
            Storage::Owned(_) => None,
            Storage::Wrapped { .. } => Some(crate::plan::Window {
                offset: self.offset,
                size: self.size_bytes(),
            }),
        }
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
        let mine = match &t.buf {
            Storage::Owned(b) => b.belongs_to(&self.mem),
            Storage::Wrapped { owner, .. } => std::sync::Arc::ptr_eq(owner, &self.mem),
        };
        if mine {
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
            buf: Storage::Owned(buf),
            offset: 0,
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
            buf: Storage::Owned(buf),
            offset: 0,
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
        self.read_buffer_at::<T>(t.buffer(), t.offset, t.len())
    }

    /// Wraps `len(shape)` elements of `dtype` in a buffer you made on this context's device,
    /// from byte `offset`, as a tensor, with no copy: the calls read (and write) it in place.
    /// `strides` (in elements; `None`: row-major) must be the row-major ones for now:
    /// strided views are `Unsupported`. The buffer needs `STORAGE` usage (and `COPY_SRC` to be
    /// downloaded); `offset` must be a multiple of the device's
    /// `min_storage_buffer_offset_alignment` (it is bound from there); the view must lie within
    /// the buffer. Each is a typed error naming what was expected and given.
    pub fn tensor_from_buffer(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        shape: &[usize],
        strides: Option<&[usize]>,
        dtype: DType,
    ) -> Result<Tensor> {
        let n = shape_elements(shape)?;
        if let Some(s) = strides {
            let mut row_major = vec![1usize; shape.len()];
            for i in (0..shape.len().saturating_sub(1)).rev() {
                row_major[i] = row_major[i + 1] * shape[i + 1];
            }
            if s.len() != shape.len() {
                return Err(Error::invalid(format!(
                    "tensor_from_buffer: {} strides given for a shape of {} dimensions {shape:?}",
                    s.len(),
                    shape.len()
                )));
            }
            if s != row_major.as_slice() {
                return Err(Error::Unsupported {
                    feature: format!("strided tensor views (strides {s:?} for shape {shape:?})"),
                    backend: crate::Backend::Wgpu,
                    reason: format!(
                        "the kernels read row-major tensors (strides {row_major:?}); copy the \
                         view into a row-major buffer"
                    ),
                });
            }
        }
        if !buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(Error::invalid(format!(
                "tensor_from_buffer: the buffer needs STORAGE usage, it has {:?}",
                buffer.usage()
            )));
        }
        let align = self.limits.min_storage_buffer_offset_alignment as u64;
        if !offset.is_multiple_of(align.max(4)) {
            return Err(Error::invalid(format!(
                "tensor_from_buffer: offset must be a multiple of the device's \
                 min_storage_buffer_offset_alignment ({}), got {offset}",
                align.max(4)
            )));
        }
        let bytes = dtype
            .buffer_bytes(n as u64)
            .ok_or_else(|| Error::invalid(format!("shape {shape:?} of {dtype} is too large")))?;
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end > buffer.size())
        {
            return Err(Error::invalid(format!(
                "tensor_from_buffer: {bytes} bytes from offset {offset} run past the buffer's \
                 {} bytes",
                buffer.size()
            )));
        }
        Ok(Tensor {
            buf: Storage::Wrapped {
                buffer: buffer.clone(),
                owner: self.mem.clone(),
            },
            offset,
            shape: shape.to_vec(),
            dtype,
            role: None,
        })
    }
}
