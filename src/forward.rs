//! The forward pass: `out = softmax(scale * Q K^T, masked) V` and its per-row lse.

use crate::config::AttentionConfig;
use crate::device::Context;
use crate::error::{Result, TensorRole};
use crate::plan;
use crate::tensor::check_tensor;
use crate::tensor::Tensor;

pub use crate::outputs::{Forward, HostForward};

impl Context {
    /// Forward pass on device tensors. q: `[batch, seq_q, heads_q, head_dim]`, k and v:
    /// `[batch, seq_kv, heads_kv, head_dim]`, all of one dtype (q's).
    ///
    /// ```no_run
    /// use flash_attn_wgpu::{AttentionConfig, Context};
    /// let ctx = Context::new()?;
    /// let mut cfg = AttentionConfig::new(1, 256, 256, 8, 8, 64);
    /// cfg.causal = true;
    /// let q = ctx.upload(&vec![0.5f32; cfg.q_shape().iter().product()], &cfg.q_shape())?;
    /// let k = ctx.upload(&vec![0.25f32; cfg.kv_shape().iter().product()], &cfg.kv_shape())?;
    /// let f = ctx.forward(&cfg, &q, &k, &k)?; // queued; nothing waits
    /// let out: Vec<f32> = ctx.download(&f.out)?; // waits for the result
    /// # Ok::<(), flash_attn_wgpu::Error>(())
    /// ```
    pub fn forward(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Forward> {
        self.forward_impl(cfg, q, k, v, None, None)
    }

    /// [`forward`](Context::forward) writing into `dst` instead of new tensors: `dst.out` and
    /// `dst.lse` of the shapes and dtypes `forward` would return (an earlier call's result, or
    /// tensors from [`zeros_of`](Context::zeros_of)), made by this context and not inputs of
    /// the call. A loop that runs attention every step then allocates nothing on the device.
    ///
    /// ```no_run
    /// # use flash_attn_wgpu::{AttentionConfig, Context};
    /// # let ctx = Context::new()?;
    /// let cfg = AttentionConfig::new(1, 1, 64, 4, 4, 32);
    /// let q = ctx.zeros(&cfg.q_shape())?;
    /// let (k, v) = (ctx.zeros(&cfg.kv_shape())?, ctx.zeros(&cfg.kv_shape())?);
    /// let res = ctx.forward(&cfg, &q, &k, &v)?; // allocated once
    /// for step in 0..8 {
    ///     ctx.write(&q, &vec![step as f32; q.len()])?; // in place
    ///     ctx.forward_into(&cfg, &q, &k, &v, &res)?; // in place
    /// }
    /// # Ok::<(), flash_attn_wgpu::Error>(())
    /// ```
    pub fn forward_into(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        dst: &Forward,
    ) -> Result<()> {
        self.forward_impl(cfg, q, k, v, None, Some(dst)).map(drop)
    }

    /// [`forward`](Context::forward) recorded into the caller's `encoder` and not submitted:
    /// the dispatches run when the caller submits it on this context's queue (the parameters,
    /// extras and pair data are queue writes, which run before it). The returned tensors hold
    /// the results once that submission has run. Keep the input tensors alive until then (a
    /// dropped tensor's buffer is destroyed, and the submit would fail validation). Checks and
    /// errors as `forward`.
    ///
    /// ```no_run
    /// # use flash_attn_wgpu::{AttentionConfig, Context};
    /// # let ctx = Context::new()?;
    /// # let cfg = AttentionConfig::new(1, 64, 64, 4, 4, 32);
    /// # let q = ctx.zeros(&cfg.q_shape())?;
    /// let mut enc = ctx.device().create_command_encoder(&Default::default());
    /// // ... the caller's own passes ...
    /// let f = ctx.record_forward(&mut enc, &cfg, &q, &q, &q)?;
    /// // ... more passes that read f.out ...
    /// ctx.queue().submit([enc.finish()]);
    /// # Ok::<(), flash_attn_wgpu::Error>(())
    /// ```
    pub fn record_forward(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Forward> {
        self.forward_impl(cfg, q, k, v, Some(encoder), None)
    }

    fn forward_impl(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        into: Option<&mut wgpu::CommandEncoder>,
        dst: Option<&Forward>,
    ) -> Result<Forward> {
        cfg.validate()?;
        crate::kvcache::separate_v(cfg)?;
        let dtype = q.dtype();
        check_tensor(self, TensorRole::Q, q, &cfg.q_shape(), dtype)?;
        check_tensor(self, TensorRole::K, k, &cfg.kv_shape(), dtype)?;
        check_tensor(self, TensorRole::V, v, &cfg.v_shape(), dtype)?;
        let plan = plan::forward(cfg, dtype, &self.plan_env())?;
        let given = dst.map(|d| [&d.out, &d.lse]);
        let outputs = self.execute_into(&plan, &[q, k, v], into, given.as_ref().map(|g| &g[..]))?;
        Forward::from_outputs(outputs, "forward")
    }
}
