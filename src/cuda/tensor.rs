//! [`CudaTensor`]: device memory of one CUDA context, its shape and element type; what the
//! CUDA path's device-resident calls take and return, so results chain without host copies.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::CudaSlice;

use crate::dtype::DType;
use crate::error::{Error, Result, TensorRole};

/// A tensor in one CUDA context's memory, row-major, `dtype` elements packed (2 bytes for
/// f16/bf16, 4 for f32). Freed when dropped, unless it wraps memory the caller owns
/// ([`CudaContext::tensor_from_device_ptr`](super::CudaContext::tensor_from_device_ptr)).
#[derive(Debug)]
pub struct CudaTensor {
    /// Taken out once, in `drop`: freed, or let go where the caller owns it.
    pub(crate) data: ManuallyDrop<CudaSlice<u8>>,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) owner: u64,
    pub(crate) role: Option<TensorRole>,
    /// The memory is the caller's: never freed here.
    pub(crate) borrowed: bool,
}

impl Drop for CudaTensor {
    fn drop(&mut self) {
        // SAFETY: `data` is taken once, here, and never used after.
        let data = unsafe { ManuallyDrop::take(&mut self.data) };
        if self.borrowed {
            // the caller frees its memory; leak() releases only cudarc's bookkeeping
            data.leak();
        }
    }
}

impl CudaTensor {
    /// A tensor this crate allocated (freed when dropped).
    pub(crate) fn owned(
        data: CudaSlice<u8>,
        shape: &[usize],
        dtype: DType,
        owner: u64,
        role: Option<TensorRole>,
    ) -> CudaTensor {
        CudaTensor {
            data: ManuallyDrop::new(data),
            shape: shape.to_vec(),
            dtype,
            owner,
            role,
            borrowed: false,
        }
    }

    /// Whether the tensor wraps memory the caller owns.
    pub fn is_borrowed(&self) -> bool {
        self.borrowed
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The tensor's element type.
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

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of device memory the tensor holds.
    pub fn size_bytes(&self) -> usize {
        self.data.len()
    }

    /// The device memory, for chaining with your own cudarc work.
    pub fn slice(&self) -> &CudaSlice<u8> {
        &self.data
    }

    /// How errors name this tensor: its role, or its shape.
    pub(crate) fn describe(&self) -> String {
        match self.role {
            Some(r) => r.to_string(),
            None => format!("tensor of shape {:?}", self.shape),
        }
    }

    /// A typed error unless the tensor belongs to the context numbered `owner`.
    pub(crate) fn check_owner(&self, owner: u64, name: impl FnOnce() -> String) -> Result<()> {
        if self.owner == owner {
            Ok(())
        } else {
            Err(Error::ForeignTensor { tensor: name() })
        }
    }
}

/// A number per CudaContext, so a tensor is never used with a context that did not make it.
pub(crate) fn next_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
