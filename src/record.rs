//! Recording: a list of dispatches (from a `Plan`, or a probe) into one command encoder,
//! then submit, wait and read the GPU time. Nothing here decides what to run.

use crate::device::{Context, TrackedBuffer};
use crate::error::{Error, Result};
use crate::kernels::{fold_grid, KernelKey, Params};
use crate::plan::{BufRef, Plan, Window};
use crate::tensor::Tensor;

/// One dispatch to record: which kernel, its parameters, its buffers (bindings 1..), and how
/// many workgroups do work (the grid is folded to fit the per-dimension limit).
pub(crate) struct Dispatch<'a> {
    pub key: KernelKey,
    pub params: Params,
    pub buffers: Vec<&'a wgpu::Buffer>,
    /// The byte window each buffer is bound through; empty or `None`: the whole buffer.
    pub windows: Vec<Option<Window>>,
    pub workgroups: u32,
}

/// GPU time of the last `run`, from timestamp queries where the adapter has them.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTiming {
    /// Seconds between the first dispatch's start and the last one's end.
    pub seconds: f64,
    /// True when measured with timestamp queries; false when it is wall-clock around a wait.
    pub from_timestamps: bool,
    /// With timestamps: seconds per kernel, summed over its dispatches, in order of first
    /// dispatch (where a call's time goes: the forward, or dK/dV against dQ). Empty without.
    pub per_kernel: Vec<(&'static str, f64)>,
}

impl Context {
    /// GPU time of the most recent forward/backward call.
    pub fn last_gpu_timing(&self) -> Option<GpuTiming> {
        self.timing.lock().ok().and_then(|t| t.clone())
    }

    /// Records the dispatches, in order, into `enc`, one compute pass each, with a begin and
    /// end timestamp per pass when `query` is given. The command buffer keeps the parameter
    /// uniforms and bind groups alive until it has run.
    fn record(
        &self,
        enc: &mut wgpu::CommandEncoder,
        dispatches: &[Dispatch<'_>],
        pipelines: &[std::sync::Arc<crate::kernels::cache::Pipeline>],
        query: Option<&wgpu::QuerySet>,
    ) {
        let max_dim = self.limits.max_compute_workgroups_per_dimension;
        for (n, (d, p)) in dispatches.iter().zip(pipelines).enumerate() {
            let ub = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("params"),
                size: std::mem::size_of::<Params>() as u64,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            self.queue
                .write_buffer(&ub, 0, bytemuck::bytes_of(&d.params));
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: ub.as_entire_binding(),
            }];
            for (i, b) in d.buffers.iter().enumerate() {
                let resource = match d.windows.get(i).copied().flatten() {
                    Some(w) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: b,
                        offset: w.offset,
                        size: std::num::NonZeroU64::new(w.size),
                    }),
                    None => b.as_entire_binding(),
                };
                entries.push(wgpu::BindGroupEntry {
                    binding: i as u32 + 1,
                    resource,
                });
            }
            let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("attention"),
                layout: &p.layout,
                entries: &entries,
            });
            let (x, y) = fold_grid(d.workgroups, max_dim);
            if x == 0 {
                continue;
            }
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(d.key.kernel.name()),
                timestamp_writes: query.map(|q| wgpu::ComputePassTimestampWrites {
                    query_set: q,
                    beginning_of_pass_write_index: Some(2 * n as u32),
                    end_of_pass_write_index: Some(2 * n as u32 + 1),
                }),
            });
            pass.set_pipeline(&p.pipeline);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(x, y, 1);
        }
    }

    /// Records the dispatches in order into one submission, waits for it, and records its
    /// GPU time.
    pub(crate) fn run(&self, dispatches: &[Dispatch<'_>]) -> Result<()> {
        let pipelines = dispatches
            .iter()
            .map(|d| self.pipeline(&d.key))
            .collect::<Result<Vec<_>>>()?;
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
            self.record(&mut enc, dispatches, &pipelines, query.as_ref());
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
            resolve
        })?;
        self.wait()?;
        let wall = start.elapsed().as_secs_f64();
        let mut timing = GpuTiming {
            seconds: wall,
            from_timestamps: false,
            per_kernel: Vec::new(),
        };
        if let Some(read) = ts {
            if self.map_read(&read).is_ok() {
                if let Ok(view) = read.get_mapped_range(..) {
                    let t: &[u64] = bytemuck::cast_slice(&view);
                    let first = t.iter().step_by(2).copied().min().unwrap_or(0);
                    let last = t.iter().skip(1).step_by(2).copied().max().unwrap_or(0);
                    let period = self.queue.get_timestamp_period() as f64;
                    if last > first {
                        let mut per_kernel: Vec<(&'static str, f64)> = Vec::new();
                        for (d, pair) in dispatches.iter().zip(t.chunks_exact(2)) {
                            let secs = pair[1].saturating_sub(pair[0]) as f64 * period * 1e-9;
                            let name = d.key.kernel.name();
                            match per_kernel.iter_mut().find(|(n, _)| *n == name) {
                                Some(entry) => entry.1 += secs,
                                None => per_kernel.push((name, secs)),
                            }
                        }
                        timing = GpuTiming {
                            seconds: (last - first) as f64 * period * 1e-9,
                            from_timestamps: true,
                            per_kernel,
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

    /// Runs a plan: creates its outputs and scratch (zero-filled), binds the inputs given in
    /// the plan's order, records every step into one submission and waits for it.
    pub(crate) fn execute(&self, plan: &Plan, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        if inputs.len() != plan.inputs.len() {
            return Err(Error::Device(format!(
                "internal: plan takes {} inputs, {} given",
                plan.inputs.len(),
                inputs.len()
            )));
        }
        let input_bytes: Vec<u64> = inputs.iter().map(|t| t.buffer().size()).collect();
        plan.check_bindings(&input_bytes, self.binding_limit())?;
        let outputs = plan
            .outputs
            .iter()
            .map(|o| {
                self.zeros_of(&o.shape, o.dtype)
                    .map(|t| t.with_role(o.role))
            })
            .collect::<Result<Vec<_>>>()?;
        let scratch: Vec<TrackedBuffer> = plan
            .scratch
            .iter()
            .map(|s| self.create_storage(s.bytes, s.label))
            .collect::<Result<_>>()?;
        // the per-head extras (ALiBi slopes, sinks): one uniform buffer of the size every
        // pipeline with extras declares, zero past the call's values
        let extras = (!plan.extras.is_empty()).then(|| {
            let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("extras"),
                size: crate::kernels::wgsl::EXTRAS_WORDS as u64 * 4,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            self.queue
                .write_buffer(&buf, 0, bytemuck::cast_slice(&plan.extras));
            buf
        });
        // the pair data (mask bits, bias entries): one read-only storage buffer
        let pairs = if plan.pairs.is_empty() {
            None
        } else {
            let buf = self.create_storage((plan.pairs.len() * 4) as u64, "pair data")?;
            self.queue
                .write_buffer(&buf.buffer, 0, bytemuck::cast_slice(&plan.pairs));
            Some(buf)
        };
        let resolve = |r: &BufRef| -> Result<&wgpu::Buffer> {
            Ok(match *r {
                BufRef::Input(i) => inputs[i].buffer(),
                BufRef::Output(i) => outputs[i].buffer(),
                BufRef::Scratch(i) => &scratch[i].buffer,
                BufRef::Extras => extras.as_ref().ok_or_else(|| {
                    Error::Device("internal: a step binds extras the plan does not have".into())
                })?,
                BufRef::Pairs => {
                    &pairs
                        .as_ref()
                        .ok_or_else(|| {
                            Error::Device(
                                "internal: a step binds pair data the plan does not have".into(),
                            )
                        })?
                        .buffer
                }
            })
        };
        let dispatches: Vec<Dispatch<'_>> = plan
            .steps
            .iter()
            .map(|s| {
                Ok(Dispatch {
                    key: s.key,
                    params: s.params,
                    buffers: s.buffers.iter().map(resolve).collect::<Result<_>>()?,
                    windows: s.windows.clone(),
                    workgroups: s.workgroups,
                })
            })
            .collect::<Result<_>>()?;
        self.run(&dispatches)?;
        drop(dispatches);
        Ok(outputs)
    }
}
