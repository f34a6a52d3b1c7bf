//! Pipelines built on first use, one per `KernelKey`, into the context's cache
//! (pipeline_cache.rs): the shader module (device/spirv.rs on Vulkan), the layouts, the
//! compute pipeline.

use std::sync::Arc;

pub use super::pipeline_cache::PIPELINE_LOG_ENV;
use super::pipeline_cache::{log_pipeline, Pipeline};
use super::Context;
use crate::error::{Error, Result};
use crate::kernels::wgsl::BindingKind;
use crate::kernels::KernelKey;

impl Context {
    /// How many pipelines this context has compiled (each distinct `KernelKey` once): on a
    /// CPU driver, what a call's first run costs.
    pub fn pipelines_compiled(&self) -> usize {
        self.pipelines
            .compiled
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Context {
    /// The kernel's shader module: on Vulkan with the passthrough path open, our layout-clean
    /// SPIR-V (device/spirv.rs); otherwise, or where that SPIR-V cannot be written, the WGSL.
    fn shader_module(&self, label: &str, wgsl: &str) -> wgpu::ShaderModule {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(target) = &self.spirv {
            if let Ok(words) = super::spirv::kernel_spirv(wgsl, target) {
                // SAFETY: the words are naga's translation of WGSL that naga validated, with
                // the options wgpu uses for this device (bounds checks on), less decorations
                // that only describe buffer layouts; the entry point and its bindings are the
                // ones the pipeline layout below declares.
                return unsafe {
                    self.device.create_shader_module_passthrough(
                        wgpu::ShaderModuleDescriptorPassthrough {
                            label: Some(label),
                            entry_points: std::borrow::Cow::Owned(vec![
                                wgpu::PassthroughShaderEntryPoint {
                                    name: "main".into(),
                                    workgroup_size: (0, 0, 0),
                                },
                            ]),
                            spirv: Some(std::borrow::Cow::Owned(words)),
                            ..Default::default()
                        },
                    )
                };
            }
        }
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(wgsl.into()),
        };
        // SAFETY: every loop in our shaders has a bound fixed before it starts (a
        // constant or a uniform parameter), so the loop-bounding counter naga would add
        // only costs time: it wraps each iteration in a 64-bit countdown that blocks
        // unrolling. Bounds checks on memory stay on.
        unsafe {
            self.device.create_shader_module_trusted(
                desc,
                wgpu::ShaderRuntimeChecks {
                    bounds_checks: true,
                    force_loop_bounding: false,
                    ..wgpu::ShaderRuntimeChecks::checked()
                },
            )
        }
    }

    pub(crate) fn pipeline(&self, key: &KernelKey) -> Result<Arc<Pipeline>> {
        if let Some(p) = self
            .pipelines
            .map
            .lock()
            .map_err(|_| Error::Device("pipeline cache lock poisoned".into()))?
            .get(key)
        {
            return Ok(p.clone());
        }
        let storage = key.storage_bindings();
        if storage > self.limits.max_storage_buffers_per_shader_stage {
            return Err(Error::DeviceLimit {
                what: format!("{}: storage buffers per shader stage", key.kernel.name()),
                needed: storage as u64,
                limit: self.limits.max_storage_buffers_per_shader_stage as u64,
                hint: "request the adapter's own limits (Context::new does) or use a device \
                       that offers the WebGPU default of 8"
                    .into(),
            });
        }
        let label = key.label();
        let wgsl = key.wgsl();
        let started = super::clock::Instant::now();
        self.pipelines
            .compiled
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = self.scoped(|| {
            // the Params uniform, the storage bindings, the extras' uniform where used
            let entries: Vec<wgpu::BindGroupLayoutEntry> = key
                .layout()
                .into_iter()
                .map(|(binding, kind)| wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: match kind {
                            BindingKind::Uniform => wgpu::BufferBindingType::Uniform,
                            BindingKind::Storage { read_only } => {
                                wgpu::BufferBindingType::Storage { read_only }
                            }
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                })
                .collect();
            let layout = self
                .device
                .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some(&label),
                    entries: &entries,
                });
            let pl = self
                .device
                .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some(&label),
                    bind_group_layouts: &[Some(&layout)],
                    immediate_size: 0,
                });
            let module = self.shader_module(&label, &wgsl);
            let pipeline = self
                .device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&label),
                    layout: Some(&pl),
                    module: &module,
                    entry_point: Some("main"),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants: &[],
                        zero_initialize_workgroup_memory: false,
                    },
                    cache: None,
                });
            Pipeline { pipeline, layout }
        })?;
        log_pipeline(&label, &wgsl, started.elapsed());
        let p = Arc::new(p);
        self.pipelines
            .map
            .lock()
            .map_err(|_| Error::Device("pipeline cache lock poisoned".into()))?
            .insert(*key, p.clone());
        Ok(p)
    }
}
