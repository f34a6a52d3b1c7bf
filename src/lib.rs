//! # flash-attn-wgpu
//!
//! Exact FlashAttention, forward and backward, as WGSL compute shaders on wgpu, in f32, f16
//! and bf16.
//!
//! The tiled kernels keep Q, K and V tiles in workgroup memory and fold scale, mask and an
//! online softmax (running row max `m` and row sum `l`) into one pass, so the
//! `seq_q x seq_kv` score matrix never reaches global memory. The forward pass saves only the
//! output and the per-row logsumexp; the backward pass recomputes the probabilities from it.
//!
//! How a call flows: host slices -> [`Tensor`] -> validation ([`AttentionConfig::validate`],
//! `checks`) -> `plan` (a pure value: kernels, keys, parameters, grids, scratch) ->
//! `record` (pipelines from the cache, one command encoder, submit, wait) -> tensors -> host.
//!
//! ```no_run
//! use flash_attn_wgpu::{AttentionConfig, Context};
//! let ctx = Context::new()?;
//! let cfg = AttentionConfig::new(1, 128, 128, 4, 4, 64);
//! let q = vec![0.1f32; 128 * 4 * 64];
//! let f = ctx.forward_host(&cfg, &q, &q, &q)?;
//! assert_eq!(f.out.len(), q.len());
//! // half precision: the same call with half::f16 or half::bf16 slices
//! let qh: Vec<half::bf16> = q.iter().map(|&x| half::bf16::from_f32(x)).collect();
//! let fh = ctx.forward_host(&cfg, &qh, &qh, &qh)?;
//! assert_eq!(fh.out.len(), q.len());
//! # Ok::<(), flash_attn_wgpu::Error>(())
//! ```

#![deny(missing_docs)]

pub mod backend;
pub mod backward;
mod block_masks;
mod checks;
pub mod config;
pub mod cuda;
pub mod device;
#[cfg(not(target_arch = "wasm32"))]
pub mod distributed;
pub mod dtype;
pub mod error;
pub mod forward;
pub mod kv_format;
pub mod kvcache;
pub mod merge;
pub mod modifiers;
mod outputs;
mod record;
mod registry;
pub mod rotary;
pub mod tensor;
#[doc(hidden)]
pub mod unstable;
mod validate;

// The modifiers' public types keep their paths (`flash_attn_wgpu::bias::ScoreBias`, ...).
pub use modifiers::mask_mod::MaskMod;
pub use modifiers::score_mod::{HostTableFn, ScoreMod};
pub use modifiers::{bias, block_mask, bool_mask, dropout, paged, varlen};

// Internal paths stay `crate::plan` etc. inside the crate.
use unstable::{kernels, plan, reference, roofline};

/// The wgpu this crate is built on: name `flash_attn_wgpu::wgpu` for the devices, queues and
/// buffers you pass in, so your code and this crate agree on one wgpu version.
pub use wgpu;

pub use backend::AttentionBackend;
pub use bias::ScoreBias;
pub use block_mask::{BlockMask, FlexBlocks};
pub use bool_mask::BoolMask;
pub use config::{
    Algorithm, AttentionConfig, Block, Shape, Window, MAX_HEAD_DIM, MAX_HEAD_DIM_QK, MAX_HEAD_DIM_V,
};
pub use device::memory::MemoryStats;
pub use device::timing::GpuTiming;
pub use device::{AdapterSummary, Context};
pub use dropout::Dropout;
pub use dtype::{from_f32_slice, to_f32_vec, DType, Element, HalfStorage};
pub use error::{Backend, Error, Result, TensorRole};
pub use kernels::{Tuning, Variant};
pub use kv_format::CacheFormat;
pub use kvcache::QuantizedCache;
pub use outputs::{Forward, Gradients, HostForward, HostGradients};
pub use paged::PagedKv;
pub use roofline::Roofline;
pub use rotary::{Positions, Rotary};
pub use tensor::Tensor;
pub use varlen::Varlen;

/// The README's code, compiled and run as a doc test, so that the first example a user meets
/// works.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
