//! Forward pass: validation, planning per algorithm, dispatch.

use crate::config::{Algorithm, AttentionConfig};
use crate::context::{Context, Dispatch};
use crate::error::{Error, Result, TensorRole};
use crate::kernels::{Kernel, Params, Tiles};
use crate::tensor::Tensor;

/// Device-resident result of a forward pass.
#[derive(Debug)]
pub struct Forward {
    /// `[batch, seq_q, heads_q, head_dim]`
    pub out: Tensor,
    /// `[batch, heads_q, seq_q]`, natural log; `-inf` for rows that see no key.
    pub lse: Tensor,
}

/// Host copy of a forward pass's result.
#[derive(Debug, Clone, PartialEq)]
pub struct HostForward {
    pub out: Vec<f32>,
    pub lse: Vec<f32>,
}

pub(crate) fn check_shape(role: TensorRole, t: &Tensor, expected: &[usize]) -> Result<()> {
    if t.shape() != expected {
        return Err(Error::Shape {
            tensor: role,
            expected: expected.to_vec(),
            got: t.shape().to_vec(),
        });
    }
    Ok(())
}

pub(crate) fn check_slice(role: TensorRole, data: &[f32], expected: &[usize]) -> Result<()> {
    let n: usize = expected.iter().product();
    if data.len() != n {
        return Err(Error::SliceLength {
            tensor: role,
            expected: n,
            got: data.len(),
            shape: format!("{expected:?}"),
        });
    }
    Ok(())
}

pub(crate) const NO_TILES: Tiles = Tiles::ONE;

/// How the naive path splits its (batch, head) slices so that each chunk's seq_q x seq_kv
/// buffers fit one storage binding.
pub(crate) fn naive_chunk_slices(
    ctx: &Context,
    cfg: &AttentionConfig,
    unit_slices: usize,
) -> Result<usize> {
    let limit = ctx
        .limits
        .max_storage_buffer_binding_size
        .min(ctx.limits.max_buffer_size)
        .min(u32::MAX as u64);
    let unit_bytes = (cfg.seq_q as u64) * (cfg.seq_kv as u64) * 4 * unit_slices as u64;
    if unit_bytes > limit {
        return Err(Error::DeviceLimit {
            what: format!(
                "Algorithm::Naive's seq_q x seq_kv score matrix ({} x {} f32{})",
                cfg.seq_q,
                cfg.seq_kv,
                if unit_slices > 1 {
                    format!(", {unit_slices} query heads of one kv group")
                } else {
                    String::new()
                }
            ),
            needed: unit_bytes,
            limit,
            hint: "Algorithm::Tiled never materializes that matrix and has no such limit".into(),
        });
    }
    Ok(((limit / unit_bytes) as usize).max(1) * unit_slices)
}

impl Context {
    /// Forward pass on device tensors. q: `[batch, seq_q, heads_q, head_dim]`, k and v:
    /// `[batch, seq_kv, heads_kv, head_dim]`.
    pub fn forward(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Forward> {
        cfg.validate()?;
        check_shape(TensorRole::Q, q, &cfg.q_shape())?;
        check_shape(TensorRole::K, k, &cfg.kv_shape())?;
        check_shape(TensorRole::V, v, &cfg.kv_shape())?;
        match cfg.algorithm {
            Algorithm::Tiled => self.forward_tiled(cfg, q, k, v),
            Algorithm::Naive => self.forward_naive(cfg, q, k, v),
        }
    }

    /// Forward pass on host slices; uploads, runs, downloads.
    pub fn forward_host(
        &self,
        cfg: &AttentionConfig,
        q: &[f32],
        k: &[f32],
        v: &[f32],
    ) -> Result<HostForward> {
        cfg.validate()?;
        check_slice(TensorRole::Q, q, &cfg.q_shape())?;
        check_slice(TensorRole::K, k, &cfg.kv_shape())?;
        check_slice(TensorRole::V, v, &cfg.kv_shape())?;
        let q = self.upload(q, &cfg.q_shape())?;
        let k = self.upload(k, &cfg.kv_shape())?;
        let v = self.upload(v, &cfg.kv_shape())?;
        let f = self.forward(cfg, &q, &k, &v)?;
        Ok(HostForward {
            out: self.download(&f.out)?,
            lse: self.download(&f.lse)?,
        })
    }

    fn forward_tiled(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Forward> {
        let kernel = self.variant().forward();
        let tiles = self.tiles_for(kernel, cfg.head_dim)?;
        let out = self.zeros(&cfg.q_shape())?;
        let lse = self.zeros(&cfg.lse_shape())?;
        let n_q_tiles = cfg.seq_q.div_ceil(tiles.br as usize);
        let total = n_q_tiles * cfg.heads_q * cfg.batch;
        let mut params = Params::from_config(cfg);
        params.n_q_tiles = n_q_tiles as u32;
        params.n_kv_tiles = cfg.seq_kv.div_ceil(tiles.bc as usize) as u32;
        params.total_wg = total as u32;
        self.run(&[Dispatch {
            key: self.kernel_key(kernel, cfg, tiles),
            params,
            buffers: vec![q.buffer(), k.buffer(), v.buffer(), out.buffer(), lse.buffer()],
            workgroups: total as u32,
        }])?;
        Ok(Forward { out, lse })
    }

    fn forward_naive(
        &self,
        cfg: &AttentionConfig,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Forward> {
        let slices = cfg.batch * cfg.heads_q;
        let chunk = naive_chunk_slices(self, cfg, 1)?.min(slices);
        let chunk_elems = (chunk * cfg.seq_q * cfg.seq_kv) as u64;
        let scores = self.create_storage(chunk_elems * 4, "naive scores")?;
        let probs = self.create_storage(chunk_elems * 4, "naive probs")?;
        let out = self.zeros(&cfg.q_shape())?;
        let lse = self.zeros(&cfg.lse_shape())?;
        let base = Params::from_config(cfg);
        let mut dispatches = Vec::new();
        for first in (0..slices).step_by(chunk) {
            let count = chunk.min(slices - first);
            let rows = count * cfg.seq_q;
            let with = |items: usize, wg: usize| Params {
                slice_base: first as u32,
                slice_count: count as u32,
                total_items: items as u32,
                total_wg: wg as u32,
                ..base
            };
            let n_scores = rows * cfg.seq_kv;
            dispatches.push(Dispatch {
                key: self.kernel_key(Kernel::NaiveScores, cfg, NO_TILES),
                params: with(n_scores, n_scores.div_ceil(64)),
                buffers: vec![q.buffer(), k.buffer(), &scores.buffer],
                workgroups: n_scores.div_ceil(64) as u32,
            });
            dispatches.push(Dispatch {
                key: self.kernel_key(Kernel::NaiveSoftmax, cfg, NO_TILES),
                params: with(rows, rows),
                buffers: vec![&scores.buffer, &probs.buffer, lse.buffer()],
                workgroups: rows as u32,
            });
            let n_out = rows * cfg.head_dim;
            dispatches.push(Dispatch {
                key: self.kernel_key(Kernel::NaivePv, cfg, NO_TILES),
                params: with(n_out, n_out.div_ceil(64)),
                buffers: vec![&probs.buffer, v.buffer(), out.buffer()],
                workgroups: n_out.div_ceil(64) as u32,
            });
        }
        self.run(&dispatches)?;
        Ok(Forward { out, lse })
    }
}
