//! The attention operation as a burn backend extension: one implementation on burn's cubecl
//! backend (our kernels on the tensors' wgpu buffers) and one for autodiff over it (our
//! backward as the gradient).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::AutodiffBackend;
use burn::backend::{backend_extension, Backend};
use burn::tensor::{DType, FloatDType, Shape, Tensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use cubecl::wgpu::{AutoCompiler, WgpuResource, WgpuServer};
use cubecl_runtime::storage::ManagedResource;
use flash_attn_wgpu::{AttentionConfig, Context, Error, Result, TensorRole};

use crate::registry;

/// Fused attention on burn tensors `[batch, heads, seq, head_dim]`. `cfg` is the library's
/// config for the call, already checked ([`check`]). With the `fusion` feature each method is
/// also a lazy operation of burn's Fusion backend: the `fusion(meta)` functions ([`specs`])
/// give its outputs' shapes and dtypes up front, and the cubecl implementation runs when
/// burn's stream reaches it.
#[backend_extension(Cube, Autodiff, Fusion: cfg(feature = "fusion"))]
pub trait FlashAttentionOps: Backend {
    /// out `[batch, heads_q, seq_q, head_dim]` and lse `[batch, heads_q, seq_q]` (f32).
    #[fusion(meta = specs::forward)]
    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        cfg: AttentionConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// [`flash_attention`](FlashAttentionOps::flash_attention) with an additive bias: its
    /// values are in `cfg.bias`; the tensor is the autodiff graph's parent of `d_bias`.
    #[fusion(meta = specs::forward_biased)]
    fn flash_attention_biased(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        cfg: AttentionConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// dq, dk, dv and d_bias (the bias's shape) of a biased call.
    #[allow(clippy::too_many_arguments)]
    #[fusion(meta = specs::backward_biased)]
    fn flash_attention_biased_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        cfg: AttentionConfig,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );

    /// dq, dk, dv from the forward's out and lse and the gradient of out.
    #[allow(clippy::too_many_arguments)]
    #[fusion(meta = specs::backward)]
    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        cfg: AttentionConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// The outputs of each operation as burn's Fusion backend records them before it runs: the
/// shapes and dtypes the cubecl implementation returns (out and the gradients take their
/// input's, lse is f32 `[batch, heads_q, seq_q]`, d_bias the bias's shape in q's dtype).
#[cfg(feature = "fusion")]
mod specs {
    use burn::backend::fusion::custom::TensorSpec;
    use burn::tensor::{DType, Shape};
    use flash_attn_wgpu::AttentionConfig;

    fn lse(q: &TensorSpec) -> TensorSpec {
        let d = q.shape.to_vec();
        TensorSpec::new(Shape::from(vec![d[0], d[1], d[2]]), DType::F32)
    }

    pub fn forward(
        q: &TensorSpec,
        _: &TensorSpec,
        _: &TensorSpec,
        _: &AttentionConfig,
    ) -> (TensorSpec, TensorSpec) {
        (q.clone(), lse(q))
    }

    pub fn forward_biased(
        q: &TensorSpec,
        _: &TensorSpec,
        _: &TensorSpec,
        _: &TensorSpec,
        _: &AttentionConfig,
    ) -> (TensorSpec, TensorSpec) {
        (q.clone(), lse(q))
    }

    pub fn backward(
        q: &TensorSpec,
        k: &TensorSpec,
        v: &TensorSpec,
        _: &TensorSpec,
        _: &TensorSpec,
        _: &TensorSpec,
        _: &AttentionConfig,
    ) -> (TensorSpec, TensorSpec, TensorSpec) {
        // the gradients in q's dtype (k and v share it: checked)
        let like = |t: &TensorSpec| TensorSpec::new(t.shape.clone(), q.dtype);
        (q.clone(), like(k), like(v))
    }

    pub fn backward_biased(
        q: &TensorSpec,
        k: &TensorSpec,
        v: &TensorSpec,
        out: &TensorSpec,
        lse: &TensorSpec,
        d_out: &TensorSpec,
        cfg: &AttentionConfig,
    ) -> (TensorSpec, TensorSpec, TensorSpec, TensorSpec) {
        let (dq, dk, dv) = backward(q, k, v, out, lse, d_out, cfg);
        let shape = cfg.bias.as_ref().map_or(vec![0; 4], |b| b.shape().to_vec());
        (dq, dk, dv, TensorSpec::new(Shape::from(shape), q.dtype))
    }
}

/// Checks a call before it is dispatched (burn's operations have no error channel): ranks,
/// shapes, dtypes, the device, and the options as the library's config.
pub(crate) fn check(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    options: &crate::Options,
) -> Result<AttentionConfig> {
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    if vd != kd {
        return Err(Error::Shape {
            tensor: TensorRole::V,
            expected: kd.to_vec(),
            got: vd.to_vec(),
        });
    }
    if kd[0] != qd[0] || kd[3] != qd[3] {
        return Err(Error::Shape {
            tensor: TensorRole::K,
            expected: vec![qd[0], kd[1], kd[2], qd[3]],
            got: kd.to_vec(),
        });
    }
    let dtype = lib_dtype(q.dtype())?;
    for (role, t) in [(TensorRole::K, k), (TensorRole::V, v)] {
        if t.dtype() != q.dtype() {
            return Err(Error::DType {
                tensor: role.to_string(),
                expected: dtype,
                got: lib_dtype(t.dtype())?,
            });
        }
    }
    let dev = registry::cube_device(&q.device())?;
    for (role, t) in [(TensorRole::K, k), (TensorRole::V, v)] {
        if registry::cube_device(&t.device())? != dev {
            return Err(Error::InvalidConfig(format!(
                "{role} is on another device than q: {:?} and {dev:?}",
                t.device()
            )));
        }
    }
    registry::for_device(&dev)?;
    options.config(qd, kd)
}

/// [`check`] for a biased call: the bias `[1 or batch, 1 or heads_q, seq_q, seq_kv]` in q's
/// dtype, on q's device, read to the host into the config (with its gradient asked for).
pub(crate) fn check_biased(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    bias: &Tensor<4>,
    options: &crate::Options,
) -> Result<AttentionConfig> {
    let mut cfg = check(q, k, v, options)?;
    let [bb, bh, bq, bk] = bias.dims();
    if !(bb == 1 || bb == cfg.batch)
        || !(bh == 1 || bh == cfg.heads_q)
        || bq != cfg.seq_q
        || bk != cfg.seq_kv
    {
        return Err(Error::Shape {
            tensor: TensorRole::Bias,
            expected: vec![cfg.batch, cfg.heads_q, cfg.seq_q, cfg.seq_kv],
            got: vec![bb, bh, bq, bk],
        });
    }
    if bias.dtype() != q.dtype() {
        return Err(Error::DType {
            tensor: TensorRole::Bias.to_string(),
            expected: lib_dtype(q.dtype())?,
            got: lib_dtype(bias.dtype())?,
        });
    }
    if registry::cube_device(&bias.device())? != registry::cube_device(&q.device())? {
        return Err(Error::InvalidConfig(format!(
            "the bias is on another device than q: {:?}",
            bias.device()
        )));
    }
    // the kernels take the bias as pair data: its values come to the host once per call
    let values = bias
        .clone()
        .cast(DType::F32)
        .into_data()
        .try_to_vec::<f32>()
        .map_err(|e| Error::Device(format!("reading the bias: {e:?}")))?;
    let f32_bias = flash_attn_wgpu::ScoreBias::new((bb, bh, bq, bk), &values)?;
    let b = match lib_dtype(q.dtype())? {
        flash_attn_wgpu::DType::F32 => f32_bias,
        flash_attn_wgpu::DType::F16 => f32_bias.cast::<half::f16>()?,
        flash_attn_wgpu::DType::BF16 => f32_bias.cast::<half::bf16>()?,
    };
    cfg.bias = Some(b.with_grad());
    cfg.validate()?;
    Ok(cfg)
}

fn lib_dtype(d: DType) -> Result<flash_attn_wgpu::DType> {
    match d {
        DType::F32 => Ok(flash_attn_wgpu::DType::F32),
        DType::F16 => Ok(flash_attn_wgpu::DType::F16),
        DType::BF16 => Ok(flash_attn_wgpu::DType::BF16),
        other => Err(Error::Unsupported {
            feature: format!("flash attention on {other:?} tensors"),
            backend: flash_attn_wgpu::Backend::Wgpu,
            reason: "the kernels take f32, f16 and bf16".into(),
        }),
    }
}

fn burn_dtype(d: flash_attn_wgpu::DType) -> FloatDType {
    match d {
        flash_attn_wgpu::DType::F32 => FloatDType::F32,
        flash_attn_wgpu::DType::F16 => FloatDType::F16,
        flash_attn_wgpu::DType::BF16 => FloatDType::BF16,
    }
}

/// A burn tensor's buffer seen by our context: the library tensor (a view in place) and the
/// cubecl resource that keeps burn from reusing the memory while we hold it.
struct Bound {
    t: flash_attn_wgpu::Tensor,
    res: ManagedResource<WgpuResource>,
}

/// What must live until the submission that uses it: burn's allocations (held, burn neither
/// frees nor reuses them, and its queue writes into reused memory would run before our
/// submission) and our result tensors (a dropped tensor's buffer is destroyed).
type Keep = Vec<Box<dyn std::any::Any>>;

impl Bound {
    fn keep(self, keep: &mut Keep) -> flash_attn_wgpu::Tensor {
        keep.push(Box::new(self.res));
        self.t
    }
}

fn resource(t: &CubeTensor) -> Result<ManagedResource<WgpuResource>> {
    t.client
        .get_resource::<WgpuServer<AutoCompiler>>(t.handle.clone())
        .map_err(|e| Error::Device(format!("burn tensor's wgpu buffer: {e}")))
}

/// Reads `t` in place as a library tensor. burn `[batch, heads, seq, d]` (`heads_first`) is
/// our `[batch, seq, heads, d]` with the middle strides swapped; lse `[batch, heads, seq]`
/// is ours as is. A tensor burn keeps tiled, or whose last dimension is not contiguous, is
/// made contiguous first.
fn bind(ctx: &Context, t: CubeTensor, heads_first: bool) -> Result<Bound> {
    let plain = !t.meta.is_tiled() && t.meta.strides().last() == Some(&1);
    let t = if plain {
        t
    } else {
        burn_cubecl::kernel::into_contiguous(t)
    };
    let dtype = lib_dtype(t.dtype)?;
    let (dims, strides): (Vec<usize>, Vec<usize>) =
        (t.meta.shape().to_vec(), t.meta.strides().to_vec());
    let (shape, strides) = if heads_first {
        (
            vec![dims[0], dims[2], dims[1], dims[3]],
            vec![strides[0], strides[2], strides[1], strides[3]],
        )
    } else {
        (dims, strides)
    };
    let res = resource(&t)?;
    let r = res.resource();
    let lib = ctx.tensor_from_buffer(&r.buffer, r.offset, &shape, Some(&strides), dtype)?;
    Ok(Bound { t: lib, res })
}

/// A new burn tensor of `shape` filled on the device from our `src` (row-major, same shape):
/// the copy is recorded into `enc`.
fn to_burn(
    enc: &mut flash_attn_wgpu::wgpu::CommandEncoder,
    like: &CubeTensor,
    src: &flash_attn_wgpu::Tensor,
    keep: &mut Keep,
) -> Result<CubeTensor> {
    let dst = CubeBackend::float_empty(
        Shape::from(src.shape().to_vec()),
        &like.device,
        burn_dtype(src.dtype()),
    );
    let res = resource(&dst)?;
    let r = res.resource();
    let bytes = (src.len() * src.dtype().size_bytes()) as u64;
    let size = bytes.next_multiple_of(4);
    if size > r.size || size > src.size_bytes() {
        return Err(Error::Device(format!(
            "internal: copying {size} bytes into a burn allocation of {} bytes",
            r.size
        )));
    }
    enc.copy_buffer_to_buffer(src.buffer(), src.offset(), &r.buffer, r.offset, size);
    keep.push(Box::new(res));
    Ok(dst)
}

/// Runs `record` (our passes, then copies into burn's tensors) in one submission on the queue
/// burn shares with us, after burn's pending work.
fn submit<R>(
    ctx: &Context,
    like: &CubeTensor,
    record: impl FnOnce(&mut flash_attn_wgpu::wgpu::CommandEncoder, &mut Keep) -> Result<R>,
) -> Result<R> {
    // burn's kernels that wrote our inputs are in its stream, not yet on the queue
    like.client
        .flush()
        .map_err(|e| Error::Device(format!("flushing burn's queued work: {e}")))?;
    let mut enc = ctx.device().create_command_encoder(&Default::default());
    let mut keep = Keep::new();
    let r = record(&mut enc, &mut keep)?;
    ctx.queue().submit([enc.finish()]);
    drop(keep);
    Ok(r)
}

fn swap_heads(t: CubeTensor) -> CubeTensor {
    CubeBackend::float_swap_dims(t, 1, 2)
}

fn forward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    cfg: &AttentionConfig,
) -> Result<(CubeTensor, CubeTensor)> {
    let ctx = registry::for_device(&q.device)?;
    let like = q.clone();
    let (out, lse) = submit(&ctx, &like, |enc, keep| {
        let q = bind(&ctx, q, true)?.keep(keep);
        let k = bind(&ctx, k, true)?.keep(keep);
        let v = bind(&ctx, v, true)?.keep(keep);
        let f = ctx.record_forward(enc, cfg, &q, &k, &v)?;
        let r = (
            to_burn(enc, &like, &f.out, keep)?,
            to_burn(enc, &like, &f.lse, keep)?,
        );
        keep.extend([Box::new(f) as Box<dyn std::any::Any>, Box::new((q, k, v))]);
        Ok(r)
    })?;
    Ok((swap_heads(out), lse))
}

#[allow(clippy::too_many_arguments)]
fn backward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    out: CubeTensor,
    lse: CubeTensor,
    d_out: CubeTensor,
    cfg: &AttentionConfig,
) -> Result<(CubeTensor, CubeTensor, CubeTensor, Option<CubeTensor>)> {
    let ctx = registry::for_device(&q.device)?;
    let like = q.clone();
    let (dq, dk, dv, d_bias) = submit(&ctx, &like, |enc, keep| {
        let q = bind(&ctx, q, true)?.keep(keep);
        let k = bind(&ctx, k, true)?.keep(keep);
        let v = bind(&ctx, v, true)?.keep(keep);
        let out = bind(&ctx, out, true)?.keep(keep);
        let lse = bind(&ctx, lse, false)?.keep(keep);
        let d_out = bind(&ctx, d_out, true)?.keep(keep);
        let g = ctx.record_backward(enc, cfg, &q, &k, &v, &out, &lse, &d_out)?;
        let r = (
            to_burn(enc, &like, &g.dq, keep)?,
            to_burn(enc, &like, &g.dk, keep)?,
            to_burn(enc, &like, &g.dv, keep)?,
            // the bias's own shape and layout: no swap
            g.d_bias
                .as_ref()
                .map(|d| to_burn(enc, &like, d, keep))
                .transpose()?,
        );
        keep.extend([
            Box::new(g) as Box<dyn std::any::Any>,
            Box::new((q, k, v, out, lse, d_out)),
        ]);
        Ok(r)
    })?;
    Ok((swap_heads(dq), swap_heads(dk), swap_heads(dv), d_bias))
}

impl FlashAttentionOps for CubeBackend {
    fn flash_attention(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        cfg: AttentionConfig,
    ) -> (CubeTensor, CubeTensor) {
        // the public entry points checked the call; what fails here is the device
        forward(q, k, v, &cfg).unwrap_or_else(|e| panic!("flash attention forward: {e}"))
    }

    fn flash_attention_backward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        out: CubeTensor,
        lse: CubeTensor,
        d_out: CubeTensor,
        cfg: AttentionConfig,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        let (dq, dk, dv, _) = backward(q, k, v, out, lse, d_out, &cfg)
            .unwrap_or_else(|e| panic!("flash attention backward: {e}"));
        (dq, dk, dv)
    }

    fn flash_attention_biased(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        _bias: CubeTensor,
        cfg: AttentionConfig,
    ) -> (CubeTensor, CubeTensor) {
        forward(q, k, v, &cfg).unwrap_or_else(|e| panic!("flash attention forward: {e}"))
    }

    fn flash_attention_biased_backward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        out: CubeTensor,
        lse: CubeTensor,
        d_out: CubeTensor,
        cfg: AttentionConfig,
    ) -> (CubeTensor, CubeTensor, CubeTensor, CubeTensor) {
        match backward(q, k, v, out, lse, d_out, &cfg) {
            Ok((dq, dk, dv, Some(db))) => (dq, dk, dv, db),
            Ok(_) => panic!("flash attention backward: internal: a biased call without d_bias"),
            Err(e) => panic!("flash attention backward: {e}"),
        }
    }
}

/// What the gradient node saves: q, k, v, out and lse (not the probabilities), and the call.
type Saved<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    AttentionConfig,
);

/// The gradient node of a call with `N` differentiable inputs: q, k, v, and the bias when
/// `N` is 4. burn's autodiff runs the fused backward through it.
#[derive(Debug)]
struct FlashNode<const N: usize>;

impl<B: Backend + FlashAttentionOps, const N: usize> Backward<B, N> for FlashNode<N> {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = grads.consume::<B>(&ops.node);
        let (q, k, v, out, lse, cfg) = ops.state;
        let g = if N == 4 {
            let (dq, dk, dv, db) =
                B::flash_attention_biased_backward(q, k, v, out, lse, d_out, cfg);
            vec![dq, dk, dv, db]
        } else {
            let (dq, dk, dv) = B::flash_attention_backward(q, k, v, out, lse, d_out, cfg);
            vec![dq, dk, dv]
        };
        for (node, grad) in ops.parents.into_iter().zip(g) {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// The autodiff side of a forward: `out` joins the graph through a [`FlashNode`] over
/// `nodes`; lse is returned without a gradient.
fn tracked<B: Backend + FlashAttentionOps, C: CheckpointStrategy, const N: usize>(
    nodes: [NodeGuard; N],
    (q, k, v): (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>),
    (out, lse): (FloatTensor<B>, FloatTensor<B>),
    cfg: AttentionConfig,
) -> (FloatTensor<Autodiff<B, C>>, FloatTensor<Autodiff<B, C>>) {
    let out = match FlashNode::<N>
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((q, k, v, out.clone(), lse.clone(), cfg), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    (out, Autodiff::<B, C>::from_inner(lse))
}

impl<B: Backend + FlashAttentionOps, C: CheckpointStrategy> FlashAttentionOps for Autodiff<B, C> {
    fn flash_attention_biased(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        cfg: AttentionConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let nodes = [q.node(), k.node(), v.node(), bias.node()];
        let (q, k, v) = (q.into_primitive(), k.into_primitive(), v.into_primitive());
        let b = bias.into_primitive();
        let res = B::flash_attention_biased(q.clone(), k.clone(), v.clone(), b, cfg.clone());
        tracked::<B, C, 4>(nodes, (q, k, v), res, cfg)
    }

    fn flash_attention_biased_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        cfg: AttentionConfig,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let (dq, dk, dv, db) = B::flash_attention_biased_backward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            out.into_primitive(),
            lse.into_primitive(),
            d_out.into_primitive(),
            cfg,
        );
        (
            Self::from_inner(dq),
            Self::from_inner(dk),
            Self::from_inner(dv),
            Self::from_inner(db),
        )
    }

    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        cfg: AttentionConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let nodes = [q.node(), k.node(), v.node()];
        let (q, k, v) = (q.into_primitive(), k.into_primitive(), v.into_primitive());
        let res = B::flash_attention(q.clone(), k.clone(), v.clone(), cfg.clone());
        tracked::<B, C, 3>(nodes, (q, k, v), res, cfg)
    }

    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        cfg: AttentionConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // the gradients as values (no second-order graph through them)
        let (dq, dk, dv) = B::flash_attention_backward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            out.into_primitive(),
            lse.into_primitive(),
            d_out.into_primitive(),
            cfg,
        );
        (
            Self::from_inner(dq),
            Self::from_inner(dk),
            Self::from_inner(dv),
        )
    }
}
