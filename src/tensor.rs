//! Device-resident tensors: a storage buffer of f32 plus its shape.

use crate::context::{Context, TrackedBuffer};
use crate::error::{Error, Result};

/// An f32 tensor in device memory, row-major.
#[derive(Debug)]
pub struct Tensor {
    buf: TrackedBuffer,
    shape: Vec<usize>,
}

impl Tensor {
    pub(crate) fn from_parts(buf: TrackedBuffer, shape: Vec<usize>) -> Self {
        Tensor { buf, shape }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
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
}

impl Context {
    /// Copies host data to a new device tensor of the given shape.
    pub fn upload(&self, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        if shape.is_empty() || n == 0 {
            return Err(Error::invalid(format!(
                "a tensor needs a non-empty shape with no zero dimension, got {shape:?}"
            )));
        }
        if data.len() != n {
            return Err(Error::invalid(format!(
                "upload: {} values given for shape {shape:?}, which holds {n}",
                data.len()
            )));
        }
        let buf = self.upload_bytes(bytemuck::cast_slice(data), "tensor")?;
        Ok(self.tensor(buf, shape))
    }

    /// A new zero-filled device tensor.
    pub fn zeros(&self, shape: &[usize]) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        if shape.is_empty() || n == 0 {
            return Err(Error::invalid(format!(
                "a tensor needs a non-empty shape with no zero dimension, got {shape:?}"
            )));
        }
        let buf = self.create_storage(n as u64 * 4, "tensor")?;
        Ok(self.tensor(buf, shape))
    }

    /// Copies a device tensor back to the host.
    pub fn download(&self, t: &Tensor) -> Result<Vec<f32>> {
        let bytes = t.len() as u64 * 4;
        self.read_buffer::<f32>(t.buffer(), bytes)
    }
}
