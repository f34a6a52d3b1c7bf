//! The device: adapter choice, limits and features in use, the kernel-shape tuning, and the
//! `Context` that holds them. Buffers (`buffers`), error scopes (`scope`) and the driver
//! canary (`canary`) live beside this file; the pipeline cache in `pipelines`, and
//! recording in `record`.

pub(crate) mod buffers;
mod canary;
pub(crate) mod clock;
mod coop;
/// The inner loop of an AMD disassembly and its mix (the compiler-statistics tool's): no
/// stability promise, hidden.
#[doc(hidden)]
pub mod isa;
pub(crate) mod memory;
mod open;
pub(crate) mod pipeline_cache;
#[doc(hidden)]
pub mod pipelines;
mod scope;
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod spirv;
/// Compiler statistics (the compiler-statistics tool's): no stability promise, hidden.
#[cfg(not(target_arch = "wasm32"))]
#[doc(hidden)]
pub mod statistics;
pub(crate) mod timing;
mod variant_env;
mod wgpu_error;

use std::fmt;
use std::sync::{Arc, Mutex};

pub use crate::kernels::Tuning;
pub use canary::CANARY_ITERATIONS;
pub use coop::{COOP_ENV, COOP_TIMEOUT_ENV, DEFAULT_SELF_CHECK_TIMEOUT_S};
pub use memory::MemoryStats;
pub(crate) use memory::{MemTracker, TrackedBuffer};
#[cfg(not(target_arch = "wasm32"))]
pub use spirv::SHADERS_ENV;
pub use timing::GpuTiming;
pub use variant_env::VARIANT_ENV;

use crate::dtype::HalfStorage;
use crate::error::{Error, Result};
use crate::kernels::{DeviceCaps, GpuClass, Kernel, Tiles, Variant};
use crate::plan::PlanEnv;
use pipeline_cache::PipelineCache;

/// What the library knows about the adapter and the limits it runs under. Non-exhaustive:
/// the library makes it, and may know more.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AdapterSummary {
    /// The adapter's name (e.g. `llvmpipe (LLVM 19.1.7, 256 bits)`).
    pub name: String,
    /// The graphics API in use (Vulkan, Metal, Dx12, BrowserWebGpu).
    pub backend: String,
    /// Discrete, integrated, virtual or CPU.
    pub device_type: String,
    /// The driver's name.
    pub driver: String,
    /// The driver's version string.
    pub driver_info: String,
    /// Workgroup memory per workgroup the device was opened with.
    pub max_workgroup_storage_bytes: u32,
    /// Invocations per workgroup allowed.
    pub max_invocations_per_workgroup: u32,
    /// Largest storage binding.
    pub max_storage_binding_bytes: u64,
    /// Largest buffer.
    pub max_buffer_bytes: u64,
    /// Storage buffers one compute stage may bind.
    pub max_storage_buffers_per_stage: u32,
    /// Workgroups per dispatch dimension.
    pub max_workgroups_per_dimension: u32,
    /// Smallest subgroup size the adapter reports.
    pub subgroup_min_size: u32,
    /// Largest subgroup size the adapter reports.
    pub subgroup_max_size: u32,
    /// Whether `SHADER_F16` is in use (native f16 storage and arithmetic).
    pub shader_f16: bool,
    /// Whether subgroup operations are in use.
    pub subgroups: bool,
    /// Whether GPU timestamps are available (`GpuTiming`).
    pub timestamp_query: bool,
    /// Cooperative matrices for the coop variant: "in use", "not offered", or why they are
    /// offered but not used.
    pub cooperative_matrices: String,
    /// What the driver is handed: "SPIR-V 1.x (naga, layout-clean)" on Vulkan where the
    /// passthrough route is open (device/spirv.rs), "WGSL" elsewhere.
    pub shaders: String,
}

impl fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}, {}, driver {} {}); workgroup storage {} KiB, storage binding {} MiB, \
             subgroup {}..{}, f16 {}, subgroups {}, timestamps {}, cooperative matrices {}, shaders {}",
            self.name,
            self.backend,
            self.device_type,
            self.driver,
            self.driver_info,
            self.max_workgroup_storage_bytes / 1024,
            self.max_storage_binding_bytes >> 20,
            self.subgroup_min_size,
            self.subgroup_max_size,
            self.shader_f16,
            self.subgroups,
            self.timestamp_query,
            self.cooperative_matrices,
            self.shaders,
        )
    }
}

/// The library's handle on a GPU. Create once, reuse for every call.
pub struct Context {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: AdapterSummary,
    fixed_subgroup: u32,
    pub(crate) caps: DeviceCaps,
    pub(crate) limits: wgpu::Limits,
    pub(crate) pipelines: PipelineCache,
    /// Where Vulkan takes our SPIR-V (device/spirv.rs): what it is written for.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) spirv: Option<spirv::SpirvTarget>,
    pub(crate) mem: Arc<MemTracker>,
    pub(crate) lost: Arc<Mutex<Option<String>>>,
    /// In a browser: the first GPU error the device reported outside any scope, returned by
    /// the next call (device/scope.rs).
    #[cfg(target_arch = "wasm32")]
    pub(crate) uncaptured: Arc<Mutex<Option<Error>>>,
    pub(crate) timing: Mutex<Option<timing::LastTiming>>,
    /// Whether calls measure their GPU time with timestamp queries (`set_gpu_timing`).
    pub(crate) gpu_timing: std::sync::atomic::AtomicBool,
    /// Uniform buffers for the dispatches' parameters, reused across calls (`record.rs`).
    pub(crate) params_pool: Mutex<Vec<wgpu::Buffer>>,
    tuning: Mutex<Tuning>,
    /// The modifier bits compiled into pipelines (`kernels::flags`), the rest read at run time.
    compiled_flags: std::sync::atomic::AtomicU32,
    /// Plan the blocks kernels' tiles as on a GPU of another class (`DeviceCaps::gpu`),
    /// whatever this adapter is: the tests run those tiles on lavapipe (`plan_as_gpu`).
    planned_class: Mutex<Option<GpuClass>>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .field("tuning", &self.tuning())
            .field("memory", &self.memory_stats())
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Wraps a device the caller already has. Uses that device's limits and features; the
    /// coop variant is not used (a device does not tell its cooperative-matrix
    /// configurations: `Context::new` asks the adapter). On Vulkan, a device created with
    /// `wgpu::Features::PASSTHROUGH_SHADERS` gets the SPIR-V `Context::new` devices get, clean
    /// of layout decorations Vulkan forbids outside buffers; without it wgpu compiles the WGSL,
    /// naga's decorations included (docs/ARCHITECTURE.md, "The SPIR-V Vulkan gets").
    /// [`AdapterSummary::shaders`] says which.
    pub fn from_wgpu(device: wgpu::Device, queue: wgpu::Queue) -> Result<Self> {
        check_device_limits(&device.limits())?;
        let info = device.adapter_info();
        let ctx = Self::build(device, queue, Some(info), 0);
        // a browser cannot wait for the canary's readback here; its drivers are not the old
        // lavapipe the canary guards against (`driver_canary_async` runs it by hand)
        if !cfg!(target_arch = "wasm32") {
            ctx.driver_canary()?;
        }
        ctx.apply_variant_env()?;
        Ok(ctx)
    }

    pub(super) fn build(
        device: wgpu::Device,
        queue: wgpu::Queue,
        info: Option<wgpu::AdapterInfo>,
        coop_frag: u32,
    ) -> Self {
        let limits = device.limits();
        let features = device.features();
        let info = info.unwrap_or_else(|| device.adapter_info());
        let summary = AdapterSummary {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            max_workgroup_storage_bytes: limits.max_compute_workgroup_storage_size,
            max_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            max_storage_binding_bytes: limits.max_storage_buffer_binding_size,
            max_buffer_bytes: limits.max_buffer_size,
            max_storage_buffers_per_stage: limits.max_storage_buffers_per_shader_stage,
            max_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            timestamp_query: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            cooperative_matrices: "not offered".into(),
            shaders: "WGSL".into(),
        };
        let fixed = features.contains(wgpu::Features::SUBGROUP)
            && info.subgroup_min_size == info.subgroup_max_size
            && (2..=64).contains(&info.subgroup_min_size);
        let fixed_subgroup = if fixed { info.subgroup_min_size } else { 0 };
        let shader_f16 = features.contains(wgpu::Features::SHADER_F16);
        let tuning = Tuning {
            variant: Variant::for_device_type(info.device_type),
            rows_subgroup: fixed_subgroup,
            decode_q_chunks: crate::kernels::decode_q_chunks_for(info.device_type),
            half_storage: if shader_f16 {
                HalfStorage::Native
            } else {
                HalfStorage::Packed
            },
        };
        let caps = DeviceCaps {
            max_workgroup_storage_bytes: limits.max_compute_workgroup_storage_size,
            max_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            coop: if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
                && shader_f16
                && features.contains(wgpu::Features::SUBGROUP)
            {
                coop_frag
            } else {
                0
            },
            private_floats: if info.device_type == wgpu::DeviceType::Cpu {
                crate::kernels::CPU_PRIVATE_FLOATS
            } else {
                crate::kernels::GPU_PRIVATE_FLOATS
            },
            gpu: crate::kernels::GpuClass::of(
                info.vendor,
                &info.name,
                (info.subgroup_min_size, info.subgroup_max_size),
                info.device_type == wgpu::DeviceType::Cpu,
            ),
        };
        let lost = Arc::new(Mutex::new(None));
        let lost_cb = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = lost_cb.lock() {
                *l = Some(format!("{reason:?}: {msg}"));
            }
        });
        #[cfg(target_arch = "wasm32")]
        let uncaptured = {
            let slot: Arc<Mutex<Option<Error>>> = Arc::new(Mutex::new(None));
            let cb = slot.clone();
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                let err = match &e {
                    wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory(wgpu_error::describe(&e)),
                    wgpu::Error::Validation { .. } => Error::Validation(wgpu_error::describe(&e)),
                    wgpu::Error::Internal { .. } => Error::Device(wgpu_error::describe(&e)),
                };
                if let Ok(mut s) = cb.lock() {
                    s.get_or_insert(err);
                }
            }));
            slot
        };
        #[cfg(not(target_arch = "wasm32"))]
        let spirv = spirv_target(&device, &info);
        #[cfg(not(target_arch = "wasm32"))]
        let summary = AdapterSummary {
            shaders: match spirv {
                Some(t) => format!(
                    "SPIR-V {}.{} (naga, layout-clean{})",
                    t.lang_version.0,
                    t.lang_version.1,
                    if t.robust_buffers {
                        ", buffer bounds by the driver"
                    } else {
                        ""
                    }
                ),
                None => "WGSL".into(),
            },
            ..summary
        };
        Context {
            #[cfg(target_arch = "wasm32")]
            uncaptured,
            #[cfg(not(target_arch = "wasm32"))]
            spirv,
            device,
            queue,
            info: summary,
            caps,
            limits,
            pipelines: PipelineCache::default(),
            mem: Arc::new(MemTracker::default()),
            lost,
            timing: Mutex::new(None),
            gpu_timing: std::sync::atomic::AtomicBool::new(false),
            params_pool: Mutex::new(Vec::new()),
            tuning: Mutex::new(tuning),
            fixed_subgroup,
            planned_class: Mutex::new(None),
            compiled_flags: std::sync::atomic::AtomicU32::new(
                crate::kernels::flags::compiled_from_env(),
            ),
        }
    }

    /// Adapter name, backend, driver and the limits in use.
    pub fn adapter_info(&self) -> &AdapterSummary {
        &self.info
    }

    /// The wgpu device this context runs on (for buffers and encoders of your own).
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The queue every call submits on.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// The variant [`VARIANT_ENV`] asks for, in place of the adapter's default.
    fn apply_variant_env(&self) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        spirv::wgsl_requested()?;
        if let Some(variant) = variant_env::requested()? {
            self.set_tuning(Tuning {
                variant,
                ..self.tuning()
            })?;
        }
        Ok(())
    }

    /// The kernel-shape choices in force.
    pub fn tuning(&self) -> Tuning {
        self.tuning.lock().map(|t| *t).unwrap_or(Tuning {
            variant: Variant::Blocks,
            rows_subgroup: 0,
            half_storage: HalfStorage::Packed,
            decode_q_chunks: true,
        })
    }

    /// Which tiled-kernel variant `Algorithm::Tiled` runs.
    pub fn variant(&self) -> Variant {
        self.tuning().variant
    }

    /// Overrides the kernel-shape choices, to benchmark or test alternatives on one adapter.
    pub fn set_tuning(&self, tuning: Tuning) -> Result<()> {
        if tuning.rows_subgroup != 0 && tuning.rows_subgroup != self.fixed_subgroup {
            return Err(Error::invalid(format!(
                "rows_subgroup must be 0 or this adapter's fixed subgroup size ({}), got {}",
                self.fixed_subgroup, tuning.rows_subgroup
            )));
        }
        if tuning.half_storage == HalfStorage::Native && !self.info.shader_f16 {
            return Err(Error::Unsupported {
                feature: "native f16 storage (HalfStorage::Native)".into(),
                backend: crate::Backend::Wgpu,
                reason: format!(
                    "adapter {:?} does not offer SHADER_F16; use HalfStorage::Packed",
                    self.info.name
                ),
            });
        }
        if tuning.variant == Variant::Coop && self.caps.coop == 0 {
            return Err(Error::Unsupported {
                feature: "the coop variant (Variant::Coop)".into(),
                backend: crate::Backend::Wgpu,
                reason: format!(
                    "adapter {:?}: cooperative matrices {}; use Variant::Blocks",
                    self.info.name, self.info.cooperative_matrices
                ),
            });
        }
        self.set_tuning_unchecked(tuning);
        Ok(())
    }

    fn set_tuning_unchecked(&self, tuning: Tuning) {
        if let Ok(mut t) = self.tuning.lock() {
            *t = tuning;
        }
    }

    /// Everything planning needs to know about this device, with the tuning in force.
    pub fn plan_env(&self) -> PlanEnv {
        let gpu = self.planned_class.lock().ok().and_then(|c| *c);
        PlanEnv {
            caps: DeviceCaps {
                gpu: gpu.unwrap_or(self.caps.gpu),
                ..self.caps
            },
            tuning: self.tuning(),
            max_binding_bytes: self.binding_limit().min(u32::MAX as u64),
            offset_align: self.limits.min_storage_buffer_offset_alignment as u64,
            compiled_flags: self.compiled_flags(),
        }
    }

    /// Plans the blocks kernels' tiles as a wave64 GPU (AMD's GCN, Vega, CDNA) takes them
    /// (`kernels::tiles::WAVE64_CU_TILES`), on any adapter: [`Context::plan_as_gpu`].
    #[doc(hidden)]
    pub fn plan_as_wave64_gpu(&self, on: bool) {
        self.plan_as_gpu(on.then_some(GpuClass::Wave64Cu));
    }

    /// Plans the blocks kernels' tiles as a GPU of `class` takes them
    /// ([`GpuClass::blocks_tiles`]), on any adapter (`None`: as this adapter's own): for
    /// tests, which run those tiles where no such GPU is. Not for callers: the tiles are
    /// chosen for that hardware.
    #[doc(hidden)]
    pub fn plan_as_gpu(&self, class: Option<GpuClass>) {
        if let Ok(mut c) = self.planned_class.lock() {
            *c = class;
        }
    }

    /// The modifier bits compiled into this context's pipelines ([`crate::kernels::flags`]);
    /// the others are read at run time.
    pub fn compiled_flags(&self) -> u32 {
        self.compiled_flags
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Compiles these modifier bits into pipelines from now on (and reads the others at run
    /// time): for measuring what a run-time bit costs beside its compiled-in build. Results do
    /// not change; pipelines compiled before stay cached.
    #[doc(hidden)]
    pub fn set_compiled_flags(&self, bits: u32) {
        self.compiled_flags
            .store(bits, std::sync::atomic::Ordering::Relaxed);
    }

    /// Tile shape the library picks for a tiled kernel on this device; a head_dim outside
    /// 1..=256 is `Error::InvalidConfig`.
    pub fn tiles_for(&self, kernel: Kernel, head_dim: usize) -> Result<Tiles> {
        if !(1..=crate::MAX_HEAD_DIM).contains(&head_dim) {
            return Err(Error::invalid(format!(
                "tiles_for: head_dim must be in 1..={}, got {head_dim}",
                crate::MAX_HEAD_DIM
            )));
        }
        crate::kernels::choose_tiles(kernel, head_dim as u32, self.caps)
    }

    /// Tile shape a call of `cfg` runs `kernel` with: [`Context::tiles_for`]'s, or with a
    /// block mask of blocks smaller than those tiles, tiles halved to fit a block where the
    /// mask makes that pay (`cfg` is not otherwise checked here).
    pub fn tiles_for_call(&self, kernel: Kernel, cfg: &crate::AttentionConfig) -> Result<Tiles> {
        crate::plan::tiles_for(kernel, cfg, &self.plan_env())
    }
}

/// Where the SPIR-V route is open: a Vulkan device with `PASSTHROUGH_SHADERS`, unless
/// [`SHADERS_ENV`] says `wgsl`. The SPIR-V version follows the device's Vulkan version, as
/// wgpu's own does.
#[cfg(not(target_arch = "wasm32"))]
fn spirv_target(device: &wgpu::Device, info: &wgpu::AdapterInfo) -> Option<spirv::SpirvTarget> {
    let features = device.features();
    if info.backend != wgpu::Backend::Vulkan
        || !features.contains(wgpu::Features::PASSTHROUGH_SHADERS)
        || !matches!(spirv::wgsl_requested(), Ok(false))
    {
        return None;
    }
    // SAFETY: only reads the physical device's properties and features; nothing is created
    // or destroyed. The features2 query is made only where Vulkan 1.1 guarantees it.
    let (api_version, robust_buffers) = unsafe {
        let hal = device.as_hal::<wgpu::hal::api::Vulkan>()?;
        let instance = hal.shared_instance();
        let raw = instance.raw_instance();
        let pd = hal.raw_physical_device();
        let api_version = raw.get_physical_device_properties(pd).api_version;
        let v1_1 = ash::vk::API_VERSION_1_1;
        // wgpu enables robustBufferAccess2 wherever the device has it, with the extension
        let robust = instance.instance_api_version() >= v1_1
            && api_version >= v1_1
            && hal
                .enabled_device_extensions()
                .contains(&ash::ext::robustness2::NAME)
            && {
                let mut r2 = ash::vk::PhysicalDeviceRobustness2FeaturesEXT::default();
                let mut f2 = ash::vk::PhysicalDeviceFeatures2::default().push_next(&mut r2);
                raw.get_physical_device_features2(pd, &mut f2);
                r2.robust_buffer_access2 == ash::vk::TRUE
            };
        (api_version, robust)
    };
    Some(spirv::SpirvTarget {
        lang_version: spirv::SpirvTarget::lang_version_for(api_version),
        robust_buffers,
        f16: features.contains(wgpu::Features::SHADER_F16),
        subgroups: features.contains(wgpu::Features::SUBGROUP),
        cooperative_matrices: features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
    })
}

/// A device with `features` (and the experimental cooperative matrices when `coop`) and the
/// adapter's own limits.
pub(super) async fn request(
    adapter: &wgpu::Adapter,
    features: wgpu::Features,
    limits: &wgpu::Limits,
    coop: bool,
) -> Result<(wgpu::Device, wgpu::Queue)> {
    adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("flash-attn-wgpu"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: if coop {
                // SAFETY: only the coop kernels use the experimental feature, and only after
                // they passed their self-check against the f64 reference on a probe device.
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        })
        .await
        .map_err(|e| Error::RequestDevice(e.to_string()))
}

/// The limits below which no kernel of the crate can run (each call checks what its own
/// kernels need beyond these), checked before anything is created so that a too-small device
/// is named as such, not as a failing first buffer. WebGPU's default limits are far above.
pub(super) fn check_device_limits(limits: &wgpu::Limits) -> Result<()> {
    let checks = [
        (
            "storage buffers per shader stage (max_storage_buffers_per_shader_stage)",
            limits.max_storage_buffers_per_shader_stage as u64,
            1,
        ),
        (
            "bytes of storage buffer binding (max_storage_buffer_binding_size)",
            limits.max_storage_buffer_binding_size,
            256,
        ),
        (
            "compute invocations per workgroup (max_compute_invocations_per_workgroup)",
            limits.max_compute_invocations_per_workgroup as u64,
            crate::kernels::wgsl::ELEMENTWISE_WORKGROUP as u64,
        ),
    ];
    for (what, have, need) in checks {
        if have < need {
            return Err(Error::Unsupported {
                feature: "this device".into(),
                backend: crate::Backend::Wgpu,
                reason: format!(
                    "the attention kernels need at least {need} {what}, the device was created \
                     with {have}; create it with wgpu::Limits::default() (the WebGPU defaults) \
                     or the adapter's limits"
                ),
            });
        }
    }
    Ok(())
}
