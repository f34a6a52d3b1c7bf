//! The SPIR-V we hand Vulkan: naga's translation of a kernel's WGSL, with the options wgpu
//! itself would use, cleaned of the explicit layout decorations that Vulkan forbids outside
//! buffer memory (VUID-StandaloneSpirv-None-10684), with the coop kernels' workgroup indices
//! unclamped (`coop_indices`), loaded through wgpu's passthrough path.
//!
//! Why: naga decorates every array type with `ArrayStride` and every struct member with
//! `Offset`, also where the type backs a Workgroup, Private or Function variable. Drivers are
//! not bound to accept that (Adreno produces nothing; NVIDIA's 580 series has crashed on
//! Function-scope strides), and no WGSL avoids it: every tiled kernel has a workgroup array.
//! The upstream fix is gfx-rs/wgpu#9295 (issue #7696); once wgpu ships it, the layout cleaning
//! goes, and the route with it unless the coop bases' rewrite still pays (docs/ARCHITECTURE.md,
//! "The SPIR-V Vulkan gets").
//!
//! Only Vulkan devices that offer `PASSTHROUGH_SHADERS` take this route; every other backend,
//! and a device without the feature, gets the WGSL as before. The portability test validates
//! exactly these words (`unstable::spirv`), so what spirv-val checks is what ships.

use std::collections::{HashMap, HashSet};

use naga::back::spv;

/// `FLASH_ATTN_WGPU_SHADERS=wgsl` sends the WGSL to wgpu even where the SPIR-V route is open
/// (to compare the two, or to rule ours out); unset, empty or `spirv`: Vulkan gets our SPIR-V
/// where it can. Anything else is an `InvalidConfig` error from the `Context` constructors.
pub const SHADERS_ENV: &str = "FLASH_ATTN_WGPU_SHADERS";

/// Whether the environment asks for the WGSL route.
pub(crate) fn wgsl_requested() -> crate::Result<bool> {
    parse_env(std::env::var(SHADERS_ENV).ok().as_deref())
}

fn parse_env(value: Option<&str>) -> crate::Result<bool> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("spirv") => Ok(false),
        Some("wgsl") => Ok(true),
        Some(_) => Err(crate::Error::invalid(format!(
            "{SHADERS_ENV} is {:?}, expected wgsl or spirv (or unset)",
            value.unwrap_or_default()
        ))),
    }
}

/// What the SPIR-V is written for: the device's SPIR-V version and the capabilities its
/// features allow (the kernels use no others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpirvTarget {
    /// (major, minor): 1.0 on Vulkan 1.0, 1.3 on 1.1, 1.5 on 1.2, 1.6 on 1.3 and later, as
    /// wgpu picks.
    pub lang_version: (u8, u8),
    /// The device runs with `robustBufferAccess2` (wgpu turns it on wherever offered): the
    /// driver bounds buffer accesses, so the SPIR-V does not clamp them, as wgpu's does not.
    pub robust_buffers: bool,
    /// `SHADER_F16` is enabled.
    pub f16: bool,
    /// `SUBGROUP` is enabled.
    pub subgroups: bool,
    /// The experimental cooperative matrices are enabled.
    pub cooperative_matrices: bool,
}

impl SpirvTarget {
    /// The SPIR-V version wgpu writes for a device of Vulkan `api_version` (a `VK_MAKE_API_VERSION`
    /// value).
    pub fn lang_version_for(api_version: u32) -> (u8, u8) {
        let minor = (api_version >> 12) & 0x3ff;
        let major = (api_version >> 22) & 0x7f;
        match (major, minor) {
            (1, 0) => (1, 0),
            (1, 1) => (1, 3),
            (1, 2) => (1, 5),
            _ => (1, 6),
        }
    }

    /// The writer's options: wgpu's for Vulkan, with the runtime checks our pipelines ask
    /// for (`pipelines.rs`): index accesses clamped, buffer accesses too unless the driver
    /// bounds them, no loop-bounding counter, no zeroing of workgroup memory, integer-division
    /// checks on.
    fn options(&self) -> spv::Options<'static> {
        use spv::Capability as C;
        let mut caps = vec![
            C::Shader,
            C::Matrix,
            C::Sampled1D,
            C::Image1D,
            C::ImageQuery,
            C::DerivativeControl,
            C::StorageImageExtendedFormats,
        ];
        if self.subgroups {
            caps.extend([
                C::GroupNonUniform,
                C::GroupNonUniformVote,
                C::GroupNonUniformArithmetic,
                C::GroupNonUniformBallot,
                C::GroupNonUniformShuffle,
                C::GroupNonUniformShuffleRelative,
                C::GroupNonUniformQuad,
            ]);
        }
        if self.f16 {
            caps.push(C::Float16);
        }
        if self.cooperative_matrices {
            caps.extend([C::CooperativeMatrixKHR, C::VulkanMemoryModel]);
        }
        let restrict = naga::proc::BoundsCheckPolicy::Restrict;
        spv::Options {
            lang_version: self.lang_version,
            flags: spv::WriterFlags::empty(),
            capabilities: Some(caps.into_iter().collect()),
            bounds_check_policies: naga::proc::BoundsCheckPolicies {
                index: restrict,
                buffer: if self.robust_buffers {
                    naga::proc::BoundsCheckPolicy::Unchecked
                } else {
                    restrict
                },
                image_load: restrict,
                binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
            },
            zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
            force_loop_bounding: false,
            ray_query_initialization_tracking: false,
            use_storage_input_output_16: false,
            // each binding at its WGSL group and index: what wgpu's map from the pipeline
            // layout says for plain buffers
            fake_missing_bindings: true,
            binding_map: Default::default(),
            debug_info: None,
            task_dispatch_limits: None,
            mesh_shader_primitive_indices_clamp: false,
            trace_ray_argument_validation: false,
            emit_int_div_checks: true,
        }
    }
}

/// The SPIR-V Vulkan gets for a kernel's WGSL (entry point `main`, compute): naga's
/// translation with wgpu's options for `target`, cleaned by [`without_private_layouts`], with
/// the coop kernels' workgroup indices unclamped (`coop_indices`: their indices are tile
/// offsets bounded by the tile constants, and the clamps were a third of a KV block).
/// `Err` says why not (the caller then hands wgpu the WGSL).
pub fn kernel_spirv(wgsl: &str, target: &SpirvTarget) -> Result<Vec<u32>, String> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| e.emit_to_string(wgsl))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| e.emit_to_string(wgsl))?;
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    let words = spv::write_vec(&module, &info, &target.options(), Some(&pipeline))
        .map_err(|e| format!("SPIR-V: {e}"))?;
    let mut words = without_private_layouts(&words)?;
    if target.cooperative_matrices {
        coop_indices::unclamp_workgroup_indices(&mut words)?;
    }
    Ok(words)
}

mod coop_indices;
mod words;

use words::{
    instructions, DECORATION_ARRAY_STRIDE, DECORATION_MATRIX_STRIDE, DECORATION_OFFSET,
    EXPLICIT_LAYOUT_CLASSES, OP_DECORATE, OP_MEMBER_DECORATE, OP_TYPE_ARRAY, OP_TYPE_POINTER,
    OP_TYPE_RUNTIME_ARRAY, OP_TYPE_STRUCT,
};

/// `words` without the explicit layout decorations (`ArrayStride`, `Offset`, `MatrixStride`)
/// of every type that no buffer-like storage class reaches: what Workgroup, Private and
/// Function variables, and plain values, use. A type reached both from a buffer and from such
/// a variable would need a copy of its own; none of our kernels has one, so that is an `Err`
/// naming the type rather than a rewrite nobody exercises.
pub fn without_private_layouts(words: &[u32]) -> Result<Vec<u32>, String> {
    let insts: Vec<&[u32]> = instructions(words)?
        .into_iter()
        .map(|(at, n)| &words[at..at + n])
        .collect();
    // the types each aggregate contains, and the pointee of each pointer by storage class
    let mut parts: HashMap<u32, Vec<u32>> = HashMap::new();
    let (mut buffer_roots, mut other_roots) = (Vec::new(), Vec::new());
    for w in &insts {
        match w[0] & 0xffff {
            OP_TYPE_ARRAY | OP_TYPE_RUNTIME_ARRAY => {
                parts.insert(w[1], vec![w[2]]);
            }
            OP_TYPE_STRUCT => {
                parts.insert(w[1], w[2..].to_vec());
            }
            OP_TYPE_POINTER => {
                if EXPLICIT_LAYOUT_CLASSES.contains(&w[2]) {
                    buffer_roots.push(w[3]);
                } else {
                    other_roots.push(w[3]);
                }
            }
            _ => {}
        }
    }
    let reach = |roots: Vec<u32>| {
        let mut seen = HashSet::new();
        let mut stack = roots;
        while let Some(t) = stack.pop() {
            if seen.insert(t) {
                stack.extend(parts.get(&t).into_iter().flatten().copied());
            }
        }
        seen
    };
    let in_buffers = reach(buffer_roots);
    let in_others = reach(other_roots);
    let is_layout = |w: &[u32]| match w[0] & 0xffff {
        OP_DECORATE => w[2] == DECORATION_ARRAY_STRIDE,
        OP_MEMBER_DECORATE => matches!(w[3], DECORATION_OFFSET | DECORATION_MATRIX_STRIDE),
        _ => false,
    };
    let mut out = words[..5].to_vec();
    for w in insts {
        if is_layout(w) {
            let ty = w[1];
            if !in_buffers.contains(&ty) {
                continue;
            }
            if in_others.contains(&ty) {
                return Err(format!(
                    "type %{ty} is laid out for a buffer and also backs a workgroup, private or \
                     function variable"
                ));
            }
        }
        out.extend_from_slice(w);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shaders_variable_takes_wgsl_or_spirv_and_names_itself_otherwise() {
        assert!(!parse_env(None).unwrap());
        assert!(!parse_env(Some(" SPIRV ")).unwrap());
        assert!(parse_env(Some("wgsl")).unwrap());
        let e = parse_env(Some("glsl")).unwrap_err().to_string();
        assert!(e.contains(SHADERS_ENV) && e.contains("\"glsl\""), "{e}");
    }

    #[test]
    fn vulkan_versions_map_to_the_spirv_versions_wgpu_writes() {
        let v = |major: u32, minor: u32| (major << 22) | (minor << 12);
        assert_eq!(SpirvTarget::lang_version_for(v(1, 0)), (1, 0));
        assert_eq!(SpirvTarget::lang_version_for(v(1, 1)), (1, 3));
        assert_eq!(SpirvTarget::lang_version_for(v(1, 2)), (1, 5));
        assert_eq!(SpirvTarget::lang_version_for(v(1, 3)), (1, 6));
        assert_eq!(SpirvTarget::lang_version_for(v(1, 4) | 321), (1, 6));
    }

    // the coop kernels' workgroup indices (spirv/coop_indices.rs)
    use super::coop_indices::unclamp_workgroup_indices;
    use super::words::{
        instructions, GLSL_UMIN, OP_ACCESS_CHAIN, OP_EXT_INST, OP_VARIABLE, STORAGE_CLASS_WORKGROUP,
    };

    const COOP_TARGET: SpirvTarget = SpirvTarget {
        lang_version: (1, 6),
        robust_buffers: true,
        f16: true,
        subgroups: true,
        cooperative_matrices: true,
    };

    /// The UMin clamps that index access chains into workgroup arrays, and into anything else.
    fn clamps(words: &[u32]) -> (usize, usize) {
        let insts = instructions(words).unwrap();
        let mut umins = std::collections::HashSet::new();
        let mut workgroup = std::collections::HashSet::new();
        for &(at, len) in &insts {
            let w = &words[at..at + len];
            match w[0] & 0xffff {
                OP_EXT_INST if len == 7 && w[4] == GLSL_UMIN => {
                    umins.insert(w[2]);
                }
                OP_VARIABLE if w.get(3) == Some(&STORAGE_CLASS_WORKGROUP) => {
                    workgroup.insert(w[2]);
                }
                _ => {}
            }
        }
        let (mut of_workgroup, mut other) = (0, 0);
        for &(at, len) in &insts {
            let w = &words[at..at + len];
            if w[0] & 0xffff == OP_ACCESS_CHAIN {
                let n = w[4..].iter().filter(|i| umins.contains(i)).count();
                if workgroup.contains(&w[3]) {
                    of_workgroup += n;
                } else {
                    other += n;
                }
            }
        }
        (of_workgroup, other)
    }

    const COOP_WGSL: &str = "enable f16;
enable wgpu_cooperative_matrix;
var<workgroup> hs: array<f16, 512>;
var<workgroup> fs: array<f32, 256>;
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) t: u32) {
    hs[t] = f16(t);
    workgroupBarrier();
    let a = (t / 32u) * 256u;
    let x = coopLoadT<coop_mat16x16<f16, A>>(&hs[a], 16u);
    let y = coopLoad<coop_mat16x16<f16, B>>(&hs[a], 16u);
    let c = coopMultiplyAdd(x, y, coop_mat16x16<f32, C>());
    coopStoreT(c, &fs[0u], 16u);
    workgroupBarrier();
    var local = array<f32, 4>(1.0, 2.0, 3.0, 4.0);
    out[t] = fs[t] + f32(hs[t + 1u]) + local[t % 7u];
}";

    fn naga_words(wgsl: &str) -> Vec<u32> {
        let module = naga::front::wgsl::parse_str(wgsl).unwrap();
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .unwrap();
        naga::back::spv::write_vec(&module, &info, &COOP_TARGET.options(), None).unwrap()
    }

    #[test]
    fn a_coop_kernels_workgroup_indices_lose_their_clamps_and_every_other_index_keeps_its_own() {
        // naga's own words clamp the two fragment bases and the three plain workgroup
        // accesses (the store's index is a constant), and the function array's index
        let mut words = naga_words(COOP_WGSL);
        assert_eq!(clamps(&words), (5, 1));
        assert_eq!(unclamp_workgroup_indices(&mut words), Ok(5));
        assert_eq!(clamps(&words), (0, 1));
        let words = kernel_spirv(COOP_WGSL, &COOP_TARGET).unwrap();
        assert_eq!(clamps(&words), (0, 1), "kernel_spirv makes the rewrite");
    }

    #[test]
    fn a_module_without_cooperative_matrices_keeps_every_clamp() {
        let plain = "var<workgroup> fs: array<f32, 256>;
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) t: u32) {
    fs[t] = f32(t);
    workgroupBarrier();
    out[t] = fs[(t * 7u) % 300u];
}";
        let mut words = naga_words(plain);
        let before = clamps(&words);
        assert_eq!(before.0, 2);
        assert_eq!(unclamp_workgroup_indices(&mut words), Ok(0));
        assert_eq!(clamps(&words), before);
    }
}
