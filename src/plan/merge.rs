//! Planning an exact merge of partial attention results over disjoint key shards
//! (`shaders/merge.wgsl`): one elementwise dispatch per shard, folding it into an f32 running
//! result, so that rounding to a half dtype happens once, at the end.

use super::{BufRef, OutputSpec, Plan, PlanEnv, ScratchSpec, Step};
use crate::dtype::{DType, ElemFormat};
use crate::error::{Error, Result, TensorRole};
use crate::kernels::wgsl::ELEMENTWISE_WORKGROUP;
use crate::kernels::{Kernel, KernelKey, Params};

/// Plans the merge of `shards` partial results shaped `out_shape` (`[batch, seq_q, heads_q,
/// head_dim]`, in `dtype`; their lse f32 `[batch, heads_q, seq_q]`). Inputs: shard i's out is
/// `Input(2 i)`, its lse `Input(2 i + 1)`. Outputs: out (`dtype`) and lse (f32).
pub fn merge(out_shape: [usize; 4], shards: usize, dtype: DType, env: &PlanEnv) -> Result<Plan> {
    let [batch, seq_q, heads, head_dim] = out_shape;
    let rows = batch * heads * seq_q;
    if shards == 0 {
        return Err(Error::invalid("merge: at least one shard, got none"));
    }
    let elements = merge_elements(out_shape)? as usize;
    let key = KernelKey {
        elem: ElemFormat::new(dtype, env.tuning.half_storage),
        ..KernelKey::plain(Kernel::Merge)
    };
    let params = Params {
        batch: batch as u32,
        seq_q: seq_q as u32,
        heads_q: heads as u32,
        head_dim: head_dim as u32,
        total_items: elements as u32,
        ..Default::default()
    };
    // scratch 0: the running result in f32; 1 and 2: its lse, written and read in turn
    let lse_scratch = |i: usize| BufRef::Scratch(1 + i % 2);
    let steps = (0..shards)
        .map(|i| Step {
            key,
            params: Params {
                resume: u32::from(i > 0),
                merge_last: u32::from(i + 1 == shards),
                ..params
            },
            buffers: vec![
                BufRef::Input(2 * i),
                BufRef::Input(2 * i + 1),
                lse_scratch(i + 1),
                BufRef::Scratch(0),
                if i + 1 == shards {
                    BufRef::Output(1)
                } else {
                    lse_scratch(i)
                },
                BufRef::Output(0),
            ],
            windows: Vec::new(),
            workgroups: elements.div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
        })
        .collect();
    Ok(Plan {
        inputs: (0..shards)
            .flat_map(|_| [TensorRole::Out, TensorRole::Lse])
            .collect(),
        outputs: vec![
            OutputSpec {
                role: TensorRole::Out,
                shape: out_shape.to_vec(),
                dtype,
            },
            OutputSpec {
                role: TensorRole::Lse,
                shape: vec![batch, heads, seq_q],
                dtype: DType::F32,
            },
        ],
        scratch: vec![
            ScratchSpec {
                label: "merge accumulator",
                bytes: elements as u64 * 4,
            },
            ScratchSpec {
                label: "merge lse",
                bytes: rows as u64 * 4,
            },
            ScratchSpec {
                label: "merge lse",
                bytes: rows as u64 * 4,
            },
        ],
        steps,
        extras: Vec::new(),
        pairs: Vec::new(),
        kept_grads: None,
        copies: Vec::new(),
    })
}

/// The elements of a merge's out, which its kernels count in 32 bits: a `DeviceLimit` past
/// that, on every backend.
pub fn merge_elements(out_shape: [usize; 4]) -> Result<u32> {
    let elements = out_shape.iter().product::<usize>();
    u32::try_from(elements).map_err(|_| Error::DeviceLimit {
        what: "merge: elements of out".into(),
        needed: elements as u64,
        limit: u32::MAX as u64,
        hint: "merge the batch (or the heads) in parts".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::HalfStorage;
    use crate::kernels::Variant;

    fn env() -> PlanEnv {
        crate::plan::test_env(Variant::Rows, HalfStorage::Packed)
    }

    #[test]
    fn each_shard_is_one_step_reading_the_lse_the_step_before_wrote() {
        let p = merge([2, 5, 3, 8], 3, DType::F16, &env()).unwrap();
        assert_eq!(p.steps.len(), 3);
        assert_eq!(p.inputs.len(), 6);
        let resumes: Vec<u32> = p.steps.iter().map(|s| s.params.resume).collect();
        assert_eq!(resumes, vec![0, 1, 1]);
        for (i, s) in p.steps.iter().enumerate() {
            assert_eq!(s.buffers[0], BufRef::Input(2 * i));
            assert_eq!(s.buffers[1], BufRef::Input(2 * i + 1));
            // never the same buffer read-only and read-write in one dispatch
            assert_ne!(s.buffers[2], s.buffers[4]);
            if i > 0 {
                assert_eq!(s.buffers[2], p.steps[i - 1].buffers[4], "step {i}");
            }
            assert_eq!(s.workgroups, (2 * 5 * 3 * 8u32).div_ceil(64));
        }
        assert_eq!(p.steps[2].buffers[4], BufRef::Output(1));
        assert_eq!(p.outputs[0].dtype, DType::F16);
        assert_eq!(p.outputs[1].shape, vec![2, 3, 5]);
        // one shard: a single step that writes the outputs
        let one = merge([1, 1, 1, 4], 1, DType::F32, &env()).unwrap();
        assert_eq!(one.steps.len(), 1);
        assert_eq!(one.steps[0].buffers[4], BufRef::Output(1));
        assert!(merge([1, 1, 1, 4], 0, DType::F32, &env()).is_err());
    }
}
