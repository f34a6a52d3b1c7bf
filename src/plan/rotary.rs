//! The rotary embedding's plan (module [`rotary`](crate::rotary)): one element-parallel step
//! from a `[batch, rows, heads, head_dim]` tensor to a new one of its shape and dtype.

use super::{BufRef, OutputSpec, Plan, PlanEnv, Step};
use crate::dtype::{DType, ElemFormat};
use crate::error::{Error, Result, TensorRole};
use crate::kernels::wgsl::ELEMENTWISE_WORKGROUP;
use crate::kernels::{Kernel, KernelKey, Params};
use crate::rotary::{Positions, RotaryDims};

/// Plans the rotation of `role` (inputs: the tensor, then the cos and sin tables; the positions
/// of each batch's first row go in as the plan's pair data). A tensor of 2^32 elements or more
/// is a typed error (the kernel indexes with 32 bits).
pub fn rotary(
    (role, shape, dtype): (TensorRole, [usize; 4], DType),
    dims: RotaryDims,
    interleaved: bool,
    positions: &Positions,
    env: &PlanEnv,
) -> Result<Plan> {
    let [_, rows, heads, head_dim] = shape;
    let n: usize = shape.iter().product();
    let total = u32::try_from(n).map_err(|_| {
        Error::invalid(format!(
            "{role} of shape {shape:?} holds {n} elements; the rotary kernel indexes at most \
             2^32 - 1"
        ))
    })?;
    let key = KernelKey {
        elem: ElemFormat::new(dtype, env.tuning.half_storage),
        ..KernelKey::plain(Kernel::Rotary)
    };
    let params = Params {
        total_items: total,
        seq_q: rows as u32,
        heads_q: heads as u32,
        head_dim: head_dim as u32,
        rotary_dim: dims.rotary_dim as u32,
        rotary_interleaved: u32::from(interleaved),
        rotary_step: positions.step as u32,
        ..Default::default()
    };
    Ok(Plan {
        inputs: vec![role, TensorRole::RotaryCos, TensorRole::RotarySin],
        outputs: vec![OutputSpec {
            role,
            shape: shape.to_vec(),
            dtype,
        }],
        scratch: Vec::new(),
        extras: Vec::new(),
        pairs: positions.start.iter().map(|&p| p as u32).collect(),
        kept_grads: None,
        copies: Vec::new(),
        steps: (n > 0)
            .then(|| Step {
                key,
                params,
                buffers: vec![
                    BufRef::Input(0),
                    BufRef::Input(1),
                    BufRef::Input(2),
                    BufRef::Pairs,
                    BufRef::Output(0),
                ],
                windows: Vec::new(),
                workgroups: total.div_ceil(ELEMENTWISE_WORKGROUP),
            })
            .into_iter()
            .collect(),
    })
}
