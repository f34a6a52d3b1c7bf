//! The forward pass: `out = softmax(scale * Q K^T, masked) V` and its per-row lse.

use crate::checks::check_tensor;
use crate::config::AttentionConfig;
use crate::device::Context;
use crate::dtype::Element;
use crate::error::{Result, TensorRole};
use crate::plan;
use crate::tensor::Tensor;

/// Device-resident forward results. `out` is shaped and typed like q; `lse` is f32
/// `[batch, heads_q, seq_q]` (natural log). `X` is the backend's tensor type: [`Tensor`] on
/// wgpu, `CudaTensor` on CUDA.
#[derive(Debug)]
pub struct Forward<X = Tensor> {
    pub out: X,
    pub lse: X,
}

/// Host copy of the forward results.
#[derive(Debug, Clone, PartialEq)]
pub struct HostForward<T = f32> {
    pub out: Vec<T>,
    pub lse: Vec<f32>,
}

impl Forward {
    /// The two outputs of a plan that makes out and lse, in that order (`plan` names it in the
    /// internal error, should it have fewer).
    pub(crate) fn from_outputs(outputs: Vec<Tensor>, plan: &str) -> crate::Result<Forward> {
        let mut outputs = outputs.into_iter();
        match (outputs.next(), outputs.next()) {
            (Some(out), Some(lse)) => Ok(Forward { out, lse }),
            _ => Err(crate::Error::Device(format!(
                "internal: {plan} plan without out and lse"
            ))),
        }
    }
}

impl Context {
    /// Forward pass on device tensors. q: `[batch, seq_q, heads_q, head_dim]`, k and v:
    /// `[batch, seq_kv, heads_kv, head_dim]`, all of one dtype (q's).
    pub fn forward(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Forward> {
        self.forward_into(cfg, q, k, v, None)
    }

    /// [`forward`](Context::forward) recorded into the caller's `encoder` and not submitted:
    /// the dispatches run when the caller submits it on this context's queue (the parameters,
    /// extras and pair data are queue writes, which run before it). The returned tensors hold
    /// the results once that submission has run. Keep the input tensors alive until then (a
    /// dropped tensor's buffer is destroyed, and the submit would fail validation). Checks and
    /// errors as `forward`.
    pub fn record_forward(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Forward> {
        self.forward_into(cfg, q, k, v, Some(encoder))
    }

    fn forward_into(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        into: Option<&mut wgpu::CommandEncoder>,
    ) -> Result<Forward> {
        cfg.validate()?;
        let dtype = q.dtype();
        check_tensor(self, TensorRole::Q, q, &cfg.q_shape(), dtype)?;
        check_tensor(self, TensorRole::K, k, &cfg.kv_shape(), dtype)?;
        check_tensor(self, TensorRole::V, v, &cfg.kv_shape(), dtype)?;
        let plan = plan::forward(cfg, dtype, &self.plan_env())?;
        Forward::from_outputs(self.execute_into(&plan, &[q, k, v], into)?, "forward")
    }

    /// Forward pass on host slices of f32, `half::f16` or `half::bf16`; uploads, runs,
    /// downloads. `out` comes back in the inputs' type, `lse` in f32.
    pub fn forward_host<T: Element>(
        &self,
        cfg: &AttentionConfig,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<HostForward<T>> {
        crate::AttentionBackend::forward_host(self, cfg, q, k, v)
    }
}
