//! The pipeline cache: one compiled pipeline per `KernelKey`, built on first use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Access, KernelKey};
use crate::device::Context;
use crate::error::{Error, Result};

/// A compiled pipeline and its bind-group layout.
pub(crate) struct Pipeline {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
}

/// Pipelines by key, behind a lock so that one context serves many threads.
#[derive(Default)]
pub(crate) struct PipelineCache {
    map: Mutex<HashMap<KernelKey, Arc<Pipeline>>>,
}

impl Context {
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
        let constants = key.constants();
        let p = self.scoped(|| {
            // the Params uniform, the storage bindings, the extras' uniform where used
            let entry = |binding: u32, ty: wgpu::BufferBindingType| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            };
            let entries: Vec<wgpu::BindGroupLayoutEntry> =
                std::iter::once(entry(0, wgpu::BufferBindingType::Uniform))
                    .chain(key.kernel.bindings().iter().enumerate().map(|(i, a)| {
                        let read_only = a.access == Access::Read;
                        entry(i as u32 + 1, wgpu::BufferBindingType::Storage { read_only })
                    }))
                    .chain(
                        key.uses_extras()
                            .then(|| entry(key.extras_slot(), wgpu::BufferBindingType::Uniform)),
                    )
                    .chain(key.uses_pairs().then(|| {
                        entry(
                            key.pairs_slot(),
                            wgpu::BufferBindingType::Storage { read_only: true },
                        )
                    }))
                    .chain(key.bias_grad.then(|| {
                        entry(
                            key.bias_grads_slot(),
                            wgpu::BufferBindingType::Storage { read_only: false },
                        )
                    }))
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
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: wgpu::ShaderSource::Wgsl(wgsl.into()),
            };
            // SAFETY: every loop in our shaders has a bound fixed before it starts (a
            // constant or a uniform parameter), so the loop-bounding counter naga would add
            // only costs time: it wraps each iteration in a 64-bit countdown that blocks
            // unrolling. Bounds checks on memory stay on.
            let module = unsafe {
                self.device.create_shader_module_trusted(
                    desc,
                    wgpu::ShaderRuntimeChecks {
                        bounds_checks: true,
                        force_loop_bounding: false,
                        ..wgpu::ShaderRuntimeChecks::checked()
                    },
                )
            };
            let pipeline = self
                .device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&label),
                    layout: Some(&pl),
                    module: &module,
                    entry_point: Some("main"),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants: &constants,
                        zero_initialize_workgroup_memory: false,
                    },
                    cache: None,
                });
            Pipeline { pipeline, layout }
        })?;
        let p = Arc::new(p);
        self.pipelines
            .map
            .lock()
            .map_err(|_| Error::Device("pipeline cache lock poisoned".into()))?
            .insert(*key, p.clone());
        Ok(p)
    }
}
