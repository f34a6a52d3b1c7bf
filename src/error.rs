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

/// Which tensor an error is about. Non-exhaustive: new calls bring new tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TensorRole {
    /// The queries.
    Q,
    /// The keys (or the key cache).
    K,
    /// The values (or the value cache).
    V,
    /// The attention output.
    Out,
    /// The per-row logsumexp the forward saves (`[batch, heads_q, seq_q]`, f32).
    Lse,
    /// The output's gradient, input of the backward.
    DOut,
    /// The queries' gradient.
    Dq,
    /// The keys' gradient.
    Dk,
    /// The values' gradient.
    Dv,
    /// The sinks' gradient (`[heads_q]`, f32).
    DSinks,
    /// The additive bias (`AttentionConfig::bias`).
    Bias,
    /// The bias's gradient (the bias's shape and dtype).
    DBias,
    /// A trainable captured tensor's gradient (`[len]`, f32).
    DTable,
    /// A rotary embedding's cosine table (`[table_rows, rotary_dim / 2]`, q's dtype).
    RotaryCos,
    /// A rotary embedding's sine table (the cosine table's shape and dtype).
    RotarySin,
    /// The keys a KV-cache call appends (`k_new`, `[batch, new, heads_kv, head_dim]`).
    KNew,
    /// The values a KV-cache call appends (`v_new`, `[batch, new, heads_kv, head_dim_v]`).
    VNew,
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
            TensorRole::DTable => "d_table",
            TensorRole::RotaryCos => "rotary_cos",
            TensorRole::RotarySin => "rotary_sin",
            TensorRole::KNew => "k_new",
            TensorRole::VNew => "v_new",
        })
    }
}

/// Everything a call can refuse or fail with. Input errors are found before any GPU work is
/// recorded; each names what was expected and what was given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No adapter (GPU or software Vulkan) could be opened.
    #[error(
        "no GPU adapter found ({detail}). Install a GPU driver with Vulkan, Metal or DX12 \
         support; on a headless Linux machine install Mesa >= 25 lavapipe \
         (`bash scripts/ensure-vulkan.sh` does it on Debian)"
    )]
    NoAdapter {
        /// What the adapter search saw.
        detail: String,
    },

    /// The adapter refused to create a device with the limits and features asked for.
    #[error("could not create a wgpu device: {0}")]
    RequestDevice(String),

    /// A host slice or tensor has the wrong number of elements for the config.
    #[error("{tensor} has {got} elements, expected {expected} (shape {shape})")]
    SliceLength {
        /// Which input.
        tensor: TensorRole,
        /// The element count the config implies.
        expected: usize,
        /// The element count given.
        got: usize,
        /// The shape the config implies, written out.
        shape: String,
    },

    /// A tensor has the wrong shape for the config.
    #[error("{tensor} has shape {got:?}, expected {expected:?}")]
    Shape {
        /// Which input.
        tensor: TensorRole,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The tensor's shape.
        got: Vec<usize>,
    },

    /// A tensor's dtype does not match the call's.
    #[error(
        "{tensor} has dtype {got}, expected {expected}: every tensor of one call shares q's \
         dtype (lse is always f32), and a tensor downloads as its own dtype (Tensor::dtype)"
    )]
    DType {
        /// Which tensor (a role, or a description such as `download`).
        tensor: String,
        /// The dtype the call needs.
        expected: DType,
        /// The dtype given.
        got: DType,
    },

    /// A tensor made by another context was passed in.
    #[error(
        "{tensor} was made by another Context: a tensor can only be used with the Context that \
         created it (download it and upload it to this one)"
    )]
    ForeignTensor {
        /// Which tensor.
        tensor: String,
    },

    /// A context-parallel call across ranks (module `distributed`) failed between ranks:
    /// they disagree on the call (the field and both values named), or a rank did not answer
    /// in time (`FLASH_ATTN_MPI_TIMEOUT_S`). Every rank of the call gets it.
    #[error("rank {rank}: {message}")]
    Distributed {
        /// The rank that reports it.
        rank: usize,
        /// What went wrong, naming the other rank and the field.
        message: String,
    },

    /// User-written kernel code (a [`crate::ScoreMod`]) that breaks a rule or that the shader
    /// compiler refuses: the compiler's message, and the line in the user's snippet.
    #[error(
        "{what}{}: {message}",
        line.map_or(String::new(), |l| format!(", line {l} of the snippet"))
    )]
    UserCode {
        /// Which snippet (`score_mod WGSL`, `score_mod CUDA`).
        what: String,
        /// The line in the snippet (1-based), where the compiler gives one.
        line: Option<usize>,
        /// What is wrong.
        message: String,
    },

    /// A feature this backend does not implement (README's feature table and docs/CUDA.md list
    /// each).
    #[error("{feature} is not supported on the {backend} backend: {reason}")]
    Unsupported {
        /// The feature asked for.
        feature: String,
        /// The backend that refused it.
        backend: Backend,
        /// Why, and what to use instead.
        reason: String,
    },

    /// An input holds a value the call cannot take (a NaN where a finite value is needed).
    #[error("{tensor}[{index}] is {value}, expected {expected}")]
    InvalidValue {
        /// Which input.
        tensor: TensorRole,
        /// The flat index of the first bad element.
        index: usize,
        /// Its value.
        value: f32,
        /// What values are allowed.
        expected: String,
    },

    /// The config (shape, modifiers, their tensors) is inconsistent; the message says how.
    #[error("invalid attention config: {0}")]
    InvalidConfig(String),

    /// Memory the caller wraps as a tensor (`Context::tensor_from_buffer`, CUDA's
    /// `tensor_from_device_ptr`) that cannot hold or serve it.
    #[error("{what}: expected {expected}, got {got}")]
    Buffer {
        /// The call and the property checked.
        what: String,
        /// What the call needs.
        expected: String,
        /// What the buffer has.
        got: String,
    },

    /// The call needs more of a device resource than the device allows.
    #[error("device limit exceeded: {what} needs {needed}, the device allows {limit}. {hint}")]
    DeviceLimit {
        /// The resource.
        what: String,
        /// How much the call needs.
        needed: u64,
        /// How much the device allows.
        limit: u64,
        /// How to fit (smaller tiles, shorter sequences, another adapter).
        hint: String,
    },

    /// wgpu's validation rejected a command: a bug in this crate, reported rather than a panic.
    #[error("GPU validation error: {0}")]
    Validation(String),

    /// An allocation failed on the device.
    #[error("GPU out of memory: {0}")]
    OutOfMemory(String),

    /// The device was lost, or a submission failed.
    #[error("GPU device lost or failed: {0}")]
    Device(String),

    /// The driver failed the start-up canary: it miscounts long shader loops.
    #[error(
        "driver canary failed: a shader loop of {expected} iterations counted {got}. \
         Mesa lavapipe older than 25 silently truncates long loops; install Mesa >= 25 \
         (`bash scripts/ensure-vulkan.sh`)"
    )]
    DriverCanary {
        /// Iterations the canary ran.
        expected: u32,
        /// Iterations the driver counted.
        got: u32,
    },

    /// The CUDA path cannot start: no driver, no NVRTC, or too old a GPU.
    #[error("the CUDA path is not available: {missing}. {fix}")]
    CudaUnavailable {
        /// What is missing.
        missing: String,
        /// How to provide it.
        fix: String,
    },

    /// NVRTC refused a kernel: a bug in this crate's CUDA C, reported with the compiler's log.
    #[error("NVRTC could not compile {kernel}: {log}")]
    CudaCompile {
        /// The kernel and its defines.
        kernel: String,
        /// NVRTC's log.
        log: String,
    },
}

/// This crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidConfig(msg.into())
    }
}
