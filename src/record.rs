//! Recording: a list of dispatches (from a `Plan`, or a probe) into one command encoder,
//! then submit, wait and read the GPU time. Nothing here decides what to run.

use crate::device::timing::{GpuTiming, LastTiming};
use crate::device::{Context, TrackedBuffer};
use crate::error::{Error, Result};
use crate::kernels::{flags, fold_grid, KernelKey, Params};
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

/// A buffer copy to record before the dispatches (a KV cache's append); with no source, a
/// clear of the destination range (a caller-held output, which a call's own outputs are
/// born as: zero-filled).
pub(crate) struct Copy<'a> {
    pub src: Option<&'a wgpu::Buffer>,
    pub src_offset: u64,
    pub dst: &'a wgpu::Buffer,
    pub dst_offset: u64,
    pub size: u64,
}

/// Bytes of each pooled parameter buffer (`Context::params_buffer`): 64 dispatches of 256
/// bytes, more than any unsplit call records.
pub(crate) const PARAMS_POOL_BYTES: u64 = 16 << 10;

/// Pooled parameter buffers kept per context: one per call in flight on different threads.
const PARAMS_POOL_BUFFERS: usize = 8;

impl Context {
    /// GPU time of the most recent call. With [`set_gpu_timing`](Context::set_gpu_timing)
    /// on (and an adapter with timestamp queries), measured by timestamps around each
    /// dispatch; otherwise the wall clock from the call's start until its work finished,
    /// waiting for it here (so call it right after the call to time it). In a browser
    /// (wasm32), which cannot wait, calls are never timed and this is `None`.
    pub fn last_gpu_timing(&self) -> Option<GpuTiming> {
        let mut guard = self.timing.lock().ok()?;
        match guard.as_ref()? {
            LastTiming::Measured(t) => Some(t.clone()),
            LastTiming::Pending { .. } if cfg!(target_arch = "wasm32") => None,
            LastTiming::Pending { start, submission } => {
                self.device
                    .poll(wgpu::PollType::Wait {
                        submission_index: Some(submission.clone()),
                        timeout: None,
                    })
                    .ok()?;
                let t = GpuTiming {
                    seconds: start.elapsed().as_secs_f64(),
                    from_timestamps: false,
                    per_kernel: Vec::new(),
                };
                *guard = Some(LastTiming::Measured(t.clone()));
                Some(t)
            }
        }
    }

    /// Whether calls measure their GPU time with timestamp queries, per dispatch (where the
    /// adapter has them: `AdapterSummary::timestamp_query`). Off by default: each timed call
    /// pays for a query set, a resolve and a readback, and waits for the GPU. Benchmarks turn
    /// it on. Without it, a call on device tensors returns as soon as its work is submitted.
    pub fn set_gpu_timing(&self, on: bool) {
        self.gpu_timing
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether [`set_gpu_timing`](Context::set_gpu_timing) is on.
    pub fn gpu_timing(&self) -> bool {
        self.gpu_timing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes between two dispatches' parameters in one uniform buffer: `Params` rounded up to
    /// the device's uniform offset alignment.
    fn params_stride(&self) -> u64 {
        (std::mem::size_of::<Params>() as u64)
            .next_multiple_of(self.limits.min_uniform_buffer_offset_alignment.max(4) as u64)
    }

    /// A uniform buffer holding every dispatch's parameters at `params_stride` apart, written
    /// with one queue write: from the context's pool where they fit its buffers (the caller
    /// gives it back after submitting), else made for this call. A pooled buffer is safe to
    /// rewrite for the next call at once: queue writes and submissions run in queue order, so
    /// work already submitted reads what was there when it was submitted.
    fn params_buffer(&self, dispatches: &[Dispatch<'_>], pool: bool) -> (wgpu::Buffer, bool) {
        let stride = self.params_stride();
        let need = (stride * dispatches.len().max(1) as u64).max(PARAMS_POOL_BYTES);
        let pooled = pool && need == PARAMS_POOL_BYTES;
        let buf = pooled
            .then(|| self.params_pool.lock().ok().and_then(|mut p| p.pop()))
            .flatten()
            .unwrap_or_else(|| {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("params"),
                    size: need,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            });
        let mut bytes = vec![0u8; (stride * dispatches.len() as u64) as usize];
        for (i, d) in dispatches.iter().enumerate() {
            let at = i * stride as usize;
            bytes[at..at + std::mem::size_of::<Params>()]
                .copy_from_slice(bytemuck::bytes_of(&d.params));
        }
        if !bytes.is_empty() {
            self.queue.write_buffer(&buf, 0, &bytes);
        }
        (buf, pooled)
    }

    /// Records the copies, then the dispatches, in order, into `enc`, one compute pass each,
    /// with a begin and end timestamp per pass when `query` is given; dispatch n's parameters
    /// are at `n * params_stride` in `params`. The command buffer keeps the bind groups alive
    /// until it has run.
    fn record(
        &self,
        enc: &mut wgpu::CommandEncoder,
        (copies, dispatches): (&[Copy<'_>], &[Dispatch<'_>]),
        pipelines: &[std::sync::Arc<crate::device::pipeline_cache::Pipeline>],
        (params, query): (&wgpu::Buffer, Option<&wgpu::QuerySet>),
    ) {
        for c in copies {
            match c.src {
                Some(src) => {
                    enc.copy_buffer_to_buffer(src, c.src_offset, c.dst, c.dst_offset, c.size)
                }
                None => enc.clear_buffer(c.dst, c.dst_offset, Some(c.size)),
            }
        }
        let max_dim = self.limits.max_compute_workgroups_per_dimension;
        let stride = self.params_stride();
        for (n, (d, p)) in dispatches.iter().zip(pipelines).enumerate() {
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: params,
                    offset: n as u64 * stride,
                    size: std::num::NonZeroU64::new(std::mem::size_of::<Params>() as u64),
                }),
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

    /// Records the dispatches in order into one submission and submits it; with GPU timing on
    /// (`set_gpu_timing`), waits for it and reads its timestamps. Returns without waiting
    /// otherwise: reading a result back waits.
    pub(crate) fn run(&self, dispatches: &[Dispatch<'_>]) -> Result<()> {
        self.run_with(&[], dispatches, self.gpu_timing())
    }

    /// `run`, with timestamps (and the wait they need) where `timed` and the adapter has them.
    pub(crate) fn run_timed(&self, dispatches: &[Dispatch<'_>], timed: bool) -> Result<()> {
        self.run_with(&[], dispatches, timed)
    }

    /// Records the copies, then the dispatches, into the caller's `enc`, without submitting:
    /// the caller submits it (on this context's queue). The parameters get a buffer of their
    /// own (a pooled one could be rewritten by a later call before the caller submits); no
    /// timestamps.
    pub(crate) fn record_into(
        &self,
        enc: &mut wgpu::CommandEncoder,
        copies: &[Copy<'_>],
        dispatches: &[Dispatch<'_>],
    ) -> Result<()> {
        let pipelines = dispatches
            .iter()
            .map(|d| self.pipeline(&d.key))
            .collect::<Result<Vec<_>>>()?;
        self.scoped(|| {
            let (params, _) = self.params_buffer(dispatches, false);
            self.record(enc, (copies, dispatches), &pipelines, (&params, None));
        })?;
        if let Ok(mut t) = self.timing.lock() {
            *t = None;
        }
        Ok(())
    }

    /// `run_timed` after buffer copies recorded first in the same command buffer.
    pub(crate) fn run_with(
        &self,
        copies: &[Copy<'_>],
        dispatches: &[Dispatch<'_>],
        timed: bool,
    ) -> Result<()> {
        let pipelines = dispatches
            .iter()
            .map(|d| self.pipeline(&d.key))
            .collect::<Result<Vec<_>>>()?;
        // a browser cannot wait for the readback the timing needs
        let timed = timed && !cfg!(target_arch = "wasm32");
        let use_ts = timed && self.info.timestamp_query && !dispatches.is_empty();
        let n_ts = 2 * dispatches.len() as u32;
        let start = crate::device::clock::Instant::now();
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
            let (params, pooled) = self.params_buffer(dispatches, true);
            self.record(
                &mut enc,
                (copies, dispatches),
                &pipelines,
                (&params, query.as_ref()),
            );
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
            let submission = self.queue.submit([enc.finish()]);
            if pooled {
                if let Ok(mut pool) = self.params_pool.lock() {
                    if pool.len() < PARAMS_POOL_BUFFERS {
                        pool.push(params);
                    }
                }
            }
            (resolve, submission)
        })?;
        let (ts, submission) = ts;
        if !timed {
            if let Ok(mut t) = self.timing.lock() {
                *t = Some(LastTiming::Pending { start, submission });
            }
            return Ok(());
        }
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
            *t = Some(LastTiming::Measured(timing));
        }
        Ok(())
    }

    /// Runs a plan: creates its outputs and scratch (zero-filled), binds the inputs given in
    /// the plan's order, records its copies and every step into one submission and submits it
    /// (`run_with`: waiting only with GPU timing on).
    pub(crate) fn execute(&self, plan: &Plan, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.execute_into(plan, inputs, None, None)
    }

    /// `execute`, recorded into the caller's encoder (`Some`) instead of submitted, and
    /// writing into the caller's `given` outputs (cleared first, in the same submission)
    /// instead of new ones; then the returned tensors are handles on the caller's.
    pub(crate) fn execute_into(
        &self,
        plan: &Plan,
        inputs: &[&Tensor],
        into: Option<&mut wgpu::CommandEncoder>,
        given: Option<&[&Tensor]>,
    ) -> Result<Vec<Tensor>> {
        if inputs.len() != plan.inputs.len() {
            return Err(Error::Device(format!(
                "internal: plan takes {} inputs, {} given",
                plan.inputs.len(),
                inputs.len()
            )));
        }
        let input_bytes: Vec<u64> = inputs.iter().map(|t| t.size_bytes()).collect();
        plan.check_bindings(&input_bytes, self.binding_limit())?;
        // strided or unaligned input views: the steps that read them, through Params::views
        let viewed: Option<Vec<crate::plan::Step>> = if inputs.iter().any(|t| t.needs_view()) {
            // copies write row-major destinations (a KV cache); their sources may be views,
            // whose copies the plan made from the view's strides (`forward_with_kvcache`)
            for c in &plan.copies {
                if let BufRef::Input(i) = c.dst {
                    if inputs[i].needs_view() {
                        return Err(crate::tensor::strided_unsupported(
                            "a KV-cache append",
                            inputs[i],
                        ));
                    }
                }
            }
            Some(
                plan.steps
                    .iter()
                    .map(|s| with_views(s, plan, inputs))
                    .collect::<Result<_>>()?,
            )
        } else {
            None
        };
        let steps = viewed.as_deref().unwrap_or(&plan.steps);
        let outputs = match given {
            Some(given) => self.given_outputs(plan, inputs, given)?,
            None => plan
                .outputs
                .iter()
                .map(|o| {
                    self.zeros_of(&o.shape, o.dtype)
                        .map(|t| t.with_role(o.role))
                })
                .collect::<Result<Vec<_>>>()?,
        };
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
        let dispatches: Vec<Dispatch<'_>> = steps
            .iter()
            .map(|s| {
                Ok(Dispatch {
                    key: s.key,
                    params: s.params,
                    buffers: s.buffers.iter().map(resolve).collect::<Result<_>>()?,
                    windows: windows_of(s, inputs),
                    workgroups: s.workgroups,
                })
            })
            .collect::<Result<_>>()?;
        let clears = given.map_or(0, |_| outputs.len());
        let copies: Vec<Copy<'_>> = outputs[..clears]
            .iter()
            .map(|t| {
                Ok(Copy {
                    src: None,
                    src_offset: 0,
                    dst: t.buffer(),
                    dst_offset: 0,
                    size: t.buffer().size(),
                })
            })
            .chain(plan.copies.iter().map(|c| {
                let base = |r: &BufRef| match *r {
                    BufRef::Input(i) => inputs[i].offset(),
                    _ => 0,
                };
                Ok(Copy {
                    src: Some(resolve(&c.src)?),
                    src_offset: base(&c.src) + c.src_offset,
                    dst: resolve(&c.dst)?,
                    dst_offset: base(&c.dst) + c.dst_offset,
                    size: c.size,
                })
            }))
            .collect::<Result<_>>()?;
        let recorded = into.is_some();
        match into {
            Some(enc) => self.record_into(enc, &copies, &dispatches)?,
            None => self.run_with(&copies, &dispatches, self.gpu_timing())?,
        }
        drop(dispatches);
        drop(copies);
        if recorded {
            // the caller's encoder binds them until it is submitted
            let mut scratch = scratch;
            scratch.iter_mut().for_each(TrackedBuffer::keep_for_encoder);
            let mut pairs = pairs;
            pairs.iter_mut().for_each(TrackedBuffer::keep_for_encoder);
        }
        Ok(outputs)
    }
}

/// A step that binds a strided (or unaligned) input view, made to read its inputs through
/// `Params::views` (the VIEWS bit); other steps unchanged. Only the element inputs the
/// kernels read through `q_at` .. `dout_at` may be views, and only in steps that bind them
/// whole (a call within one binding, K/V not paged): otherwise a typed `Unsupported`.
fn with_views(s: &crate::plan::Step, plan: &Plan, inputs: &[&Tensor]) -> Result<crate::plan::Step> {
    use crate::kernels::params::VIEW_SLOTS;
    let bindings = s.key.kernel.bindings();
    let slot = |n: usize| {
        bindings.get(n).and_then(|b| {
            (b.access == crate::kernels::Access::Read)
                .then(|| VIEW_SLOTS.iter().position(|&v| v == b.name))
                .flatten()
        })
    };
    let Some(viewed) = s.buffers.iter().find_map(|r| match *r {
        BufRef::Input(i) if inputs[i].needs_view() => Some(i),
        _ => None,
    }) else {
        return Ok(s.clone());
    };
    let refuse = |i: usize, why: &str| {
        let t = inputs[i];
        Error::Unsupported {
            feature: format!(
                "a strided or unaligned view of {} (strides {:?}, offset {})",
                plan.inputs
                    .get(i)
                    .map_or_else(|| t.describe(), |r| r.to_string()),
                t.strides(),
                t.offset()
            ),
            backend: crate::Backend::Wgpu,
            reason: format!("views are read by calls within one binding; this is {why}"),
        }
    };
    if s.windows.iter().any(Option::is_some) {
        return Err(refuse(
            viewed,
            "a call larger than one binding, which runs in windows of row-major tensors",
        ));
    }
    let mut step = s.clone();
    step.params.flags |= flags::VIEWS;
    if step.key.runtime & flags::VIEWS == 0 {
        // compiled in (FLASH_ATTN_COMPILED_FLAGS): this step's pipeline reads views
        step.key.flags |= flags::VIEWS;
    }
    // the decode kernel's wide reads stay where each viewed k and v row starts on a whole
    // 16-byte word (an MLA cache's values inside its latent keys); other views' rows need not
    let mut whole_words = true;
    for (n, r) in s.buffers.iter().enumerate() {
        let BufRef::Input(i) = *r else { continue };
        let t = inputs[i];
        let Some(v) = slot(n) else {
            if t.needs_view() {
                return Err(crate::tensor::strided_unsupported(s.key.kernel.name(), t));
            }
            continue;
        };
        if s.params.flags & flags::PAGED != 0
            && t.needs_view()
            && matches!(VIEW_SLOTS[v], "k" | "v")
        {
            return Err(refuse(i, "paged K/V, whose pools are row-major pages"));
        }
        step.params.views[v] = t.view_words().ok_or_else(|| {
            Error::invalid(format!(
                "{}: a view of shape {:?} with strides {:?} needs 32-bit element indices",
                t.describe(),
                t.shape(),
                t.strides()
            ))
        })?;
        if matches!(VIEW_SLOTS[v], "k" | "v") {
            let per_word = (16 / t.dtype().size_bytes()) as u32;
            whole_words &= step.params.views[v].iter().all(|x| x % per_word == 0);
        }
    }
    if !whole_words {
        step.key.wide = 0;
        // a view of values past 256 dims read element by element does not fit the kernel
        crate::plan::decode::columns_fit(&step.key)?;
    }
    Ok(step)
}

/// The windows a step's buffers are bound through: the plan's, moved to where a wrapped input
/// lies in its buffer (`Tensor::view`), or the wrapped view itself where the plan binds the
/// whole tensor.
fn windows_of(s: &crate::plan::Step, inputs: &[&Tensor]) -> Vec<Option<Window>> {
    if !s
        .buffers
        .iter()
        .any(|r| matches!(r, BufRef::Input(i) if inputs[*i].view().is_some()))
    {
        return s.windows.clone();
    }
    s.buffers
        .iter()
        .enumerate()
        .map(|(n, r)| match (*r, s.window(n)) {
            (BufRef::Input(i), w) => match (inputs[i].view(), w) {
                (Some(v), Some(w)) => Some(Window {
                    offset: v.offset + w.offset,
                    size: w.size,
                }),
                (Some(v), None) => Some(v),
                (None, w) => w,
            },
            (_, w) => w,
        })
        .collect()
}
