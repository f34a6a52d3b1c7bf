//! What a GPU vendor's shader compiler makes of each pipeline (issue 62): its statistics
//! (registers, spills, scratch, workgroup memory, waves per SIMD, instruction counts, as the
//! driver names them) and its internal representations (the disassembly), read through
//! `VK_KHR_pipeline_executable_properties`, which RADV (AMD's ACO), NVK (NVIDIA, NAK),
//! Honeykrisp (Apple, AGX), Turnip (Qualcomm, ir3), NVIDIA's and Intel's Vulkan drivers offer.
//! Each compiler names its statistics its own way;
//! [`Summary`](crate::device::statistics::Summary) reads the four Mesa compilers'
//! into one vocabulary (issue 66), the raw list stays in
//! [`PipelineReport::statistics`](crate::device::statistics::PipelineReport::statistics).
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
    /// Each statistic's description as the driver gives it (its unit, often), in the same
    /// order as `statistics`.
    pub descriptions: Vec<String>,
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

    /// The report in one vocabulary ([`Summary`]); where the compiler reports no workgroup
    /// memory, NIR's (`shared_size`, [`PipelineReport::nir_workgroup`]).
    pub fn summary(&self) -> Summary {
        let mut s = Summary::of(&self.statistics, self.subgroup_size);
        if s.workgroup_bytes.is_none() {
            s.workgroup_bytes = self.nir_workgroup().map(|(_, bytes)| bytes as f64);
        }
        s
    }

    /// The workgroup's invocations and workgroup memory in bytes, from the header of the
    /// NIR representation (`workgroup_size: 128, 1, 1`, `shared_size: 37376`) that Mesa's
    /// drivers give (NVK, Turnip, RADV; Honeykrisp gives no representation).
    pub fn nir_workgroup(&self) -> Option<(u32, u32)> {
        let nir = self
            .representations
            .iter()
            .find(|(n, t)| n.contains("NIR") && t.contains("shared_size:"))
            .map(|(_, t)| t.as_str())?;
        nir_header(nir)
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

/// Whose compiler made a report, told by the names of its statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Compiler {
    /// AMD's ACO (RADV): "VGPRs", "Subgroups per SIMD", ...
    Aco,
    /// NVIDIA's NAK (NVK): "Number of GPRs", "Max warps/SM", ...
    Nak,
    /// Apple's AGX compiler (Honeykrisp): "GPRs" (16-bit), "Threads", ...
    Agx,
    /// Qualcomm's ir3 (Turnip): "Registers used", "Max Waves Per Core", ...
    Ir3,
    /// A driver whose names are not mapped (NVIDIA's or Intel's own): raw statistics only.
    Other,
}

impl Compiler {
    /// The compiler of a report whose statistics are named `names`.
    pub fn of<'a>(names: impl IntoIterator<Item = &'a str>) -> Compiler {
        let mut found = Compiler::Other;
        for n in names {
            found = match n {
                "Subgroups per SIMD" | "Spilled VGPRs" => Compiler::Aco,
                "Max warps/SM" | "SLM size" => Compiler::Nak,
                "Max Waves Per Core" | "Registers used" => Compiler::Ir3,
                // AGX's "Threads" and 16-bit "GPRs" beside its "FSCIB" cycle estimate
                "FSCIB" => Compiler::Agx,
                _ => continue,
            };
            break;
        }
        found
    }

    /// The compiler's name, with its vendor.
    pub fn name(self) -> &'static str {
        match self {
            Compiler::Aco => "ACO (AMD)",
            Compiler::Nak => "NAK (NVIDIA)",
            Compiler::Agx => "AGX (Apple)",
            Compiler::Ir3 => "ir3 (Qualcomm)",
            Compiler::Other => "unmapped",
        }
    }

    /// What [`Summary::occupancy`] counts on this compiler's hardware.
    pub fn occupancy_unit(self) -> &'static str {
        match self {
            Compiler::Aco => "waves/SIMD",
            Compiler::Nak => "warps/SM",
            Compiler::Agx => "threads/core",
            Compiler::Ir3 => "waves/core",
            Compiler::Other => "-",
        }
    }
}

/// A report in one vocabulary over the vendors' compilers (the shader-db columns): `None`
/// where the compiler does not report it. Counts are as each compiler counts them; the units
/// below say where they differ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Whose names these were read from.
    pub compiler: Compiler,
    /// 32-bit registers an invocation holds: ACO's VGPRs, NAK's GPRs, AGX's 16-bit GPRs
    /// halved, ir3's full registers (vec4s) times four (its half registers stay raw).
    pub registers: Option<f64>,
    /// Spills to memory: ACO's spilled VGPRs and SGPRs (registers), NAK's "Spills to memory",
    /// AGX's "Spills" (stack stores), ir3's "STP Count" (stores to private memory: spills or
    /// an indexed private array) (instructions).
    pub spills: Option<f64>,
    /// Fills from memory (instructions): NAK's "Fills from memory", AGX's "Fills", ir3's
    /// "LDP Count"; ACO reports none.
    pub fills: Option<f64>,
    /// Private (scratch, local) memory an invocation takes, bytes: ACO's "Scratch size" (a
    /// subgroup's) over the subgroup size, NAK's "SLM size", AGX's "Scratch"; ir3 reports none.
    pub scratch_bytes: Option<f64>,
    /// Workgroup memory a workgroup takes, bytes (ACO's "LDS size"; the others report none).
    pub workgroup_bytes: Option<f64>,
    /// How many are in flight at once, in [`Compiler::occupancy_unit`]: ACO's waves per SIMD,
    /// NAK's warps per SM, AGX's threads per core, ir3's waves per core.
    pub occupancy: Option<f64>,
    /// The compiler's static cycle estimate for one pass through the program (ACO's
    /// "Latency", NAK's "Static cycle count", AGX's "ALU"): comparable within a compiler
    /// only.
    pub cycles: Option<f64>,
    /// Instructions in the program.
    pub instructions: Option<f64>,
}

impl Summary {
    /// The summary of a report's statistics (`subgroup_size`: the executable's, which ACO's
    /// scratch is counted over).
    pub fn of(statistics: &[(String, Statistic)], subgroup_size: u32) -> Summary {
        let get = |name: &str| {
            statistics
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_f64())
        };
        let sum = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
        let compiler = Compiler::of(statistics.iter().map(|(n, _)| n.as_str()));
        let none = Summary {
            compiler,
            registers: None,
            spills: None,
            fills: None,
            scratch_bytes: None,
            workgroup_bytes: None,
            occupancy: None,
            cycles: None,
            instructions: None,
        };
        match compiler {
            Compiler::Aco => Summary {
                registers: get("VGPRs"),
                spills: sum(get("Spilled VGPRs"), get("Spilled SGPRs")),
                scratch_bytes: get("Scratch size").map(|b| b / subgroup_size.max(1) as f64),
                workgroup_bytes: get("LDS size"),
                occupancy: get("Subgroups per SIMD"),
                cycles: get("Latency"),
                instructions: get("Instructions"),
                ..none
            },
            Compiler::Nak => Summary {
                registers: get("Number of GPRs"),
                spills: get("Spills to memory"),
                fills: get("Fills from memory"),
                scratch_bytes: get("SLM size"),
                occupancy: get("Max warps/SM"),
                cycles: get("Static cycle count"),
                instructions: get("Instruction count"),
                ..none
            },
            Compiler::Agx => Summary {
                registers: get("GPRs").map(|halves| (halves / 2.0).ceil()),
                spills: get("Spills"),
                fills: get("Fills"),
                scratch_bytes: get("Scratch"),
                occupancy: get("Threads"),
                cycles: get("ALU"),
                instructions: get("Instructions"),
                ..none
            },
            Compiler::Ir3 => Summary {
                registers: get("Registers used").map(|vec4s| vec4s * 4.0),
                spills: get("STP Count"),
                fills: get("LDP Count"),
                occupancy: get("Max Waves Per Core"),
                instructions: get("Instruction Count"),
                ..none
            },
            Compiler::Other => none,
        }
    }
}

/// The invocations of a workgroup and its workgroup memory (bytes) in a NIR shader's header.
fn nir_header(nir: &str) -> Option<(u32, u32)> {
    let field = |name: &str| {
        nir.lines()
            .take(40)
            .find_map(|l| l.trim().strip_prefix(name))
            .map(str::trim)
    };
    let threads = field("workgroup_size:")?
        .split(',')
        .map(|x| x.trim().parse::<u32>().ok())
        .try_fold(1u32, |acc, x| x.map(|x| acc * x))?;
    let shared = field("shared_size:")?.parse().ok()?;
    Some((threads, shared))
}

/// What bounds the warps an NVIDIA SM holds besides registers (all that NAK's "Max warps/SM"
/// counts): its shared memory (with what the driver reserves a CTA), CTAs and warps, as
/// CUDA's occupancy rules count them for the compute capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvidiaSm {
    /// Shared memory an SM can give its CTAs, bytes (the largest carve-out).
    pub shared_bytes: u32,
    /// Shared memory the driver reserves a CTA (1 KiB from Ampere on).
    pub reserved_per_cta: u32,
    /// CTAs an SM holds at most.
    pub max_ctas: u32,
    /// Warps an SM holds at most.
    pub max_warps: u32,
}

impl NvidiaSm {
    /// The SM of a chip named as `scripts/compiler-stats.sh` names them (`ga100`, `ga102` ..
    /// `ga107`, `tu104`, or `nvidia:0xNNN` by chipset), `None` for a name it does not know.
    pub fn of_chip(chip: &str) -> Option<NvidiaSm> {
        let chipset = chip.strip_prefix("nvidia:0x").map(str::to_lowercase);
        let family = match (chip, chipset.as_deref()) {
            ("ga100", _) | (_, Some("170")) => 80,
            (c, _) if c.starts_with("ga10") => 86,
            (_, Some(c)) if c.starts_with("17") => 86,
            (c, _) if c.starts_with("tu1") => 75,
            (_, Some(c)) if c.starts_with("16") => 75,
            _ => return None,
        };
        Some(match family {
            // compute capability 8.0: 164 KiB, 32 CTAs, 64 warps
            80 => NvidiaSm {
                shared_bytes: 164 * 1024,
                reserved_per_cta: 1024,
                max_ctas: 32,
                max_warps: 64,
            },
            // 8.6: 100 KiB, 16 CTAs, 48 warps
            86 => NvidiaSm {
                shared_bytes: 100 * 1024,
                reserved_per_cta: 1024,
                max_ctas: 16,
                max_warps: 48,
            },
            // 7.5: 64 KiB, 16 CTAs, 32 warps
            _ => NvidiaSm {
                shared_bytes: 64 * 1024,
                reserved_per_cta: 0,
                max_ctas: 16,
                max_warps: 32,
            },
        })
    }

    /// The warps an SM holds of a kernel whose registers allow `register_warps` (NAK's
    /// count), with workgroups of `threads` invocations taking `shared` bytes each: whole
    /// CTAs, the fewest that every bound allows.
    pub fn warps(&self, register_warps: f64, threads: u32, shared: u32) -> f64 {
        let per_cta = threads.div_ceil(32).max(1);
        let by_shared = if shared == 0 {
            self.max_ctas
        } else {
            self.shared_bytes / (shared + self.reserved_per_cta)
        };
        let by_registers = register_warps as u32 / per_cta;
        let by_warps = self.max_warps / per_cta;
        let ctas = by_shared.min(by_registers).min(by_warps).min(self.max_ctas);
        (ctas * per_cta) as f64
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
        self.compiler_statistics_of(key, &key.wgsl())
    }

    /// [`compiler_statistics`](Context::compiler_statistics) of `wgsl`, an edit of `key`'s
    /// text (its bindings and workgroup are `key`'s): for measurements that compile a kernel
    /// without one of its paths (`examples/compiler_stats.rs`).
    #[doc(hidden)]
    pub fn compiler_statistics_of(&self, key: &KernelKey, wgsl: &str) -> Result<PipelineReport> {
        let target = self.spirv.as_ref().ok_or_else(|| {
            unsupported(
                "the device takes no SPIR-V from the crate (not Vulkan, or no passthrough)".into(),
            )
        })?;
        let label = key.label();
        let words = super::spirv::kernel_spirv(wgsl, target)
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
                    // the stage as wgpu-hal makes every compute pipeline (vulkan/device.rs),
                    // so that what is measured is what runs: with subgroups enabled the
                    // driver may pick its own subgroup size (RADV 25.0.7 and 26.1 still
                    // compile compute at wave64 with it: the same statistics either way)
                    let stage_flags = if self.device.features().contains(wgpu::Features::SUBGROUP) {
                        vk::PipelineShaderStageCreateFlags::ALLOW_VARYING_SUBGROUP_SIZE
                    } else {
                        vk::PipelineShaderStageCreateFlags::empty()
                    };
                    let info = vk::ComputePipelineCreateInfo::default()
                        .flags(
                            vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                                | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR,
                        )
                        .stage(
                            vk::PipelineShaderStageCreateInfo::default()
                                .flags(stage_flags)
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
    let raw_statistics = ext.get_pipeline_executable_statistics(&at)?;
    let descriptions = raw_statistics
        .iter()
        .map(|s| text(&s.description))
        .collect();
    let statistics = raw_statistics
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
        descriptions,
        representations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(list: &[(&str, u64)]) -> Vec<(String, Statistic)> {
        list.iter()
            .map(|&(n, v)| (n.to_string(), Statistic::U64(v)))
            .collect()
    }

    // recorded from Mesa 26.1.6 on the no-op DRM shims (one planned kernel each, abridged)

    #[test]
    fn acos_statistics_map_scratch_per_invocation() {
        let s = Summary::of(
            &stats(&[
                ("SGPRs", 108),
                ("VGPRs", 180),
                ("Spilled SGPRs", 1),
                ("Spilled VGPRs", 2),
                ("LDS size", 37888),
                ("Scratch size", 256),
                ("Subgroups per SIMD", 2),
                ("Instructions", 4673),
                ("Latency", 59093),
            ]),
            64,
        );
        assert_eq!(s.compiler, Compiler::Aco);
        assert_eq!(s.registers, Some(180.0));
        assert_eq!(s.spills, Some(3.0));
        assert_eq!(s.fills, None);
        assert_eq!(s.scratch_bytes, Some(4.0), "256 B a wave64 is 4 B a lane");
        assert_eq!(s.workgroup_bytes, Some(37888.0));
        assert_eq!(s.occupancy, Some(2.0));
        assert_eq!((s.cycles, s.instructions), (Some(59093.0), Some(4673.0)));
    }

    #[test]
    fn naks_statistics_map_local_memory_and_warps() {
        let s = Summary::of(
            &stats(&[
                ("Instruction count", 4739),
                ("Static cycle count", 187440),
                ("Max warps/SM", 32),
                ("Spills to memory", 0),
                ("Fills from memory", 0),
                ("Spills to reg", 5),
                ("Fills from reg", 7),
                ("Code size", 75824),
                ("Number of GPRs", 64),
                ("SLM size", 128),
            ]),
            32,
        );
        assert_eq!(s.compiler, Compiler::Nak);
        assert_eq!(s.registers, Some(64.0));
        assert_eq!(
            (s.spills, s.fills),
            (Some(0.0), Some(0.0)),
            "moves between register files are not spills"
        );
        assert_eq!(s.scratch_bytes, Some(128.0));
        assert_eq!(s.occupancy, Some(32.0));
        assert_eq!((s.cycles, s.instructions), (Some(187440.0), Some(4739.0)));
    }

    #[test]
    fn agxs_statistics_map_16_bit_registers_to_32_bit_ones() {
        let s = Summary::of(
            &stats(&[
                ("Instructions", 2586),
                ("ALU", 2148),
                ("FSCIB", 2148),
                ("IC", 628),
                ("GPRs", 255),
                ("Uniforms", 498),
                ("Scratch", 12),
                ("Threads", 384),
                ("Spills", 3),
                ("Fills", 3),
            ]),
            32,
        );
        assert_eq!(s.compiler, Compiler::Agx);
        assert_eq!(s.registers, Some(128.0));
        assert_eq!((s.spills, s.fills), (Some(3.0), Some(3.0)));
        assert_eq!(s.scratch_bytes, Some(12.0));
        assert_eq!(s.occupancy, Some(384.0));
        assert_eq!((s.cycles, s.instructions), (Some(2148.0), Some(2586.0)));
    }

    #[test]
    fn ir3s_statistics_map_vec4_registers_and_private_stores() {
        let s = Summary::of(
            &stats(&[
                ("Max Waves Per Core", 2),
                ("Instruction Count", 5066),
                ("Registers used", 48),
                ("Half-registers used", 0),
                ("STP Count", 0),
                ("LDP Count", 0),
            ]),
            64,
        );
        assert_eq!(s.compiler, Compiler::Ir3);
        assert_eq!(s.registers, Some(192.0));
        assert_eq!(
            (s.spills, s.fills, s.scratch_bytes),
            (Some(0.0), Some(0.0), None)
        );
        assert_eq!(s.occupancy, Some(2.0));
        assert_eq!((s.cycles, s.instructions), (None, Some(5066.0)));
    }

    #[test]
    fn an_sm_holds_the_ctas_its_shared_memory_registers_and_warps_allow() {
        let ga100 = NvidiaSm::of_chip("ga100").unwrap();
        assert_eq!(NvidiaSm::of_chip("nvidia:0x170"), Some(ga100));
        // 4 warps a CTA at 37,376 B (and the reserved KiB): 4 CTAs of 164 KiB
        assert_eq!(ga100.warps(32.0, 128, 37376), 16.0);
        // registers bound a CTA of 4 warps to 2 CTAs at 8 warps
        assert_eq!(ga100.warps(8.0, 128, 1024), 8.0);
        // no shared memory: 64 warps at most
        assert_eq!(ga100.warps(64.0, 64, 0), 64.0);
        let ga102 = NvidiaSm::of_chip("ga102").unwrap();
        assert_eq!(ga102.max_warps, 48);
        assert_eq!(ga102.warps(64.0, 256, 0), 48.0);
        assert_eq!(NvidiaSm::of_chip("m1"), None);
    }

    #[test]
    fn the_nir_header_gives_the_workgroup_and_its_memory() {
        let nir = "shader: MESA_SHADER_COMPUTE\nworkgroup_size: 32, 4, 1\nnum_ubos: 1\nshared_size: 37376\nscratch: 128\n";
        assert_eq!(nir_header(nir), Some((128, 37376)));
        assert_eq!(nir_header("shader: MESA_SHADER_COMPUTE\n"), None);
    }

    #[test]
    fn unknown_names_give_an_empty_summary() {
        let s = Summary::of(&stats(&[("Registers", 40)]), 32);
        assert_eq!(s.compiler, Compiler::Other);
        assert_eq!((s.registers, s.occupancy), (None, None));
    }
}
