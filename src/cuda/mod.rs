//! The CUDA path (issue: tensor-core FlashAttention on NVIDIA behind `--features cuda`).
//!
//! - `kernels`: the CUDA C kernels of `cuda/`, the key of each compiled variant and its launch
//!   geometry; pure, built with or without the feature.
//! - `nvrtc` (feature `cuda`): run-time compilation to CUBIN for the device's architecture,
//!   cached per process; NVRTC loaded dynamically, so building needs no CUDA toolkit.
//! - `device` (feature `cuda`): `CudaContext`, one GPU through the CUDA driver (also loaded
//!   at run time), implementing [`AttentionBackend`](crate::AttentionBackend) as the wgpu
//!   Context does.
//! - `tensor` (feature `cuda`): `CudaTensor`, device memory of one context.
//!
// linked only where the feature builds them (a link to a missing item is a broken link)
#![cfg_attr(
    feature = "cuda",
    doc = "The two public types: [`CudaContext`] and [`CudaTensor`].\n"
)]
//!
//! `tests/cuda_compile.rs` compiles every variant for sm_80 and sm_90 with no GPU;
//! `tests/backends.rs` checks both passes against the f64 reference on every backend present.
//! What the CUDA path refuses is listed in the README ("The CUDA path").

#[cfg(feature = "cuda")]
pub mod device;
#[doc(hidden)]
pub mod kernels;
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub mod nvrtc;
#[cfg(feature = "cuda")]
pub mod tensor;

#[cfg(feature = "cuda")]
pub use device::CudaContext;
#[cfg(feature = "cuda")]
pub use tensor::CudaTensor;

#[doc(hidden)]
pub use kernels::{CudaKernel, CudaKey};
