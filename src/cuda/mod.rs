//! The CUDA path (issue: tensor-core FlashAttention on NVIDIA behind `--features cuda`).
//!
//! - `kernels`: the CUDA C kernels of `cuda/`, the key of each compiled variant and its launch
//!   geometry; pure, built with or without the feature.
//! - `nvrtc` (feature `cuda`): run-time compilation to CUBIN for the device's architecture,
//!   cached per process; NVRTC loaded dynamically, so building needs no CUDA toolkit.
//! - `device` (feature `cuda`): [`CudaContext`], one GPU through the CUDA driver (also loaded
//!   at run time), with the wgpu Context's host calls.
//!
//! What exists: `CudaContext::forward_host` and `backward_host` (f16/bf16 on tensor cores).
//! `tests/cuda_compile.rs` compiles every variant for sm_80 and sm_90 with no GPU;
//! `tests/cuda.rs` checks both passes against the f64 reference where a device exists.
//! Device-resident tensors and the rest of the wgpu calls are not built yet (README, "The CUDA
//! path").

#[cfg(feature = "cuda")]
pub mod device;
pub mod kernels;
#[cfg(feature = "cuda")]
pub mod nvrtc;

#[cfg(feature = "cuda")]
pub use device::CudaContext;

pub use kernels::{CudaKernel, CudaKey};
