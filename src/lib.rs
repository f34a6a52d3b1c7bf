//! # flash-attn-wgpu
//!
//! Exact FlashAttention, forward and backward, as WGSL compute shaders on wgpu.
//!
//! The tiled kernels keep Q, K and V tiles in workgroup memory and fold scale, mask and an
//! online softmax (running row max `m` and row sum `l`) into one pass, so the
//! `seq_q x seq_kv` score matrix never reaches global memory. The forward pass saves only the
//! output and the per-row logsumexp; the backward pass recomputes the probabilities from it.
//!
//! ```no_run
//! use flash_attn_wgpu::{AttentionConfig, Context};
//! let ctx = Context::new()?;
//! let cfg = AttentionConfig::new(1, 128, 128, 4, 4, 64);
//! let q = vec![0.1f32; 128 * 4 * 64];
//! let f = ctx.forward_host(&cfg, &q, &q, &q)?;
//! assert_eq!(f.out.len(), q.len());
//! # Ok::<(), flash_attn_wgpu::Error>(())
//! ```

pub mod backward;
pub mod config;
pub mod context;
pub mod error;
pub mod forward;
pub mod kernels;
pub mod reference;
pub mod roofline;
pub mod tensor;

pub use backward::{Gradients, HostGradients};
pub use config::{Algorithm, AttentionConfig, MAX_HEAD_DIM};
pub use context::{AdapterSummary, Context, GpuTiming, MemoryStats, Tuning};
pub use error::{Error, Result, TensorRole};
pub use forward::{Forward, HostForward};
pub use kernels::Variant;
pub use roofline::Roofline;
pub use tensor::Tensor;
