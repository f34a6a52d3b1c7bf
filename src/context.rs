//! The wgpu context: adapter, device, queue, limits in use, the pipeline cache, allocation
//! tracking, and the one place that records, submits and checks GPU work.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::kernels::{fold_grid, Access, DeviceCaps, Kernel, KernelKey, Params, Tiles, Variant};
use crate::tensor::Tensor;

/// What the library knows about the adapter and the limits it runs under.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub max_workgroup_storage_bytes: u32,
    pub max_invocations_per_workgroup: u32,
    pub max_storage_binding_bytes: u64,
    pub max_buffer_bytes: u64,
    pub max_storage_buffers_per_stage: u32,
    pub max_workgroups_per_dimension: u32,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub shader_f16: bool,
    pub subgroups: bool,
    pub timestamp_query: bool,
}

impl fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}, {}, driver {} {}); workgroup storage {} KiB, storage binding {} MiB, \
             subgroup {}..{}, f16 {}, subgroups {}, timestamps {}",
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
        )
    }
}

/// Bytes of device memory held by buffers this library created.
#[derive(Debug, Default)]
pub(crate) struct MemTracker {
    live: AtomicU64,
    peak: AtomicU64,
}

impl MemTracker {
    pub(crate) fn alloc(&self, bytes: u64) {
        let now = self.live.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    pub(crate) fn free(&self, bytes: u64) {
        self.live.fetch_sub(bytes, Ordering::SeqCst);
    }
}

/// Device memory held by buffers the library created (tensors, scratch, uniforms, staging).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held now.
    pub live_bytes: u64,
    /// Most bytes held at once since the context was made or `reset_peak_memory` was called.
    pub peak_bytes: u64,
}

/// A buffer whose bytes count in the context's `MemoryStats` while it lives.
#[derive(Debug)]
pub(crate) struct TrackedBuffer {
    pub(crate) buffer: wgpu::Buffer,
    mem: Arc<MemTracker>,
}

impl Drop for TrackedBuffer {
    fn drop(&mut self) {
        self.mem.free(self.buffer.size());
        self.buffer.destroy();
    }
}

struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

/// One dispatch to record: which kernel, its parameters, its buffers (bindings 1..), and how
/// many workgroups do work (the grid is folded to fit the per-dimension limit).
pub(crate) struct Dispatch<'a> {
    pub key: KernelKey,
    pub params: Params,
    pub buffers: Vec<&'a wgpu::Buffer>,
    pub workgroups: u32,
}

/// GPU time of the last `run`, from timestamp queries where the adapter has them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuTiming {
    /// Seconds between the first dispatch's start and the last one's end.
    pub seconds: f64,
    /// True when measured with timestamp queries; false when it is wall-clock around a wait.
    pub from_timestamps: bool,
}

/// The library's handle on a GPU. Create once, reuse for every call.
pub struct Context {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: AdapterSummary,
    fixed_subgroup: u32,
    pub(crate) caps: DeviceCaps,
    pub(crate) limits: wgpu::Limits,
    pipelines: Mutex<HashMap<KernelKey, Arc<Pipeline>>>,
    pub(crate) mem: Arc<MemTracker>,
    lost: Arc<Mutex<Option<String>>>,
    timing: Mutex<Option<GpuTiming>>,
    tuning: Mutex<Tuning>,
}

/// Per-adapter choices of kernel shape. `Context::new` picks them from the adapter; override
/// them to benchmark or test the alternatives on one adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Which tiled-kernel variant `Algorithm::Tiled` runs.
    pub variant: Variant,
    /// For the rows variant: the subgroup size its tile reads are shared across, or 0 to share
    /// nothing. Only the adapter's fixed subgroup size (min == max) is accepted.
    pub rows_subgroup: u32,
}

const WANTED_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::TIMESTAMP_QUERY);

/// Iterations of the driver canary loop: well past the 65,535 where old lavapipe stops.
pub const CANARY_ITERATIONS: u32 = 200_000;

impl Context {
    /// Picks the default adapter (honouring `WGPU_BACKEND`, `WGPU_ADAPTER_NAME` and
    /// `WGPU_POWER_PREF`), requests its real limits and the optional features we use, and
    /// runs the driver canary. Blocking.
    pub fn new() -> Result<Self> {
        pollster::block_on(Self::new_async())
    }

    pub async fn new_async() -> Result<Self> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pick_adapter(&instance).await?;
        let features = adapter.features() & WANTED_FEATURES;
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("flash-attn-wgpu"),
                required_features: features,
                required_limits: limits,
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::RequestDevice(e.to_string()))?;
        let ctx = Self::build(device, queue, Some(adapter.get_info()));
        ctx.driver_canary()?;
        Ok(ctx)
    }

    /// Wraps a device the caller already has. Uses that device's limits and features.
    pub fn from_wgpu(device: wgpu::Device, queue: wgpu::Queue) -> Result<Self> {
        let info = device.adapter_info();
        let ctx = Self::build(device, queue, Some(info));
        ctx.driver_canary()?;
        Ok(ctx)
    }

    fn build(device: wgpu::Device, queue: wgpu::Queue, info: Option<wgpu::AdapterInfo>) -> Self {
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
        };
        let fixed_subgroup = (features.contains(wgpu::Features::SUBGROUP)
            && info.subgroup_min_size == info.subgroup_max_size
            && (2..=64).contains(&info.subgroup_min_size))
        .then_some(info.subgroup_min_size)
        .unwrap_or(0);
        let tuning = Tuning {
            variant: Variant::for_device_type(info.device_type),
            rows_subgroup: fixed_subgroup,
        };
        let caps = DeviceCaps {
            max_workgroup_storage_bytes: limits.max_compute_workgroup_storage_size,
            max_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
        };
        let lost = Arc::new(Mutex::new(None));
        let lost_cb = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = lost_cb.lock() {
                *l = Some(format!("{reason:?}: {msg}"));
            }
        });
        Context {
            device,
            queue,
            info: summary,
            caps,
            limits,
            pipelines: Mutex::new(HashMap::new()),
            mem: Arc::new(MemTracker::default()),
            lost,
            timing: Mutex::new(None),
            tuning: Mutex::new(tuning),
            fixed_subgroup,
        }
    }

    /// Adapter name, backend, driver and the limits in use.
    pub fn adapter_info(&self) -> &AdapterSummary {
        &self.info
    }

    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// Device memory held by this library's buffers now, and the peak.
    pub fn memory_stats(&self) -> MemoryStats {
        MemoryStats {
            live_bytes: self.mem.live.load(Ordering::SeqCst),
            peak_bytes: self.mem.peak.load(Ordering::SeqCst),
        }
    }

    /// Restarts peak tracking from the bytes held now.
    pub fn reset_peak_memory(&self) {
        let live = self.mem.live.load(Ordering::SeqCst);
        self.mem.peak.store(live, Ordering::SeqCst);
    }

    /// GPU time of the most recent forward/backward call.
    pub fn last_gpu_timing(&self) -> Option<GpuTiming> {
        self.timing.lock().ok().and_then(|t| *t)
    }

    /// The kernel-shape choices in force.
    pub fn tuning(&self) -> Tuning {
        self.tuning.lock().map(|t| *t).unwrap_or(Tuning {
            variant: Variant::Lanes,
            rows_subgroup: 0,
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
        if let Ok(mut t) = self.tuning.lock() {
            *t = tuning;
        }
        Ok(())
    }

    pub(crate) fn kernel_key(&self, kernel: Kernel, cfg: &crate::AttentionConfig, tiles: Tiles) -> KernelKey {
        KernelKey {
            kernel,
            head_dim: cfg.head_dim as u32,
            tiles,
            causal: cfg.causal,
            subgroup: if kernel.is_rows_variant() { self.tuning().rows_subgroup } else { 0 },
        }
    }

    /// Tile shape the library picks for a tiled kernel on this device.
    pub fn tiles_for(&self, kernel: Kernel, head_dim: usize) -> Result<Tiles> {
        crate::kernels::choose_tiles(kernel, head_dim as u32, self.caps)
    }

    /// Runs a loop of `CANARY_ITERATIONS` in one shader invocation and checks the count.
    /// Mesa lavapipe older than 25 stops such loops after ~65,535 iterations with no error.
    pub fn driver_canary(&self) -> Result<()> {
        let counter = self.create_storage(2 * 4, "canary")?;
        let key = KernelKey {
            kernel: Kernel::Canary,
            head_dim: 1,
            tiles: Tiles::ONE,
            causal: false,
            subgroup: 0,
        };
        let seed = 12345u32;
        let params = Params {
            total_items: CANARY_ITERATIONS,
            slice_base: seed,
            ..Default::default()
        };
        self.run(&[Dispatch {
            key,
            params,
            buffers: vec![&counter.buffer],
            workgroups: 1,
        }])?;
        let got: Vec<u32> = self.read_buffer(&counter.buffer, 8)?;
        let mut hash = seed;
        for _ in 0..CANARY_ITERATIONS {
            hash = hash.wrapping_mul(1664525).wrapping_add(1013904223);
        }
        if got[0] != CANARY_ITERATIONS || got[1] != hash {
            return Err(Error::DriverCanary {
                expected: CANARY_ITERATIONS,
                got: got[0],
            });
        }
        Ok(())
    }

    pub(crate) fn check_alive(&self) -> Result<()> {
        if let Ok(l) = self.lost.lock() {
            if let Some(msg) = l.as_ref() {
                return Err(Error::Device(msg.clone()));
            }
        }
        Ok(())
    }

    /// Runs `f` inside validation, out-of-memory and internal error scopes and turns any
    /// captured error into `Err`.
    pub(crate) fn scoped<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        self.check_alive()?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let out = f();
        let internal = pollster::block_on(internal.pop());
        let validation = pollster::block_on(validation.pop());
        let oom = pollster::block_on(oom.pop());
        if let Some(e) = oom {
            return Err(Error::OutOfMemory(e.to_string()));
        }
        if let Some(e) = validation {
            return Err(Error::Validation(e.to_string()));
        }
        if let Some(e) = internal {
            return Err(Error::Device(e.to_string()));
        }
        self.check_alive()?;
        Ok(out)
    }

    /// Checks a buffer size against the device's buffer and binding limits.
    pub(crate) fn check_buffer_size(&self, bytes: u64, what: &str) -> Result<()> {
        let limit = self
            .limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size);
        if bytes > limit {
            return Err(Error::DeviceLimit {
                what: format!("{what} buffer"),
                needed: bytes,
                limit,
                hint: "split the batch or heads into several calls".into(),
            });
        }
        Ok(())
    }

    /// A zeroed storage buffer of `bytes` (rounded up to 4) that can be copied in and out.
    pub(crate) fn create_storage(&self, bytes: u64, label: &str) -> Result<TrackedBuffer> {
        let bytes = bytes.max(4).next_multiple_of(4);
        self.check_buffer_size(bytes, label)?;
        let buffer = self.scoped(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        self.mem.alloc(bytes);
        Ok(TrackedBuffer {
            buffer,
            mem: self.mem.clone(),
        })
    }

    /// Copies a tensor-sized slice of host data into a new storage buffer.
    pub(crate) fn upload_bytes(&self, data: &[u8], label: &str) -> Result<TrackedBuffer> {
        let buf = self.create_storage(data.len() as u64, label)?;
        self.scoped(|| self.queue.write_buffer(&buf.buffer, 0, data))?;
        Ok(buf)
    }

    /// Reads `bytes` from the start of a storage buffer back to the host.
    pub(crate) fn read_buffer<T: bytemuck::Pod>(
        &self,
        src: &wgpu::Buffer,
        bytes: u64,
    ) -> Result<Vec<T>> {
        let staging = self.scoped(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        self.mem.alloc(bytes);
        let staging = TrackedBuffer {
            buffer: staging,
            mem: self.mem.clone(),
        };
        self.scoped(|| {
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("readback"),
                });
            enc.copy_buffer_to_buffer(src, 0, &staging.buffer, 0, bytes);
            self.queue.submit([enc.finish()]);
        })?;
        self.map_read(&staging.buffer)?;
        let out = {
            let view = staging
                .buffer
                .get_mapped_range(..)
                .map_err(|e| Error::Device(format!("mapped range: {e}")))?;
            bytemuck::cast_slice::<u8, T>(&view).to_vec()
        };
        staging.buffer.unmap();
        Ok(out)
    }

    /// Maps a whole buffer for reading and blocks until it is mapped. Another thread's poll
    /// may be the one that fires our callback, so poll until the callback has reported.
    fn map_read(&self, buffer: &wgpu::Buffer) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        buffer.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        loop {
            self.wait()?;
            match rx.recv_timeout(std::time::Duration::from_millis(1)) {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => return Err(Error::Device(format!("mapping a buffer for readback: {e}"))),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Error::Device("buffer mapping was dropped".into()))
                }
            }
        }
    }

    /// Blocks until all submitted work is done.
    pub(crate) fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("waiting for the GPU: {e}")))?;
        self.check_alive()
    }

    fn pipeline(&self, key: &KernelKey) -> Result<Arc<Pipeline>> {
        if let Some(p) = self
            .pipelines
            .lock()
            .map_err(|_| Error::Device("pipeline cache lock poisoned".into()))?
            .get(key)
        {
            return Ok(p.clone());
        }
        let storage = key.kernel.bindings().len() as u32;
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
            let entries: Vec<wgpu::BindGroupLayoutEntry> = std::iter::once(
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                },
            )
            .chain(key.kernel.bindings().iter().enumerate().map(|(i, a)| {
                wgpu::BindGroupLayoutEntry {
                    binding: i as u32 + 1,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage {
                            read_only: *a == Access::Read,
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                }
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
            .lock()
            .map_err(|_| Error::Device("pipeline cache lock poisoned".into()))?
            .insert(*key, p.clone());
        Ok(p)
    }

    /// Records the dispatches in order into one submission, waits for it, and records its
    /// GPU time.
    pub(crate) fn run(&self, dispatches: &[Dispatch<'_>]) -> Result<()> {
        let pipelines = dispatches
            .iter()
            .map(|d| self.pipeline(&d.key))
            .collect::<Result<Vec<_>>>()?;
        let max_dim = self.limits.max_compute_workgroups_per_dimension;
        let use_ts = self.info.timestamp_query && !dispatches.is_empty();
        let n_ts = 2 * dispatches.len() as u32;
        let start = std::time::Instant::now();
        let ts = self.scoped(|| {
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("attention"),
                });
            let query = use_ts.then(|| {
                self.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: n_ts,
                })
            });
            let mut uniforms = Vec::with_capacity(dispatches.len());
            for (n, (d, p)) in dispatches.iter().zip(&pipelines).enumerate() {
                let ub = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("params"),
                    size: std::mem::size_of::<Params>() as u64,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                self.queue.write_buffer(&ub, 0, bytemuck::bytes_of(&d.params));
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: ub.as_entire_binding(),
                }];
                for (i, b) in d.buffers.iter().enumerate() {
                    entries.push(wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: b.as_entire_binding(),
                    });
                }
                let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("attention"),
                    layout: &p.layout,
                    entries: &entries,
                });
                uniforms.push(ub);
                let (x, y) = fold_grid(d.workgroups, max_dim);
                if x == 0 {
                    continue;
                }
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(d.key.kernel.name()),
                    timestamp_writes: query.as_ref().map(|q| wgpu::ComputePassTimestampWrites {
                        query_set: q,
                        beginning_of_pass_write_index: Some(2 * n as u32),
                        end_of_pass_write_index: Some(2 * n as u32 + 1),
                    }),
                });
                pass.set_pipeline(&p.pipeline);
                pass.set_bind_group(0, &bg, &[]);
                pass.dispatch_workgroups(x, y, 1);
            }
            let resolve = query.as_ref().map(|q| {
                let size = n_ts as u64 * 8;
                let resolve = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("timestamps"),
                    size,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                let read = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("timestamps read"),
                    size,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                enc.resolve_query_set(q, 0..n_ts, &resolve, 0);
                enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, size);
                read
            });
            self.queue.submit([enc.finish()]);
            drop(uniforms);
            resolve
        })?;
        self.wait()?;
        let wall = start.elapsed().as_secs_f64();
        let mut timing = GpuTiming {
            seconds: wall,
            from_timestamps: false,
        };
        if let Some(read) = ts {
            if self.map_read(&read).is_ok() {
                if let Ok(view) = read.get_mapped_range(..) {
                    let t: &[u64] = bytemuck::cast_slice(&view);
                    let first = t.iter().step_by(2).copied().min().unwrap_or(0);
                    let last = t.iter().skip(1).step_by(2).copied().max().unwrap_or(0);
                    let period = self.queue.get_timestamp_period() as f64;
                    if last > first {
                        timing = GpuTiming {
                            seconds: (last - first) as f64 * period * 1e-9,
                            from_timestamps: true,
                        };
                    }
                }
                read.unmap();
            }
        }
        if let Ok(mut t) = self.timing.lock() {
            *t = Some(timing);
        }
        Ok(())
    }

    /// Wraps a tracked buffer as a tensor.
    pub(crate) fn tensor(&self, buf: TrackedBuffer, shape: &[usize]) -> Tensor {
        Tensor::from_parts(buf, shape.to_vec())
    }
}

async fn pick_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter> {
    if let Ok(wanted) = std::env::var("WGPU_ADAPTER_NAME") {
        let wanted_lc = wanted.to_lowercase();
        let adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        return adapters
            .into_iter()
            .find(|a| a.get_info().name.to_lowercase().contains(&wanted_lc))
            .ok_or_else(|| Error::NoAdapter {
                detail: format!(
                    "WGPU_ADAPTER_NAME={wanted:?} matches none of the adapters found: {names:?}"
                ),
            });
    }
    instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::from_env()
                .unwrap_or(wgpu::PowerPreference::HighPerformance),
            force_fallback_adapter: false,
            compatible_surface: None,
            // We want the adapter's real limits (workgroup storage, binding sizes).
            apply_limit_buckets: false,
        })
        .await
        .map_err(|e| Error::NoAdapter {
            detail: e.to_string(),
        })
}
