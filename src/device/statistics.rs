//! What a GPU vendor's shader compiler makes of each pipeline (issue 62): its statistics
//! (registers, spills, scratch, workgroup memory, waves per SIMD, instruction counts, as the
//! driver names them) and its internal representations (the disassembly), read through
//! `VK_KHR_pipeline_executable_properties`, which RADV (AMD's ACO), NVIDIA's and Intel's
//! Vulkan drivers offer.
//!
//! A context for this is opened as `Context::new` opens one (the same adapter, features,
//! limits, subgroup sizes and tuning: the pipelines it plans are the ones a user's calls
//! would compile there), with the extension turned on, and without the driver canary or the
//! coop self-check, which run kernels: on a machine where submissions do nothing (Mesa's
//! no-op DRM shim, which lets AMD's compiler run without an AMD GPU) they could not pass. The
//! coop kernels are planned wherever the adapter offers their cooperative matrices, as if
//! their self-check had passed. Each pipeline is made on the raw Vulkan device with the
//! capture flags wgpu does not set: the same SPIR-V (device/spirv.rs) and the same layout
//! (`KernelKey::layout`) as the wgpu pipeline of that key.

use ash::vk;

use super::open::{choose_adapter, Chosen};
use super::{check_device_limits, Context};
use crate::error::{Error, Result};
use crate::kernels::wgsl::BindingKind;
use crate::kernels::{KernelKey, Tuning, Variant};

/// One statistic's value, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Statistic {
    /// A yes or no.
    Bool(bool),
    /// A signed count.
    I64(i64),
    /// An unsigned count (registers, bytes, instructions).
    U64(u64),
    /// A measure (an estimate of latency or throughput).
    F64(f64),
}

impl Statistic {
    /// The value as a float, whatever its kind (a bool is 0 or 1).
    pub fn as_f64(self) -> f64 {
        match self {
            Statistic::Bool(b) => b as u8 as f64,
            Statistic::I64(x) => x as f64,
            Statistic::U64(x) => x as f64,
            Statistic::F64(x) => x,
        }
    }
}

/// What the driver's compiler reports for one pipeline's (compute) executable.
#[derive(Debug, Clone)]
pub struct PipelineReport {
    /// The executable's name and description, as the driver gives them.
    pub executable: String,
    /// The subgroup size the driver compiled it for (RADV: 32 or 64 on RDNA, 64 on GCN).
    pub subgroup_size: u32,
    /// Each statistic by the driver's name ("VGPRs", "Spilled VGPRs", "Scratch size", "LDS
    /// size", "Subgroups per SIMD", "Instructions", ... on RADV), in the driver's order.
    pub statistics: Vec<(String, Statistic)>,
    /// Each internal representation by the driver's name (RADV: "ACO IR", "Assembly"), its
    /// text.
    pub representations: Vec<(String, String)>,
}

impl PipelineReport {
    /// The statistic named `name` (exactly as the driver names it), as a float.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.statistics
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_f64())
    }

    /// The representation whose name contains `part` (case-insensitive): "assembly", say.
    pub fn representation(&self, part: &str) -> Option<&str> {
        let part = part.to_lowercase();
        self.representations
            .iter()
            .find(|(n, _)| n.to_lowercase().contains(&part))
            .map(|(_, t)| t.as_str())
    }
}

fn unsupported(reason: String) -> Error {
    Error::Unsupported {
        feature: "compiler statistics".into(),
        backend: crate::Backend::Wgpu,
        reason,
    }
}

impl Context {
    /// A context on the default adapter as [`Context::new`] would open it, for
    /// [`compiler_statistics`](Context::compiler_statistics): see the module. Its calls must
    /// not be trusted (no canary ran); it is for compiling pipelines and reading what the
    /// driver made of them. `Unsupported` off Vulkan or where the driver lacks the extension.
    #[doc(hidden)]
    pub fn for_compiler_statistics() -> Result<Context> {
        pollster::block_on(async {
            let Chosen {
                adapter,
                features,
                limits,
                coop,
            } = choose_adapter().await?;
            let info = adapter.get_info();
            if info.backend != wgpu::Backend::Vulkan {
                return Err(unsupported(format!(
                    "they are read through VK_KHR_pipeline_executable_properties, a Vulkan \
                     extension; the adapter ({}) is {:?}",
                    info.name, info.backend
                )));
            }
            let name = ash::khr::pipeline_executable_properties::NAME;
            // SAFETY: the device is opened from this adapter's own hal adapter with the
            // features and limits it offers (as `request` asks wgpu for them), plus one
            // extension the physical device lists and its one feature, then handed to wgpu
            // with the same features; nothing is removed from what wgpu asks for.
            let (device, queue) = unsafe {
                let hal = adapter
                    .as_hal::<wgpu::hal::api::Vulkan>()
                    .ok_or_else(|| unsupported("no Vulkan adapter under wgpu".into()))?;
                let instance = hal.shared_instance().raw_instance();
                let offered = instance
                    .enumerate_device_extension_properties(hal.raw_physical_device())
                    .map_err(|e| Error::RequestDevice(e.to_string()))?
                    .iter()
                    .any(|e| e.extension_name_as_c_str() == Ok(name));
                if !offered {
                    return Err(unsupported(format!(
                        "the driver of {} does not offer {}",
                        info.name,
                        name.to_string_lossy()
                    )));
                }
                let mut wanted =
                    vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
                        .pipeline_executable_info(true);
                let open = hal
                    .open_with_callback(
                        features,
                        &limits,
                        &wgpu::MemoryHints::Performance,
                        Some(Box::new(
                            |args: wgpu::hal::vulkan::CreateDeviceCallbackArgs| {
                                args.extensions.push(name);
                                *args.create_info = args.create_info.push_next(&mut wanted);
                            },
                        )),
                    )
                    .map_err(|e| Error::RequestDevice(e.to_string()))?;
                adapter
                    .create_device_from_hal(
                        open,
                        &wgpu::DeviceDescriptor {
                            label: Some("flash-attn-wgpu compiler statistics"),
                            required_features: features,
                            required_limits: limits.clone(),
                            experimental_features: if coop > 0 {
                                // SAFETY: pipelines are only compiled on this device, never run
                                wgpu::ExperimentalFeatures::enabled()
                            } else {
                                wgpu::ExperimentalFeatures::disabled()
                            },
                            memory_hints: wgpu::MemoryHints::Performance,
                            trace: wgpu::Trace::Off,
                        },
                    )
                    .map_err(|e| Error::RequestDevice(e.to_string()))?
            };
            check_device_limits(&device.limits())?;
            let mut ctx = Self::build(device, queue, Some(info), coop);
            if coop > 0 {
                // what the summary says: planned, never run (no self-check here)
                ctx.info.cooperative_matrices = format!(
                    "{}, planned without the self-check (compiled, never run)",
                    super::coop::shape_name(coop)
                );
                ctx.set_tuning_unchecked(Tuning {
                    variant: Variant::Coop,
                    ..ctx.tuning()
                });
            }
            ctx.apply_variant_env()?;
            Ok(ctx)
        })
    }

    /// Compiles `key`'s pipeline on this context's Vulkan device (one made by
    /// [`for_compiler_statistics`](Context::for_compiler_statistics)) and returns what the
    /// driver's compiler reports for it. The pipeline is destroyed before this returns; a
    /// compile failure is `Error::Device` naming the key.
    #[doc(hidden)]
    pub fn compiler_statistics(&self, key: &KernelKey) -> Result<PipelineReport> {
        let target = self.spirv.as_ref().ok_or_else(|| {
            unsupported(
                "the device takes no SPIR-V from the crate (not Vulkan, or no passthrough)".into(),
            )
        })?;
        let label = key.label();
        let words = super::spirv::kernel_spirv(&key.wgsl(), target)
            .map_err(|e| Error::Device(format!("{label}: no SPIR-V: {e}")))?;
        // SAFETY: every object is made on this device from valid create infos and destroyed
        // below, after the pipeline that uses it; the queries read that pipeline's executable
        // only, into buffers of the sizes the driver asked for.
        unsafe {
            let hal = self
                .device
                .as_hal::<wgpu::hal::api::Vulkan>()
                .ok_or_else(|| unsupported("no Vulkan device under wgpu".into()))?;
            let raw = hal.raw_device();
            let instance = hal.shared_instance().raw_instance();
            let ext = ash::khr::pipeline_executable_properties::Device::new(instance, raw);
            let bindings: Vec<vk::DescriptorSetLayoutBinding> = key
                .layout()
                .into_iter()
                .map(|(binding, kind)| {
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(binding)
                        .descriptor_type(match kind {
                            BindingKind::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
                            BindingKind::Storage { .. } => vk::DescriptorType::STORAGE_BUFFER,
                        })
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE)
                })
                .collect();
            let failed = |what: &str, e: vk::Result| Error::Device(format!("{label}: {what}: {e}"));
            let set_layout = raw
                .create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                    None,
                )
                .map_err(|e| failed("descriptor set layout", e))?;
            let layouts = [set_layout];
            let layout = raw
                .create_pipeline_layout(
                    &vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts),
                    None,
                )
                .map_err(|e| failed("pipeline layout", e));
            let module = raw
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
                .map_err(|e| failed("shader module", e));
            let report = match (layout, module) {
                (Ok(layout), Ok(module)) => {
                    let entry = c"main";
                    let info = vk::ComputePipelineCreateInfo::default()
                        .flags(
                            vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                                | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR,
                        )
                        .stage(
                            vk::PipelineShaderStageCreateInfo::default()
                                .stage(vk::ShaderStageFlags::COMPUTE)
                                .module(module)
                                .name(entry),
                        )
                        .layout(layout);
                    let made = raw
                        .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
                        .map_err(|(_, e)| failed("compute pipeline (the driver's compiler)", e));
                    let report = made.and_then(|p| {
                        let r = read_report(&ext, p[0]).map_err(|e| failed("statistics", e));
                        raw.destroy_pipeline(p[0], None);
                        r
                    });
                    raw.destroy_shader_module(module, None);
                    raw.destroy_pipeline_layout(layout, None);
                    report
                }
                (layout, module) => {
                    if let Ok(l) = &layout {
                        raw.destroy_pipeline_layout(*l, None);
                    }
                    if let Ok(m) = &module {
                        raw.destroy_shader_module(*m, None);
                    }
                    Err(layout.err().or(module.err()).unwrap_or_else(|| {
                        Error::Device(format!("{label}: no pipeline layout or module"))
                    }))
                }
            };
            raw.destroy_descriptor_set_layout(set_layout, None);
            report
        }
    }
}

/// The compute executable's properties, statistics and representations.
unsafe fn read_report(
    ext: &ash::khr::pipeline_executable_properties::Device,
    pipeline: vk::Pipeline,
) -> std::result::Result<PipelineReport, vk::Result> {
    let text = |chars: &[std::ffi::c_char]| {
        let bytes: Vec<u8> = chars
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let executables =
        ext.get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline))?;
    let Some(exe) = executables.first() else {
        return Err(vk::Result::ERROR_UNKNOWN);
    };
    let at = vk::PipelineExecutableInfoKHR::default()
        .pipeline(pipeline)
        .executable_index(0);
    let statistics = ext
        .get_pipeline_executable_statistics(&at)?
        .iter()
        .map(|s| {
            let value = match s.format {
                vk::PipelineExecutableStatisticFormatKHR::BOOL32 => {
                    Statistic::Bool(s.value.b32 != 0)
                }
                vk::PipelineExecutableStatisticFormatKHR::INT64 => Statistic::I64(s.value.i64),
                vk::PipelineExecutableStatisticFormatKHR::UINT64 => Statistic::U64(s.value.u64),
                _ => Statistic::F64(s.value.f64),
            };
            (text(&s.name), value)
        })
        .collect();
    // the representations' texts: a first call for their sizes, a second into buffers
    let fp = ext
        .fp()
        .get_pipeline_executable_internal_representations_khr;
    let mut count = 0u32;
    fp(ext.device(), &at, &mut count, std::ptr::null_mut()).result()?;
    let mut reps = vec![vk::PipelineExecutableInternalRepresentationKHR::default(); count as usize];
    fp(ext.device(), &at, &mut count, reps.as_mut_ptr()).result()?;
    let mut buffers: Vec<Vec<u8>> = reps.iter().map(|r| vec![0u8; r.data_size]).collect();
    for (r, b) in reps.iter_mut().zip(buffers.iter_mut()) {
        r.p_data = b.as_mut_ptr().cast();
    }
    let done = fp(ext.device(), &at, &mut count, reps.as_mut_ptr());
    if done != vk::Result::SUCCESS && done != vk::Result::INCOMPLETE {
        return Err(done);
    }
    let representations = reps
        .iter()
        .zip(&buffers)
        .map(|(r, b)| {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            (
                text(&r.name),
                String::from_utf8_lossy(&b[..end]).into_owned(),
            )
        })
        .collect();
    Ok(PipelineReport {
        executable: format!("{}: {}", text(&exe.name), text(&exe.description)),
        subgroup_size: exe.subgroup_size,
        statistics,
        representations,
    })
}
