//! Backward pass: gradients of q, k, v from the forward's out and lse (recompute, not store).

use crate::config::{Algorithm, AttentionConfig};
use crate::context::{Context, Dispatch};
use crate::error::{Error, Result, TensorRole};
use crate::forward::{check_shape, check_slice, naive_chunk_slices, NO_TILES};
use crate::kernels::{Kernel, Params};
use crate::tensor::Tensor;

/// Device-resident gradients. dq is shaped like q; dk and dv like k and v.
#[derive(Debug)]
pub struct Gradients {
    pub dq: Tensor,
    pub dk: Tensor,
    pub dv: Tensor,
}

/// Host copy of the gradients.
#[derive(Debug, Clone, PartialEq)]
pub struct HostGradients {
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
}

impl Context {
    /// Backward pass on device tensors. `out` and `lse` are the forward's results exactly as
    /// returned; `d_out` is the gradient of the loss with respect to `out`.
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
        cfg.validate()?;
        check_shape(TensorRole::Q, q, &cfg.q_shape())?;
        check_shape(TensorRole::K, k, &cfg.kv_shape())?;
        check_shape(TensorRole::V, v, &cfg.kv_shape())?;
        check_shape(TensorRole::Out, out, &cfg.q_shape())?;
        check_shape(TensorRole::Lse, lse, &cfg.lse_shape())?;
        check_shape(TensorRole::DOut, d_out, &cfg.q_shape())?;
        let t = BwdTensors {
            q,
            k,
            v,
            out,
            lse,
            d_out,
        };
        match cfg.algorithm {
            Algorithm::Tiled => self.backward_tiled(cfg, &t),
            Algorithm::Naive => self.backward_naive(cfg, &t),
        }
    }

    /// Backward pass on host slices; uploads, runs, downloads.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_host(
        &self,
        cfg: &AttentionConfig,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &[f32],
        lse: &[f32],
        d_out: &[f32],
    ) -> Result<HostGradients> {
        cfg.validate()?;
        check_slice(TensorRole::Q, q, &cfg.q_shape())?;
        check_slice(TensorRole::K, k, &cfg.kv_shape())?;
        check_slice(TensorRole::V, v, &cfg.kv_shape())?;
        check_slice(TensorRole::Out, out, &cfg.q_shape())?;
        check_slice(TensorRole::Lse, lse, &cfg.lse_shape())?;
        check_slice(TensorRole::DOut, d_out, &cfg.q_shape())?;
        if let Some(x) = lse.iter().find(|x| x.is_nan() || **x == f32::INFINITY) {
            return Err(Error::invalid(format!(
                "lse must be finite or -inf (a row that sees no key), got {x}"
            )));
        }
        let up = |d: &[f32], s: &[usize]| self.upload(d, s);
        let (qs, kvs) = (cfg.q_shape(), cfg.kv_shape());
        let g = self.backward(
            cfg,
            &up(q, &qs)?,
            &up(k, &kvs)?,
            &up(v, &kvs)?,
            &up(out, &qs)?,
            &up(lse, &cfg.lse_shape())?,
            &up(d_out, &qs)?,
        )?;
        Ok(HostGradients {
            dq: self.download(&g.dq)?,
            dk: self.download(&g.dk)?,
            dv: self.download(&g.dv)?,
        })
    }

    fn delta_dispatch<'a>(
        &self,
        cfg: &AttentionConfig,
        t: &BwdTensors<'a>,
        delta: &'a Tensor,
    ) -> Dispatch<'a> {
        let rows = cfg.lse_len();
        let mut params = Params::from_config(cfg);
        params.total_items = rows as u32;
        Dispatch {
            key: self.kernel_key(Kernel::FlashBwdPreprocess, cfg, NO_TILES),
            params,
            buffers: vec![t.out.buffer(), t.d_out.buffer(), delta.buffer()],
            workgroups: rows.div_ceil(64) as u32,
        }
    }

    fn backward_tiled(&self, cfg: &AttentionConfig, t: &BwdTensors<'_>) -> Result<Gradients> {
        let (kv_kernel, q_kernel) = (self.variant().backward_dkdv(), self.variant().backward_dq());
        let kv_tiles = self.tiles_for(kv_kernel, cfg.head_dim)?;
        let q_tiles = self.tiles_for(q_kernel, cfg.head_dim)?;
        let delta = self.zeros(&cfg.lse_shape())?;
        let dq = self.zeros(&cfg.q_shape())?;
        let dk = self.zeros(&cfg.kv_shape())?;
        let dv = self.zeros(&cfg.kv_shape())?;

        let n_kv = cfg.seq_kv.div_ceil(kv_tiles.bc as usize);
        let wg_kv = n_kv * cfg.heads_kv * cfg.batch;
        let mut p_kv = Params::from_config(cfg);
        p_kv.n_kv_tiles = n_kv as u32;
        p_kv.n_q_tiles = cfg.seq_q.div_ceil(kv_tiles.br as usize) as u32;
        p_kv.total_wg = wg_kv as u32;

        let n_q = cfg.seq_q.div_ceil(q_tiles.br as usize);
        let wg_q = n_q * cfg.heads_q * cfg.batch;
        let mut p_q = Params::from_config(cfg);
        p_q.n_q_tiles = n_q as u32;
        p_q.n_kv_tiles = cfg.seq_kv.div_ceil(q_tiles.bc as usize) as u32;
        p_q.total_wg = wg_q as u32;

        let inputs = [
            t.q.buffer(),
            t.k.buffer(),
            t.v.buffer(),
            t.d_out.buffer(),
            t.lse.buffer(),
            delta.buffer(),
        ];
        let mut kv_bufs = inputs.to_vec();
        kv_bufs.extend([dk.buffer(), dv.buffer()]);
        let mut q_bufs = inputs.to_vec();
        q_bufs.push(dq.buffer());
        self.run(&[
            self.delta_dispatch(cfg, t, &delta),
            Dispatch {
                key: self.kernel_key(kv_kernel, cfg, kv_tiles),
                params: p_kv,
                buffers: kv_bufs,
                workgroups: wg_kv as u32,
            },
            Dispatch {
                key: self.kernel_key(q_kernel, cfg, q_tiles),
                params: p_q,
                buffers: q_bufs,
                workgroups: wg_q as u32,
            },
        ])?;
        Ok(Gradients { dq, dk, dv })
    }

    fn backward_naive(&self, cfg: &AttentionConfig, t: &BwdTensors<'_>) -> Result<Gradients> {
        let group = cfg.group();
        let slices = cfg.batch * cfg.heads_q;
        // Chunks hold whole GQA groups: dK and dV sum over a group's query heads.
        let chunk = naive_chunk_slices(self, cfg, group)?.min(slices);
        let chunk_elems = (chunk * cfg.seq_q * cfg.seq_kv) as u64;
        let probs = self.create_storage(chunk_elems * 4, "naive probs")?;
        let ds = self.create_storage(chunk_elems * 4, "naive dP / dS")?;
        let delta = self.zeros(&cfg.lse_shape())?;
        let dq = self.zeros(&cfg.q_shape())?;
        let dk = self.zeros(&cfg.kv_shape())?;
        let dv = self.zeros(&cfg.kv_shape())?;
        let base = Params::from_config(cfg);
        let mut dispatches = vec![self.delta_dispatch(cfg, t, &delta)];
        for first in (0..slices).step_by(chunk) {
            let count = chunk.min(slices - first);
            let with = |items: usize| Params {
                slice_base: first as u32,
                slice_count: count as u32,
                total_items: items as u32,
                ..base
            };
            let n_scores = count * cfg.seq_q * cfg.seq_kv;
            let mut push = |kernel, items: usize, buffers| {
                dispatches.push(Dispatch {
                    key: self.kernel_key(kernel, cfg, NO_TILES),
                    params: with(items),
                    buffers,
                    workgroups: items.div_ceil(64) as u32,
                })
            };
            push(
                Kernel::NaiveBwdProbs,
                n_scores,
                vec![t.q.buffer(), t.k.buffer(), t.lse.buffer(), &probs.buffer],
            );
            push(
                Kernel::NaiveBwdDp,
                n_scores,
                vec![t.d_out.buffer(), t.v.buffer(), &ds.buffer],
            );
            push(
                Kernel::NaiveBwdDs,
                n_scores,
                vec![&probs.buffer, delta.buffer(), &ds.buffer],
            );
            push(
                Kernel::NaiveBwdDkDv,
                (count / group) * cfg.seq_kv * cfg.head_dim,
                vec![
                    &probs.buffer,
                    &ds.buffer,
                    t.q.buffer(),
                    t.d_out.buffer(),
                    dk.buffer(),
                    dv.buffer(),
                ],
            );
            push(
                Kernel::NaiveBwdDq,
                count * cfg.seq_q * cfg.head_dim,
                vec![&ds.buffer, t.k.buffer(), dq.buffer()],
            );
        }
        self.run(&dispatches)?;
        Ok(Gradients { dq, dk, dv })
    }
}

struct BwdTensors<'a> {
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    out: &'a Tensor,
    lse: &'a Tensor,
    d_out: &'a Tensor,
}
