//! The backward pass: gradients of q, k, v from the forward's out and lse (recomputed, not
//! stored).

use crate::checks::check_lse_values;
use crate::config::AttentionConfig;
use crate::device::Context;
use crate::dtype::DType;
use crate::error::{Result, TensorRole};
use crate::plan;
use crate::tensor::check_tensor;
use crate::tensor::Tensor;

pub use crate::outputs::{Gradients, HostGradients};

/// Where a backward call's lse values are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LseValues {
    /// Already checked on the host.
    Checked,
    /// Read back from the device tensor and checked.
    OnDevice,
    /// Not checked: a recorded call's lse may not exist until the caller submits.
    Unchecked,
}

impl Context {
    /// Backward pass on device tensors. `out` and `lse` are the forward's results exactly as
    /// returned; `d_out` is the gradient of the loss with respect to `out`. q, k, v, out and
    /// d_out share q's dtype; lse is f32 and is refused (`Error::InvalidValue`) where it holds
    /// +inf, which no forward returns (in a browser, which cannot wait for that check, such
    /// an lse zeroes its row's gradients, as [`record_backward`](Context::record_backward)).
    ///
    /// ```no_run
    /// use flash_attn_wgpu::{AttentionConfig, Context};
    /// let ctx = Context::new()?;
    /// let cfg = AttentionConfig::new(2, 100, 100, 8, 2, 64);
    /// let (qs, ks) = (cfg.q_shape(), cfg.kv_shape());
    /// let n = |s: [usize; 4]| s.iter().product::<usize>();
    /// let q = ctx.upload(&vec![0.1f32; n(qs)], &qs)?;
    /// let (k, v) = (ctx.upload(&vec![0.2f32; n(ks)], &ks)?, ctx.upload(&vec![0.3f32; n(ks)], &ks)?);
    /// let f = ctx.forward(&cfg, &q, &k, &v)?;
    /// let d_out = ctx.upload(&vec![1.0f32; n(qs)], &qs)?;
    /// let g = ctx.backward(&cfg, &q, &k, &v, &f.out, &f.lse, &d_out)?;
    /// assert_eq!(g.dk.shape(), &ks[..]);
    /// # Ok::<(), flash_attn_wgpu::Error>(())
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        d_out: &Tensor,
    ) -> Result<Gradients> {
        self.backward_checked(cfg, (q, k, v), (out, lse, d_out), LseValues::OnDevice, None)
    }

    /// [`backward`](Context::backward) recorded into the caller's `encoder` and not
    /// submitted (as [`record_forward`](Context::record_forward)), for example after the
    /// forward in the same encoder. lse's values are not checked (they may not exist until the
    /// caller submits): an lse of +inf, which no forward returns, zeroes its row's gradients.
    #[allow(clippy::too_many_arguments)]
    pub fn record_backward(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        d_out: &Tensor,
    ) -> Result<Gradients> {
        self.backward_checked(
            cfg,
            (q, k, v),
            (out, lse, d_out),
            LseValues::Unchecked,
            Some(encoder),
        )
    }

    /// `backward` once the lse values are known good (`Checked`: the host call checked its
    /// slice before uploading it) or still to be read back and checked (`OnDevice`).
    fn backward_checked(
        &self,
        cfg: &AttentionConfig,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        (out, lse, d_out): (&Tensor, &Tensor, &Tensor),
        lse_values: LseValues,
        into: Option<&mut wgpu::CommandEncoder>,
    ) -> Result<Gradients> {
        cfg.validate()?;
        crate::kvcache::separate_v(cfg)?;
        let dtype = q.dtype();
        check_tensor(self, TensorRole::Q, q, &cfg.q_shape(), dtype)?;
        check_tensor(self, TensorRole::K, k, &cfg.kv_shape(), dtype)?;
        check_tensor(self, TensorRole::V, v, &cfg.v_shape(), dtype)?;
        check_tensor(self, TensorRole::Out, out, &cfg.out_shape(), dtype)?;
        check_tensor(self, TensorRole::Lse, lse, &cfg.lse_shape(), DType::F32)?;
        check_tensor(self, TensorRole::DOut, d_out, &cfg.out_shape(), dtype)?;
        // lse is one value per row, small beside the pass itself: read back and checked here
        // as the host call checks its slice. Not in a browser, which cannot wait for it: there
        // the device backward is the recorded one's (an lse of +inf zeroes its row).
        if lse_values == LseValues::OnDevice && !cfg!(target_arch = "wasm32") {
            check_lse_values(&self.download::<f32>(lse)?)?;
        }
        let plan = plan::backward(cfg, dtype, &self.plan_env())?;
        let mut g = self
            .execute_into(&plan, &[q, k, v, out, lse, d_out], into, None)?
            .into_iter();
        match (g.next(), g.next(), g.next()) {
            (Some(dq), Some(dk), Some(dv)) => Ok(Gradients {
                dq,
                dk,
                dv,
                // the plan's outputs after dv: d_sinks, then d_bias, then d_table, each where
                // asked for
                d_sinks: cfg.sinks.as_ref().and_then(|_| g.next()),
                d_bias: cfg.bias.as_ref().filter(|b| b.grad).and_then(|_| g.next()),
                d_table: cfg
                    .score_mod
                    .as_ref()
                    .and_then(|m| m.trainable())
                    .and_then(|_| g.next()),
            }),
            _ => Err(crate::Error::Device(
                "internal: backward plan without dq, dk, dv".into(),
            )),
        }
    }

    /// The device backward of [`backward_host`](Self::backward_host), whose lse values the
    /// host checked: not read back again.
    pub(crate) fn backward_lse_checked_on_host(
        &self,
        cfg: &AttentionConfig,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        (out, lse, d_out): (&Tensor, &Tensor, &Tensor),
    ) -> Result<Gradients> {
        self.backward_checked(cfg, (q, k, v), (out, lse, d_out), LseValues::Checked, None)
    }
}
