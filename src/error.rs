//! The one error type of the crate. Every variant says what was expected and what was given.

use std::fmt;

use crate::dtype::DType;

/// Which implementation runs a call: named by every `Error::Unsupported`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// WGSL compute shaders on wgpu (Vulkan, Metal, DX12, WebGPU).
    Wgpu,
    /// CUDA C kernels compiled by NVRTC, on NVIDIA GPUs (feature `cuda`).
    Cuda,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Wgpu => "wgpu",
            Backend::Cuda => "CUDA",
        })
    }
}

/// Which tensor an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    Q,
    K,
    V,
    Out,
    Lse,
    DOut,
    Dq,
    Dk,
    Dv,
    /// The sinks' gradient (`[heads_q]`, f32).
    DSinks,
    /// The additive bias (`AttentionConfig::bias`).
    Bias,
    /// The bias's gradient (the bias's shape and dtype).
    DBias,
}

impl fmt::Display for TensorRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TensorRole::Q => "q",
            TensorRole::K => "k",
            TensorRole::V => "v",
            TensorRole::Out => "out",
            TensorRole::Lse => "lse",
            TensorRole::DOut => "d_out",
            TensorRole::Dq => "dq",
            TensorRole::Dk => "dk",
            TensorRole::Dv => "dv",
            TensorRole::DSinks => "d_sinks",
            TensorRole::Bias => "bias",
            TensorRole::DBias => "d_bias",
        })
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(
        "no GPU adapter found ({detail}). Install a GPU driver with Vulkan, Metal or DX12 \
         support; on a headless Linux machine install Mesa >= 25 lavapipe \
         (`bash scripts/ensure-vulkan.sh` does it on Debian)"
    )]
    NoAdapter { detail: String },

    #[error("could not create a wgpu device: {0}")]
    RequestDevice(String),

    #[error("{tensor} has {got} elements, expected {expected} (shape {shape})")]
    SliceLength {
        tensor: TensorRole,
        expected: usize,
        got: usize,
        shape: String,
    },

    #[error("{tensor} has shape {got:?}, expected {expected:?}")]
    Shape {
        tensor: TensorRole,
        expected: Vec<usize>,
        got: Vec<usize>,
    },

    #[error(
        "{tensor} has dtype {got}, expected {expected}: every tensor of one call shares q's \
         dtype (lse is always f32), and a tensor downloads as its own dtype (Tensor::dtype)"
    )]
    DType {
        tensor: String,
        expected: DType,
        got: DType,
    },

    #[error(
        "{tensor} was made by another Context: a tensor can only be used with the Context that \
         created it (download it and upload it to this one)"
    )]
    ForeignTensor { tensor: String },

    #[error("{feature} is not supported on the {backend} backend: {reason}")]
    Unsupported {
        feature: String,
        backend: Backend,
        reason: String,
    },

    #[error("{tensor}[{index}] is {value}, expected {expected}")]
    InvalidValue {
        tensor: TensorRole,
        index: usize,
        value: f32,
        expected: String,
    },

    #[error("invalid attention config: {0}")]
    InvalidConfig(String),

    /// Memory the caller wraps as a tensor (`Context::tensor_from_buffer`, CUDA's
    /// `tensor_from_device_ptr`) that cannot hold or serve it.
    #[error("{what}: expected {expected}, got {got}")]
    Buffer {
        what: String,
        expected: String,
        got: String,
    },

    #[error("device limit exceeded: {what} needs {needed}, the device allows {limit}. {hint}")]
    DeviceLimit {
        what: String,
        needed: u64,
        limit: u64,
        hint: String,
    },

    #[error("GPU validation error: {0}")]
    Validation(String),

    #[error("GPU out of memory: {0}")]
    OutOfMemory(String),

    #[error("GPU device lost or failed: {0}")]
    Device(String),

    #[error(
        "driver canary failed: a shader loop of {expected} iterations counted {got}. \
         Mesa lavapipe older than 25 silently truncates long loops; install Mesa >= 25 \
         (`bash scripts/ensure-vulkan.sh`)"
    )]
    DriverCanary { expected: u32, got: u32 },

    #[error("the CUDA path is not available: {missing}. {fix}")]
    CudaUnavailable { missing: String, fix: String },

    #[error("NVRTC could not compile {kernel}: {log}")]
    CudaCompile { kernel: String, log: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidConfig(msg.into())
    }
}
