//! Planning: what a call will dispatch, as data. A `Plan` is a pure function of the config,
//! the dtype, the device's capabilities and the tuning: which kernels (keys), with which
//! parameters and grids, reading and writing which buffers (the call's inputs, the outputs it
//! creates, and scratch). It can be unit-tested without a GPU, recorded into any command
//! encoder (`record`), or replayed elsewhere.

mod backward;
mod backward_buffers;
mod block;
pub mod decode;
mod forward;
pub(crate) mod head_dims;
pub(crate) mod mask_blocks;
pub mod merge;
mod naive;
pub mod quantized;
mod rotary;
pub mod route;
pub mod split;
mod step;

pub use backward::backward;
pub use forward::forward;
pub use mask_blocks::mask_blocks;
pub use merge::merge;
pub use rotary::rotary;
#[cfg(feature = "cuda")]
pub(crate) use route::check_bias_dtype;
pub(crate) use route::tiles_for;

use crate::config::AttentionConfig;
use crate::dtype::{DType, ElemFormat};
use crate::error::TensorRole;
use crate::kernels::wgsl::ELEMENTWISE_WORKGROUP;
use crate::kernels::Tuning;
use crate::kernels::{DeviceCaps, Kernel, KernelKey, Params};

/// What planning needs to know about the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanEnv {
    pub caps: DeviceCaps,
    pub tuning: Tuning,
    /// Largest storage binding (and buffer) in bytes, capped at u32::MAX.
    pub max_binding_bytes: u64,
    /// Alignment of a binding's byte offset into its buffer (min_storage_buffer_offset_alignment).
    pub offset_align: u64,
    /// The modifier bits compiled into pipelines rather than read at run time
    /// ([`crate::kernels::flags::COMPILED`] unless the environment says otherwise).
    pub compiled_flags: u32,
}

/// A buffer a step binds: one of the call's inputs, an output the call creates, or scratch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufRef {
    Input(usize),
    Output(usize),
    Scratch(usize),
    /// The call's extras (`Plan::extras`), bound as a uniform array (`KernelKey::uses_extras`).
    Extras,
    /// The call's pair data (`Plan::pairs`: boolean mask bits, bias entries), a read-only
    /// storage binding after the extras (`KernelKey::uses_pairs`).
    Pairs,
}

/// A tensor the call creates (zero-filled before the first step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSpec {
    pub role: TensorRole,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

/// A zero-filled f32 buffer the call needs only while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScratchSpec {
    pub label: &'static str,
    pub bytes: u64,
}

/// The bytes of a buffer a binding covers, when not the whole buffer (`split`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// A multiple of `PlanEnv::offset_align`.
    pub offset: u64,
    pub size: u64,
}

/// One dispatch: the pipeline, its parameters, its buffers (bindings 1.. in order), the
/// window each is bound through (empty, or `None` for one: the whole buffer) and how many
/// workgroups do work.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub key: KernelKey,
    pub params: Params,
    pub buffers: Vec<BufRef>,
    pub windows: Vec<Option<Window>>,
    pub workgroups: u32,
}

impl Step {
    /// The window binding `i` is bound through, `None` for the whole buffer.
    pub fn window(&self, i: usize) -> Option<Window> {
        self.windows.get(i).copied().flatten()
    }
}

/// Everything one call dispatches, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The call's inputs, in the order `BufRef::Input` counts them.
    pub inputs: Vec<TensorRole>,
    pub outputs: Vec<OutputSpec>,
    pub scratch: Vec<ScratchSpec>,
    pub steps: Vec<Step>,
    /// Per-head and per-batch values the kernels read (`kernels::params::extras`: ALiBi
    /// slopes, sinks, key lengths) as 32-bit words, uploaded once per call into a uniform
    /// buffer of `EXTRAS_WORDS` words; empty if none.
    pub extras: Vec<u32>,
    /// The pair data: the boolean mask's bits ([`crate::BoolMask::words`]), then the bias's
    /// entries ([`crate::ScoreBias::words`], from word `Params::bias_base`), uploaded once per
    /// call into one storage buffer; empty without either.
    pub pairs: Vec<u32>,
    /// The scratch buffer (its index) where the steps with `KernelKey::bias_grad` keep each
    /// pair's gradient for d_bias, bound after the pair data; `None` unless d_bias is asked
    /// for.
    pub kept_grads: Option<usize>,
    /// Buffer-to-buffer copies recorded before the first step, in order (a KV cache's
    /// append: `Context::forward_with_kvcache`). Replays (`Plan::replay`) do not carry them.
    pub copies: Vec<BufferCopy>,
}

/// A copy of `size` bytes from `src` at `src_offset` to `dst` at `dst_offset`, each a multiple
/// of 4 (wgpu's copy alignment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferCopy {
    pub src: BufRef,
    pub src_offset: u64,
    pub dst: BufRef,
    pub dst_offset: u64,
    pub size: u64,
}

impl Plan {
    /// Binds the call's extras to every step whose pipeline reads them (the binding after its
    /// storage bindings), the pair data (mask bits, bias entries, block table) to every step
    /// whose pipeline reads MASK, BIAS or PAGED (the binding after that), and the bias gradients' scratch to every
    /// step that keeps them (`KernelKey::bias_grad`, last), once all steps are planned. More than `EXTRAS_WORDS` values
    /// (batch x heads_q ALiBi slopes plus heads_q sinks) is a `DeviceLimit` error naming them.
    pub(crate) fn attach_extras(&mut self, cfg: &AttentionConfig) -> crate::Result<()> {
        self.extras = crate::registry::params::extras(cfg);
        let limit = crate::kernels::wgsl::EXTRAS_WORDS as u64;
        if self.extras.len() as u64 > limit {
            return Err(crate::Error::DeviceLimit {
                what: "ALiBi slopes, sinks, key lengths, block-mask bits, varlen boundaries and \
                       a score_mod's captured tensors (one uniform array of 32-bit words)"
                    .into(),
                needed: self.extras.len() as u64 * 4,
                limit: limit * 4,
                hint: "split the batch (or a varlen call's sequences into several calls), pass \
                       one slope per head ([heads_q]), or share the block mask across batches \
                       or heads (a dimension of 1), or take larger blocks"
                    .into(),
            });
        }
        self.pairs = crate::registry::params::pair_words(cfg);
        // a pipeline's bindings depend on its kernel and compiled bits alone, so a call
        // without values for one it declares binds a word of zeros there
        if self.extras.is_empty() && self.steps.iter().any(|s| s.key.uses_extras()) {
            self.extras = vec![0];
        }
        if self.pairs.is_empty() && self.steps.iter().any(|s| s.key.uses_pairs()) {
            self.pairs = vec![0];
        }
        let kept_grads = self.kept_grads.map(BufRef::Scratch);
        for s in &mut self.steps {
            for r in [
                s.key.uses_extras().then_some(BufRef::Extras),
                s.key.uses_pairs().then_some(BufRef::Pairs),
                kept_grads.filter(|_| s.key.binds_kept()),
            ]
            .into_iter()
            .flatten()
            {
                s.buffers.push(r);
                if !s.windows.is_empty() {
                    s.windows.push(None);
                }
            }
        }
        Ok(())
    }

    /// Bytes of device memory the call's outputs take.
    pub fn output_bytes(&self) -> u64 {
        (0..self.outputs.len())
            .map(|i| self.buffer_bytes(BufRef::Output(i), &[]))
            .sum()
    }

    /// Bytes of the buffer `r` names: an input's from `input_bytes`, an output's or a
    /// scratch buffer's as the call will allocate it.
    pub fn buffer_bytes(&self, r: BufRef, input_bytes: &[u64]) -> u64 {
        match r {
            BufRef::Input(i) => input_bytes.get(i).copied().unwrap_or(u64::MAX),
            BufRef::Output(i) => {
                let o = &self.outputs[i];
                o.dtype
                    .buffer_bytes(o.shape.iter().product::<usize>() as u64)
                    .unwrap_or(u64::MAX)
            }
            BufRef::Scratch(i) => self.scratch[i].bytes.max(4).next_multiple_of(4),
            BufRef::Extras => crate::kernels::wgsl::EXTRAS_WORDS as u64 * 4,
            BufRef::Pairs => (self.pairs.len() as u64 * 4).max(4),
        }
    }

    /// Every binding of every step (a window, or a whole buffer) fits `limit` bytes: the one
    /// check that a plan can be bound, before anything is allocated. A failure names the
    /// tensor and the kernel binding it.
    pub fn check_bindings(&self, input_bytes: &[u64], limit: u64) -> crate::Result<()> {
        for s in &self.steps {
            for (i, &r) in s.buffers.iter().enumerate() {
                // a uniform binding of the WebGPU default size, not a storage one
                if r == BufRef::Extras {
                    continue;
                }
                let bound = s
                    .window(i)
                    .map_or_else(|| self.buffer_bytes(r, input_bytes), |w| w.size);
                if bound > limit {
                    let name = match r {
                        BufRef::Input(i) => self.inputs[i].to_string(),
                        BufRef::Output(i) => self.outputs[i].role.to_string(),
                        BufRef::Scratch(i) => self.scratch[i].label.to_string(),
                        BufRef::Extras => "extras".to_string(),
                        BufRef::Pairs => "pair data (mask bits and bias entries)".to_string(),
                    };
                    return Err(crate::Error::DeviceLimit {
                        what: format!("{name} bound by {}", s.key.kernel.name()),
                        needed: bound,
                        limit,
                        hint: "Algorithm::Tiled splits tensors past one binding into windows; \
                               Algorithm::Naive binds each tensor whole"
                            .into(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Bytes of device memory the call allocates: outputs and scratch.
    pub fn allocated_bytes(&self) -> u64 {
        self.output_bytes()
            + (0..self.scratch.len())
                .map(|i| self.buffer_bytes(BufRef::Scratch(i), &[]))
                .sum::<u64>()
    }
}

/// Plans a device-side cast of `elements` f32 values to `dtype` (input: the f32 tensor).
pub fn cast(shape: &[usize], dtype: DType, env: &PlanEnv) -> Plan {
    let n: usize = shape.iter().product();
    let key = KernelKey {
        elem: ElemFormat::new(dtype, env.tuning.half_storage),
        ..KernelKey::plain(Kernel::Cast)
    };
    Plan {
        inputs: vec![TensorRole::Out],
        outputs: vec![OutputSpec {
            role: TensorRole::Out,
            shape: shape.to_vec(),
            dtype,
        }],
        scratch: Vec::new(),
        extras: Vec::new(),
        pairs: Vec::new(),
        kept_grads: None,
        copies: Vec::new(),
        steps: vec![Step {
            key,
            params: Params {
                total_items: n as u32,
                ..Default::default()
            },
            buffers: vec![BufRef::Input(0), BufRef::Output(0)],
            windows: Vec::new(),
            workgroups: n.div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
        }],
    }
}

/// The environment the plan unit tests plan for: WebGPU's default limits and a 128 MiB binding.
#[cfg(test)]
pub(crate) fn test_env(
    variant: crate::kernels::Variant,
    half_storage: crate::dtype::HalfStorage,
) -> PlanEnv {
    PlanEnv {
        caps: DeviceCaps::WEBGPU_DEFAULT,
        tuning: Tuning {
            variant,
            rows_subgroup: 0,
            half_storage,
            decode_q_chunks: true,
        },
        max_binding_bytes: 128 << 20,
        offset_align: 256,
        compiled_flags: crate::kernels::flags::COMPILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::HalfStorage;
    use crate::kernels::{Pass, Variant};

    pub(super) fn env(variant: Variant, half: HalfStorage) -> PlanEnv {
        test_env(variant, half)
    }

    fn cfg(b: usize, sq: usize, skv: usize, hq: usize, hkv: usize, d: usize) -> AttentionConfig {
        AttentionConfig::new(b, sq, skv, hq, hkv, d)
    }

    #[test]
    fn tiled_forward_is_one_dispatch_over_every_query_tile() {
        let c = cfg(2, 100, 70, 4, 2, 64);
        let e = env(Variant::Blocks, HalfStorage::Native);
        let p = forward(&c, DType::F32, &e).unwrap();
        assert_eq!(p.steps.len(), 1);
        let s = &p.steps[0];
        assert_eq!(s.key.kernel, Kernel::Flash(Variant::Blocks, Pass::Forward));
        let br = s.key.tiles.br as usize;
        assert_eq!(s.workgroups as usize, 100usize.div_ceil(br) * 4 * 2);
        assert_eq!(s.params.total_wg, s.workgroups);
        assert_eq!(
            s.buffers,
            vec![
                BufRef::Input(0),
                BufRef::Input(1),
                BufRef::Input(2),
                BufRef::Output(0),
                BufRef::Output(1),
            ]
        );
        assert_eq!(p.outputs[0].dtype, DType::F32);
        assert_eq!(p.outputs[1].dtype, DType::F32);
        assert!(p.scratch.is_empty());
    }

    #[test]
    fn the_coop_variant_runs_f16_forwards_on_cooperative_matrices_and_the_rest_on_blocks() {
        let c = cfg(1, 100, 70, 4, 2, 64);
        let mut e = env(Variant::Coop, HalfStorage::Native);
        e.caps = DeviceCaps {
            max_workgroup_storage_bytes: 49152,
            max_invocations_per_workgroup: 1024,
            coop: 16,
            ..DeviceCaps::WEBGPU_DEFAULT
        };
        for (dtype, want) in [
            (DType::F16, Kernel::Flash(Variant::Coop, Pass::Forward)),
            (DType::F32, Kernel::Flash(Variant::Blocks, Pass::Forward)),
            (DType::BF16, Kernel::Flash(Variant::Blocks, Pass::Forward)),
        ] {
            let p = forward(&c, dtype, &e).unwrap();
            assert_eq!(p.steps[0].key.kernel, want, "{dtype}");
        }
        // packed f16 storage (atomic stores) runs the blocks kernel
        let packed = PlanEnv {
            tuning: Tuning {
                half_storage: HalfStorage::Packed,
                ..e.tuning
            },
            ..e
        };
        let p = forward(&c, DType::F16, &packed).unwrap();
        assert_eq!(
            p.steps[0].key.kernel,
            Kernel::Flash(Variant::Blocks, Pass::Forward)
        );
        let kernels = |p: Plan| p.steps.iter().map(|s| s.key.kernel).collect::<Vec<_>>();
        let coop_bwd = kernels(backward(&c, DType::F16, &e).unwrap());
        assert!(
            coop_bwd.contains(&Kernel::Flash(Variant::Coop, Pass::DkDv)),
            "{coop_bwd:?}"
        );
        assert!(
            coop_bwd.contains(&Kernel::Flash(Variant::Coop, Pass::Dq)),
            "{coop_bwd:?}"
        );
        let f32_bwd = kernels(backward(&c, DType::F32, &e).unwrap());
        assert!(
            f32_bwd.contains(&Kernel::Flash(Variant::Blocks, Pass::DkDv)),
            "{f32_bwd:?}"
        );
        // head_dim 256 does not fit the backward's coop tiles in 48 KiB: blocks
        let big = kernels(backward(&cfg(1, 40, 40, 2, 2, 256), DType::F16, &e).unwrap());
        assert!(
            big.contains(&Kernel::Flash(Variant::Blocks, Pass::Dq)),
            "{big:?}"
        );
        // without cooperative matrices the chooser refuses the coop kernel by name
        e.caps.coop = 0;
        match forward(&c, DType::F16, &e) {
            Err(crate::Error::Unsupported { feature, .. }) => {
                assert!(feature.contains("flash_fwd_coop"))
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }

    #[test]
    fn half_dtypes_pick_the_element_format_from_the_tuning() {
        let c = cfg(1, 16, 16, 1, 1, 8);
        for (dtype, half, want) in [
            (DType::F16, HalfStorage::Native, ElemFormat::F16Native),
            (DType::F16, HalfStorage::Packed, ElemFormat::F16Packed),
            (DType::BF16, HalfStorage::Native, ElemFormat::Bf16Packed),
            (DType::BF16, HalfStorage::Packed, ElemFormat::Bf16Packed),
        ] {
            let p = forward(&c, dtype, &env(Variant::Rows, half)).unwrap();
            assert_eq!(p.steps[0].key.elem, want);
            assert_eq!(p.outputs[0].dtype, dtype, "out takes the inputs' dtype");
            assert_eq!(p.outputs[1].dtype, DType::F32, "lse stays f32");
        }
    }

    #[test]
    fn half_outputs_allocate_half_the_bytes_of_f32() {
        let c = cfg(1, 256, 256, 8, 8, 64);
        let e = env(Variant::Rows, HalfStorage::Packed);
        let f32_fwd = forward(&c, DType::F32, &e).unwrap();
        let f16_fwd = forward(&c, DType::F16, &e).unwrap();
        let lse = 256 * 8 * 4;
        assert_eq!(
            f32_fwd.allocated_bytes() - lse,
            2 * (f16_fwd.allocated_bytes() - lse)
        );
    }

    #[test]
    fn kernels_without_element_bindings_share_one_pipeline_across_dtypes() {
        let mut c = cfg(1, 33, 33, 2, 2, 16);
        c.algorithm = crate::Algorithm::Naive;
        let e = env(Variant::Rows, HalfStorage::Packed);
        let a = forward(&c, DType::F32, &e).unwrap();
        let b = forward(&c, DType::BF16, &e).unwrap();
        let softmax = |p: &Plan| {
            p.steps
                .iter()
                .find(|s| s.key.kernel == Kernel::NaiveSoftmax)
                .unwrap()
                .key
        };
        assert_eq!(softmax(&a), softmax(&b));
        let scores = |p: &Plan| {
            p.steps
                .iter()
                .find(|s| s.key.kernel == Kernel::NaiveScores)
                .unwrap()
                .key
        };
        assert_ne!(scores(&a), scores(&b));
    }

    #[test]
    fn tiled_backward_is_preprocess_then_dkdv_then_dq_with_lse_and_delta_pairs_as_scratch() {
        let c = cfg(1, 50, 90, 4, 1, 32);
        let p = backward(&c, DType::BF16, &env(Variant::Rows, HalfStorage::Packed)).unwrap();
        let kernels: Vec<Kernel> = p.steps.iter().map(|s| s.key.kernel).collect();
        assert_eq!(
            kernels,
            vec![
                Kernel::FlashBwdPreprocess,
                Kernel::Flash(Variant::Rows, Pass::DkDv),
                Kernel::Flash(Variant::Rows, Pass::Dq)
            ]
        );
        assert_eq!(p.scratch.len(), 1);
        // (lse2, delta) per row
        assert_eq!(p.scratch[0].bytes, 50 * 4 * 8);
        // a plain call's pipelines read only causal at run time (the lean one), so no extras
        // or pair data: the dK/dV kernel leaves one of the WebGPU default's 8 storage bindings
        // free; a call with modifiers adds the pair data there
        assert_eq!(p.steps[1].buffers.len(), 7);
        let mut c = c.clone();
        c.alibi_slopes = Some(vec![0.5; 4]);
        let p = backward(&c, DType::BF16, &env(Variant::Rows, HalfStorage::Packed)).unwrap();
        assert_eq!(p.steps[1].buffers.len(), 9);
        assert_eq!(p.steps[1].key.storage_bindings(), 8);
        let roles: Vec<TensorRole> = p.outputs.iter().map(|o| o.role).collect();
        assert_eq!(roles, vec![TensorRole::Dq, TensorRole::Dk, TensorRole::Dv]);
        assert!(p.outputs.iter().all(|o| o.dtype == DType::BF16));
        // dK/dV workgroups own key tiles of the kv heads
        let bc = p.steps[1].key.tiles.bc as usize;
        assert_eq!(p.steps[1].workgroups as usize, 90usize.div_ceil(bc));
    }

    #[test]
    fn naive_forward_splits_slices_into_chunks_that_fit_one_binding() {
        let mut c = cfg(1, 1024, 1024, 40, 40, 16);
        c.algorithm = crate::Algorithm::Naive;
        let mut e = env(Variant::Rows, HalfStorage::Packed);
        e.max_binding_bytes = 16 << 20; // 4 slices of 1024 x 1024 f32 per chunk
        let p = forward(&c, DType::F16, &e).unwrap();
        assert_eq!(p.steps.len(), 3 * 10);
        assert_eq!(p.scratch[0].bytes, 4 * 1024 * 1024 * 4);
    }

    #[test]
    fn a_whole_binding_past_the_limit_is_named_before_anything_is_allocated() {
        let mut c = cfg(3, 20, 20, 2, 1, 16);
        c.algorithm = crate::Algorithm::Naive;
        let mut e = env(Variant::Rows, HalfStorage::Packed);
        e.max_binding_bytes = 4 << 10;
        let p = forward(&c, DType::F32, &e).unwrap();
        let q_bytes = (3 * 20 * 2 * 16 * 4) as u64;
        let kv_bytes = q_bytes / 2;
        match p.check_bindings(&[q_bytes, kv_bytes, kv_bytes], 4 << 10) {
            Err(crate::Error::DeviceLimit { what, needed, .. }) => {
                assert_eq!(what, "q bound by naive_scores");
                assert_eq!(needed, q_bytes);
            }
            other => panic!("expected DeviceLimit, got {other:?}"),
        }
        // the same call, tiled, is split into windows that all fit
        c.algorithm = crate::Algorithm::Tiled;
        let p = forward(&c, DType::F32, &e).unwrap();
        assert!(p.steps.len() > 1);
        p.check_bindings(&[q_bytes, kv_bytes, kv_bytes], 4 << 10)
            .unwrap();
    }

    #[test]
    fn naive_score_matrix_past_the_binding_limit_is_a_device_limit_error() {
        let mut c = cfg(1, 4096, 4096, 1, 1, 16);
        c.algorithm = crate::Algorithm::Naive;
        let mut e = env(Variant::Rows, HalfStorage::Packed);
        e.max_binding_bytes = 32 << 20;
        assert!(matches!(
            forward(&c, DType::F32, &e),
            Err(crate::Error::DeviceLimit { .. })
        ));
    }
}
