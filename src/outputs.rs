//! What the calls return: the forward's out and lse, the backward's gradients, on the device
//! (`X`: the backend's tensor type) and as host copies. A file of its own, below both the
//! backends and the `AttentionBackend` trait, so that neither imports the other for them.

use crate::tensor::Tensor;

/// Device-resident forward results. `out` is shaped and typed like q; `lse` is f32
/// `[batch, heads_q, seq_q]` (natural log). `X` is the backend's tensor type: [`Tensor`] on
/// wgpu, `CudaTensor` on CUDA.
#[derive(Debug)]
pub struct Forward<X = Tensor> {
    /// The attention output, shaped and typed like q.
    pub out: X,
    /// Per-row logsumexp, `[batch, heads_q, seq_q]`, f32 (natural log).
    pub lse: X,
}

/// Host copy of the forward results.
#[derive(Debug, Clone, PartialEq)]
pub struct HostForward<T = f32> {
    /// The attention output, q's layout.
    pub out: Vec<T>,
    /// Per-row logsumexp, `[batch, heads_q, seq_q]`.
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

/// Device-resident gradients. dq is shaped like q; dk and dv like k and v; all in q's dtype.
/// With sinks (`AttentionConfig::sinks`), `d_sinks` (`[heads_q]`, f32); with a bias that asks
/// for it (`ScoreBias::grad`), `d_bias` (the bias's shape and dtype); with a trainable captured
/// tensor (`ScoreMod::with_trainable`), `d_table` (`[len]`, f32). `X` is the backend's
/// tensor type. Non-exhaustive: a new gradient is a new field, which no caller's code breaks
/// on (the library makes these; callers read them).
#[derive(Debug)]
#[non_exhaustive]
pub struct Gradients<X = Tensor> {
    /// The queries' gradient, shaped like q.
    pub dq: X,
    /// The keys' gradient, shaped like k (summed over each kv head's query group).
    pub dk: X,
    /// The values' gradient, shaped like v.
    pub dv: X,
    /// With sinks: their gradient, `[heads_q]`, f32.
    pub d_sinks: Option<X>,
    /// With a bias that asks for it (`ScoreBias::grad`): its gradient, the bias's shape and dtype.
    pub d_bias: Option<X>,
    /// With a trainable captured tensor (`ScoreMod::with_trainable`): its gradient, the
    /// tensor's length, f32.
    pub d_table: Option<X>,
}

/// Host copy of the gradients. Non-exhaustive, as [`Gradients`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct HostGradients<T = f32> {
    /// The queries' gradient, q's layout.
    pub dq: Vec<T>,
    /// The keys' gradient, k's layout.
    pub dk: Vec<T>,
    /// The values' gradient, v's layout.
    pub dv: Vec<T>,
    /// With sinks: `[heads_q]`.
    pub d_sinks: Option<Vec<f32>>,
    /// With a bias that asks for it: the bias's shape.
    pub d_bias: Option<Vec<T>>,
    /// With a trainable captured tensor: its gradient (`[len]`).
    pub d_table: Option<Vec<f32>>,
}
