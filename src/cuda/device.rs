//! [`CudaContext`]: one NVIDIA GPU through the CUDA driver, with the same host calls as the
//! wgpu [`Context`](crate::Context): `forward_host` and `backward_host`.
//!
//! The driver and NVRTC are loaded at run time. What is missing (no driver, no device, no
//! NVRTC, a GPU older than sm_80) is a typed error that says which and how to fix it; cudarc
//! panics when asked for a library it cannot find, so each is checked before it is used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    self as drv, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchArgs, LaunchConfig, PushKernelArg,
};

use super::kernels::{
    cuda_params, decode_geometry, index_fits, CudaKernel, CudaKey, Launch, Pass, MIN_ARCH,
};
use super::nvrtc::Nvrtc;
use super::tensor::{next_owner, CudaTensor};
use crate::backend::Backend;
use crate::checks::shape_elements;
use crate::checks::{check_lse_values, check_meta};
use crate::checks::{check_shards, ShardMeta};
use crate::kernels::params::Params;
use crate::kvcache::{append_rows, append_runs, kvcache_config};
use crate::rotary::{check_rotation, Positions, Rotary};
use crate::{
    Algorithm, AttentionConfig, DType, Element, Error, Forward, GpuTiming, Gradients, Result,
    TensorRole,
};

/// What runs a call whose head dims the CUDA kernels refuse (`plan::head_dims`).
const CUDA_INSTEAD: &str = "the CUDA kernels take one head dim for q, k and v; the wgpu \
     backend's tiled kernels, naive path and decode kernel run such calls";

// SAFETY: #[repr(C)], plain 4-byte fields, the layout of the kernel's struct (tested in
// kernels.rs).
unsafe impl DeviceRepr for Params {}

fn driver_error(what: &str) -> impl Fn(drv::DriverError) -> Error + '_ {
    move |e| Error::Device(format!("CUDA {what}: {e:?}"))
}

/// One CUDA device: its context and stream, NVRTC, and the kernels compiled for it.
pub struct CudaContext {
    ctx: Arc<drv::CudaContext>,
    stream: Arc<CudaStream>,
    arch: u32,
    name: String,
    max_shared_optin: u32,
    nvrtc: Nvrtc,
    modules: Mutex<HashMap<CudaKey, Arc<CudaModule>>>,
    functions: Mutex<HashMap<(CudaKey, &'static str), CudaFunction>>,
    /// This context's number: its tensors carry it.
    owner: u64,
    /// The last call's timeline, read by `last_gpu_timing`.
    timing: Mutex<Option<Timeline>>,
    /// Whether calls record CUDA events around their launches (`set_gpu_timing`).
    gpu_timing: std::sync::atomic::AtomicBool,
}

/// A split decode call's f32 scratch: the splits' partial out and lse (none with one split).
type DecodePartials = (Option<CudaSlice<f32>>, Option<CudaSlice<f32>>);

/// A call's timeline: when it began on the host, and with GPU timing on, events recorded on
/// the stream, one before the first launch and one after each.
struct Timeline {
    wall: std::time::Instant,
    start: Option<CudaEvent>,
    marks: Vec<(&'static str, CudaEvent)>,
}

impl CudaContext {
    /// CUDA device `ordinal` (0 for the first), with NVRTC from `FLASH_ATTN_NVRTC_DIR` when
    /// set, else from the loader's path.
    pub fn new(ordinal: usize) -> Result<CudaContext> {
        CudaContext::with_nvrtc_dir(ordinal, super::nvrtc::dir_from_env().as_deref())
    }

    /// CUDA device `ordinal`, with NVRTC from `nvrtc_dir` (None: the loader's path).
    pub fn with_nvrtc_dir(
        ordinal: usize,
        nvrtc_dir: Option<&std::path::Path>,
    ) -> Result<CudaContext> {
        // SAFETY: only opens and closes candidate libraries.
        if !unsafe { drv::sys::is_culib_present() } {
            return Err(Error::CudaUnavailable {
                missing: "the CUDA driver (libcuda.so.1)".into(),
                fix: "install the NVIDIA driver, or use the wgpu path (Context::new)".into(),
            });
        }
        let count = drv::CudaContext::device_count().map_err(|e| Error::CudaUnavailable {
            missing: format!("a working CUDA driver (cuInit: {e:?})"),
            fix: "check the NVIDIA driver with nvidia-smi, or use the wgpu path".into(),
        })?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::CudaUnavailable {
                missing: format!("CUDA device {ordinal} (the driver sees {count})"),
                fix: "pick an ordinal below the device count, or use the wgpu path".into(),
            });
        }
        let ctx = drv::CudaContext::new(ordinal).map_err(driver_error("context"))?;
        CudaContext::from_stream(ctx.default_stream(), nvrtc_dir)
    }

    /// A context whose calls are all queued on `stream`, a cudarc stream of yours (an
    /// inference engine's, say), on that stream's device: each call queues its launches (and
    /// a KV-cache call its copies) on it and returns, so attention runs in order with the rest
    /// of your work on that stream, as the wgpu `record_*` calls record into your encoder;
    /// only downloads (and `synchronize`) wait. NVRTC from `nvrtc_dir` (None: the loader's
    /// path).
    pub fn from_stream(
        stream: Arc<CudaStream>,
        nvrtc_dir: Option<&std::path::Path>,
    ) -> Result<CudaContext> {
        let ctx = stream.context().clone();
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver_error("compute capability"))?;
        let arch = (major * 10 + minor) as u32;
        let name = ctx.name().map_err(driver_error("device name"))?;
        if arch < MIN_ARCH {
            return Err(Error::Unsupported {
                feature: format!("the CUDA path on {name} (sm_{arch})"),
                backend: crate::Backend::Cuda,
                reason: format!(
                    "the CUDA kernels need sm_{MIN_ARCH} or newer; use the wgpu path on this GPU"
                ),
            });
        }
        let max_shared_optin = ctx
            .attribute(
                drv::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(driver_error("shared memory limit"))? as u32;
        let nvrtc = Nvrtc::load_from(nvrtc_dir)?;
        Ok(CudaContext {
            ctx,
            stream,
            arch,
            name,
            max_shared_optin,
            nvrtc,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            owner: next_owner(),
            timing: Mutex::new(None),
            gpu_timing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The device's architecture, compute capability x 10 + y (90 for an H100/H200).
    pub fn arch(&self) -> u32 {
        self.arch
    }

    /// The device's name, as the driver gives it.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// NVRTC's (major, minor) version.
    pub fn nvrtc_version(&self) -> (i32, i32) {
        self.nvrtc.version()
    }

    /// A launch's function: the key's program compiled and loaded once per context, the entry
    /// looked up once, its dynamic shared memory allowed.
    fn function(&self, key: &CudaKey, launch: &Launch) -> Result<CudaFunction> {
        let id = (*key, launch.entry);
        if let Some(f) = self.functions.lock().unwrap().get(&id) {
            return Ok(f.clone());
        }
        if launch.shared_bytes > self.max_shared_optin {
            return Err(Error::DeviceLimit {
                what: format!("{} {}: shared memory per block", key.label(), launch.entry),
                needed: launch.shared_bytes as u64,
                limit: self.max_shared_optin as u64,
                hint: "use a smaller head_dim, or the wgpu path".into(),
            });
        }
        let f = self
            .module(key)?
            .load_function(launch.entry)
            .map_err(driver_error("function"))?;
        f.set_attribute(
            drv::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            launch.shared_bytes as i32,
        )
        .map_err(driver_error("shared memory attribute"))?;
        self.functions.lock().unwrap().insert(id, f.clone());
        Ok(f)
    }

    /// The key's program, compiled and loaded once per context. NVRTC runs outside the lock,
    /// so threads compiling different keys do so at once (0.5-0.8 s each; a test suite's
    /// hundreds of keys ran one after another behind it); two threads that meet on one key
    /// may both compile it, and the first to finish is kept.
    fn module(&self, key: &CudaKey) -> Result<Arc<CudaModule>> {
        if let Some(m) = self.modules.lock().unwrap().get(key) {
            return Ok(m.clone());
        }
        let compiled = self.nvrtc.compile(key)?;
        let loaded = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(compiled.cubin.clone()))
            .map_err(driver_error("module load"))?;
        Ok(self
            .modules
            .lock()
            .unwrap()
            .entry(*key)
            .or_insert(loaded)
            .clone())
    }

    /// Points the program's `flash_captured` at the call's captured tensors (the extras from
    /// `captured_base`), queued on the stream before the call's launches; nothing for a key
    /// without them.
    fn bind_captured(
        &self,
        key: &CudaKey,
        shape: &Params,
        extras: &Option<CudaSlice<u8>>,
    ) -> Result<()> {
        let (Some(_), Some(x)) = (key.captured, extras) else {
            return Ok(());
        };
        let module = self.module(key)?;
        let at = {
            let (ptr, _sync) = x.device_ptr(&self.stream);
            ptr + 4 * shape.captured_base as u64
        };
        let mut symbol = module
            .get_global("flash_captured", &self.stream)
            .map_err(driver_error("captured tensors' symbol"))?;
        // SAFETY: the symbol is one device pointer (8 bytes), written as a u64
        let mut word = unsafe { symbol.transmute_mut::<u64>(1) }
            .ok_or_else(|| Error::Device("CUDA captured tensors' symbol: not 8 bytes".into()))?;
        self.stream
            .memcpy_htod(&[at], &mut word)
            .map_err(driver_error("captured tensors' pointer"))
    }

    /// The checks every call shares, and its program's key and scalars.
    fn prepare(
        &self,
        pass: Pass,
        cfg: &AttentionConfig,
        dtype: DType,
    ) -> Result<(CudaKey, Params)> {
        if cfg.algorithm == Algorithm::Naive {
            return Err(Error::Unsupported {
                feature: "Algorithm::Naive".into(),
                backend: crate::Backend::Cuda,
                reason: "the CUDA path has the tiled kernels only; use the wgpu path".into(),
            });
        }
        crate::plan::check_bias_dtype(cfg, dtype)?;
        // every CUDA call takes a separate v (the latent-cache calls are Unsupported here)
        crate::kvcache::separate_v(cfg)?;
        if cfg.paged.is_some() && pass != Pass::Forward {
            return Err(Error::Unsupported {
                feature: "the backward of a paged call (AttentionConfig::paged)".into(),
                backend: crate::Backend::Cuda,
                reason: "paged K/V is an inference layout (pages a batch shares would collide \
                         in dK/dV); run the backward on dense K/V"
                    .into(),
            });
        }
        if let Some(name) = cfg.score_mod.as_ref().and_then(|m| m.trainable()) {
            if pass != Pass::Forward {
                return Err(Error::Unsupported {
                    feature: format!("the gradient of a trainable captured tensor (`{name}`)"),
                    backend: crate::Backend::Cuda,
                    reason: "the CUDA kernels keep no per-pair gradients and scores for it; \
                             run the backward on the wgpu path, or freeze the tensor"
                        .into(),
                });
            }
        }
        let kernel = match pass {
            Pass::Forward => CudaKernel::for_forward(cfg, dtype),
            Pass::Backward => CudaKernel::for_pass(pass, dtype, cfg.head_dim as u32),
        };
        let mut key = CudaKey::new(kernel, dtype, cfg.head_dim as u32, self.arch)?;
        if kernel == CudaKernel::Decode {
            key.decode_rows = decode_geometry(cfg).rows;
        }
        key.flags = crate::registry::bits(cfg) & super::kernels::CUDA_COMPILED;
        key.set_user_code(cfg)?;
        let shape = cuda_params(cfg)?;
        for l in key.launches(cfg) {
            if l.grid.1 > 65_535 || l.grid.2 > 65_535 {
                return Err(Error::DeviceLimit {
                    what: format!("CUDA grid of {}: heads and batch", l.entry),
                    needed: l.grid.1.max(l.grid.2) as u64,
                    limit: 65_535,
                    hint: "split the call over batch or heads".into(),
                });
            }
        }
        Ok((key, shape))
    }

    /// The call's extras (ALiBi slopes, sinks, key lengths, the block mask's bits, the varlen
    /// boundaries: `kernels::params::extras`, the layout the wgpu kernels read, then the
    /// boolean mask's words and the bias's entries, which the wgpu path binds apart:
    /// `Params::pairs_base`) on the device, or `None` without any of them. A
    /// block mask always has a word (every grid has a block), varlen at least four, a boolean
    /// mask and a bias one, so the kernels compiled with BLOCKS, VARLEN, MASK or BIAS always
    /// get a buffer.
    fn extras(&self, cfg: &AttentionConfig) -> Result<Option<CudaSlice<u8>>> {
        let mut x = crate::registry::params::extras(cfg);
        x.extend(crate::registry::params::pair_words(cfg));
        if x.is_empty() {
            return Ok(None);
        }
        self.stream
            .clone_htod(bytemuck::cast_slice::<u32, u8>(&x))
            .map(Some)
            .map_err(driver_error("upload extras"))
    }

    /// Copies host data to a new device tensor of `shape`, in `T`'s dtype.
    pub fn upload<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<CudaTensor> {
        let n = shape_elements(shape)?;
        if data.len() != n {
            return Err(Error::invalid(format!(
                "upload: {} values given for shape {shape:?}, which holds {n}",
                data.len()
            )));
        }
        let data = self
            .stream
            .clone_htod(bytemuck::cast_slice::<T, u8>(data))
            .map_err(driver_error("upload"))?;
        Ok(CudaTensor::owned(data, shape, T::DTYPE, self.owner, None))
    }

    /// Wraps `bytes` of device memory at `ptr`, allocated in this context's CUDA context (an
    /// engine's KV cache, a projection's output), as a row-major tensor of `shape` and
    /// `dtype`, with no copy: calls read it in place, and `forward_with_kvcache` appends into
    /// it in place. The tensor never frees it: the memory stays yours.
    ///
    /// `ptr` must be aligned to 16 bytes (the kernels read rows in 16-byte words, as
    /// `cudaMalloc` aligns), and the shape's elements must fit in `bytes`. `strides` (in
    /// elements; `None`: row-major) must be row-major: strided views (BHSD, a packed QKV
    /// projection) are read by the wgpu kernels only, and are `Unsupported` here. Each is a
    /// typed error naming what was expected and given.
    ///
    /// # Safety
    /// `ptr .. ptr + bytes` must be device memory of this context's CUDA context, live for as
    /// long as the tensor and every call queued with it, and written by no one else while a
    /// queued call uses it.
    pub unsafe fn tensor_from_device_ptr(
        &self,
        ptr: u64,
        bytes: usize,
        shape: &[usize],
        strides: Option<&[usize]>,
        dtype: DType,
    ) -> Result<CudaTensor> {
        let n = shape_elements(shape)?;
        if let Some(s) = strides.filter(|s| *s != crate::tensor::row_major(shape).as_slice()) {
            return Err(Error::Unsupported {
                feature: format!(
                    "strided tensor views on CUDA (strides {s:?} for shape {shape:?})"
                ),
                backend: crate::Backend::Cuda,
                reason: "the CUDA kernels read row-major tensors; wrap a row-major tensor, or \
                         use the wgpu path (Context::tensor_from_buffer) for views"
                    .into(),
            });
        }
        if ptr == 0 || !ptr.is_multiple_of(16) {
            return Err(Error::Buffer {
                what: "tensor_from_device_ptr: the pointer".into(),
                expected: "a non-null address aligned to 16 bytes".into(),
                got: format!("{ptr:#x}"),
            });
        }
        let need = n.checked_mul(dtype.size_bytes()).filter(|&b| b <= bytes);
        let Some(need) = need else {
            return Err(Error::Buffer {
                what: format!("tensor_from_device_ptr: shape {shape:?} of {dtype}"),
                expected: format!("memory of {} bytes", n.saturating_mul(dtype.size_bytes())),
                got: format!("{bytes} bytes"),
            });
        };
        // SAFETY: the caller's promise (above); the slice covers the tensor's bytes only, and
        // drop lets it go without freeing (CudaTensor::borrowed).
        let data = unsafe { self.stream.upgrade_device_ptr::<u8>(ptr, need) };
        let mut t = CudaTensor::owned(data, shape, dtype, self.owner, None);
        t.borrowed = true;
        Ok(t)
    }

    /// Copies a device tensor back to the host as `T`, which must be the tensor's dtype.
    pub fn download<T: Element>(&self, t: &CudaTensor) -> Result<Vec<T>> {
        t.check_owner(self.owner, || t.describe())?;
        if t.dtype != T::DTYPE {
            // the tensor has its dtype; the caller asked for T's
            return Err(Error::DType {
                tensor: t.describe(),
                expected: T::DTYPE,
                got: t.dtype,
            });
        }
        let mut out = vec![T::zeroed(); t.len()];
        self.stream
            .memcpy_dtoh(&*t.data, bytemuck::cast_slice_mut::<T, u8>(&mut out))
            .map_err(driver_error("download"))?;
        Ok(out)
    }

    /// A zero-filled result tensor.
    fn result(&self, role: TensorRole, shape: &[usize], dtype: DType) -> Result<CudaTensor> {
        let n = shape_elements(shape)?;
        let data = self
            .stream
            .alloc_zeros::<u8>(n * dtype.size_bytes())
            .map_err(driver_error("alloc"))?;
        Ok(CudaTensor::owned(
            data,
            shape,
            dtype,
            self.owner,
            Some(role),
        ))
    }

    /// An argument tensor: made by this context, with the config's shape and the call's dtype.
    fn check(
        &self,
        role: TensorRole,
        t: &CudaTensor,
        expected: &[usize],
        dtype: DType,
    ) -> Result<()> {
        t.check_owner(self.owner, || role.to_string())?;
        check_meta(role, &t.shape, t.dtype, expected, dtype)
    }

    fn config(launch: &Launch) -> LaunchConfig {
        LaunchConfig {
            grid_dim: launch.grid,
            block_dim: (launch.threads, 1, 1),
            shared_mem_bytes: launch.shared_bytes,
        }
    }

    fn event(&self) -> Result<CudaEvent> {
        self.stream
            .record_event(Some(drv::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver_error("event"))
    }

    /// Launches `launch` with the arguments pushed on `args`, then marks its end on the
    /// timeline.
    fn launch(
        &self,
        timeline: &mut Timeline,
        launch: &Launch,
        mut args: LaunchArgs<'_>,
    ) -> Result<()> {
        // SAFETY: each caller pushes its entry's parameters in order, with device memory of
        // the sizes the entry indexes (checked against the config beforehand).
        unsafe { args.launch(Self::config(launch)) }.map_err(driver_error("launch"))?;
        if timeline.start.is_some() {
            timeline.marks.push((launch.entry, self.event()?));
        }
        Ok(())
    }

    /// A new call's timeline: events only with GPU timing on.
    fn timeline(&self) -> Result<Timeline> {
        Ok(Timeline {
            wall: std::time::Instant::now(),
            start: if self.gpu_timing() {
                Some(self.event()?)
            } else {
                None
            },
            marks: Vec::new(),
        })
    }

    /// Turns GPU timing on or off (off by default): with it, every call records a CUDA event
    /// before its first launch and after each, and [`last_gpu_timing`](Self::last_gpu_timing)
    /// reports the launches' GPU time per kernel; without it, calls record nothing and
    /// `last_gpu_timing` waits for the stream and reports the host's wall time since the
    /// call began (as the wgpu `Context` without timestamps).
    pub fn set_gpu_timing(&self, on: bool) {
        self.gpu_timing
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether [`set_gpu_timing`](Self::set_gpu_timing) is on.
    pub fn gpu_timing(&self) -> bool {
        self.gpu_timing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits for every launch on this context's stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(driver_error("synchronize"))
    }

    /// GPU time of the most recent call, from CUDA events around its launches (per kernel:
    /// each entry's launch) with GPU timing on ([`set_gpu_timing`](Self::set_gpu_timing)),
    /// else the wall time from the call's start until the stream is idle. Waits for that call
    /// to finish.
    pub fn last_gpu_timing(&self) -> Option<GpuTiming> {
        let guard = self.timing.lock().ok()?;
        let t = guard.as_ref()?;
        let Some(start) = &t.start else {
            self.synchronize().ok()?;
            return Some(GpuTiming {
                seconds: t.wall.elapsed().as_secs_f64(),
                from_timestamps: false,
                per_kernel: Vec::new(),
            });
        };
        let mut per_kernel = Vec::with_capacity(t.marks.len());
        let mut prev = start;
        for (name, ev) in &t.marks {
            per_kernel.push((*name, prev.elapsed_ms(ev).ok()? as f64 * 1e-3));
            prev = ev;
        }
        Some(GpuTiming {
            seconds: start.elapsed_ms(prev).ok()? as f64 * 1e-3,
            from_timestamps: true,
            per_kernel,
        })
    }

    /// Forward pass on device tensors: q `[batch, seq_q, heads_q, head_dim]`, k and v
    /// `[batch, seq_kv, heads_kv, head_dim]`, all f32, f16 or bf16; the same semantics and
    /// results as [`Context::forward`](crate::Context::forward). Returns once the launch is
    /// queued. f16/bf16 with head dims that are multiples of 16 run on tensor cores; the rest
    /// on the exact SIMT kernels ([`CudaKernel::for_pass`]).
    pub fn forward(
        &self,
        cfg: &AttentionConfig,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
    ) -> Result<Forward<CudaTensor>> {
        cfg.validate()?;
        crate::plan::head_dims::refuse(cfg, "the CUDA kernels", Backend::Cuda, CUDA_INSTEAD)?;
        let dtype = q.dtype;
        self.check(TensorRole::Q, q, &cfg.q_shape(), dtype)?;
        self.check(TensorRole::K, k, &cfg.kv_shape(), dtype)?;
        self.check(TensorRole::V, v, &cfg.kv_shape(), dtype)?;
        let (key, shape) = self.prepare(Pass::Forward, cfg, dtype)?;
        let mut out = self.result(TensorRole::Out, &cfg.q_shape(), dtype)?;
        let extras = self.extras(cfg)?;
        self.bind_captured(&key, &shape, &extras)?;
        let mut lse = self.result(TensorRole::Lse, &cfg.lse_shape(), DType::F32)?;
        if key.kernel == CudaKernel::Decode {
            // the splits' scratch (zero-filled: a memset on the stream) before the start
            // event, so that a timed call measures the launches alone
            let partials = self.decode_partials(cfg)?;
            let mut timeline = self.timeline()?;
            self.decode(
                cfg,
                &key,
                &shape,
                [q, k, v],
                (&mut out, &mut lse),
                (&extras, &partials),
                &mut timeline,
            )?;
            *self.timing.lock().unwrap() = Some(timeline);
            return Ok(Forward { out, lse });
        }
        let mut timeline = self.timeline()?;
        let launch = key.launches(cfg)[0];
        let f = self.function(&key, &launch)?;
        let mut a = self.stream.launch_builder(&f);
        a.arg(&*q.data)
            .arg(&*k.data)
            .arg(&*v.data)
            .arg(&mut *out.data)
            .arg(&mut *lse.data)
            .arg(&shape);
        push_extras(&mut a, &extras);
        self.launch(&mut timeline, &launch, a)?;
        *self.timing.lock().unwrap() = Some(timeline);
        Ok(Forward { out, lse })
    }

    /// Backward pass on device tensors, given the forward's out and lse (f32; refused where it
    /// holds +inf, as on wgpu): the same semantics as
    /// [`Context::backward`](crate::Context::backward). Tensor cores for f16/bf16 with head
    /// dims that are multiples of 16 up to 128, the SIMT kernels for the rest. Deterministic:
    /// no atomics.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        cfg: &AttentionConfig,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        out: &CudaTensor,
        lse: &CudaTensor,
        d_out: &CudaTensor,
    ) -> Result<Gradients<CudaTensor>> {
        cfg.validate()?;
        crate::plan::head_dims::refuse(cfg, "the CUDA kernels", Backend::Cuda, CUDA_INSTEAD)?;
        let dtype = q.dtype;
        self.check(TensorRole::Q, q, &cfg.q_shape(), dtype)?;
        self.check(TensorRole::K, k, &cfg.kv_shape(), dtype)?;
        self.check(TensorRole::V, v, &cfg.kv_shape(), dtype)?;
        self.check(TensorRole::Out, out, &cfg.q_shape(), dtype)?;
        self.check(TensorRole::Lse, lse, &cfg.lse_shape(), DType::F32)?;
        self.check(TensorRole::DOut, d_out, &cfg.q_shape(), dtype)?;
        let (key, shape) = self.prepare(Pass::Backward, cfg, dtype)?;
        // one value per row, small beside the pass: read back and checked as on wgpu
        check_lse_values(&self.download::<f32>(lse)?)?;
        let launches = key.launches(cfg);
        let (pre, dkdv, dq_l) = (launches[0], launches[1], launches[2]);
        let (f_pre, f_dkdv, f_dq) = (
            self.function(&key, &pre)?,
            self.function(&key, &dkdv)?,
            self.function(&key, &dq_l)?,
        );
        let mut delta = self.result(TensorRole::Lse, &cfg.lse_shape(), DType::F32)?;
        let mut dq = self.result(TensorRole::Dq, &cfg.q_shape(), dtype)?;
        let mut dk = self.result(TensorRole::Dk, &cfg.kv_shape(), dtype)?;
        let mut dv = self.result(TensorRole::Dv, &cfg.kv_shape(), dtype)?;
        let extras = self.extras(cfg)?;
        self.bind_captured(&key, &shape, &extras)?;
        let batch = cfg.batch as u32;
        // with a bias that asks for d_bias: the f32 scratch where the dQ kernel keeps each
        // pair's gradient [batch, heads_q, seq_q, seq_kv], zero-filled
        let bias_grads = match &cfg.bias {
            Some(b) if b.grad => Some(self.result(
                TensorRole::DBias,
                &[cfg.batch, cfg.heads_q, cfg.seq_q, cfg.seq_kv],
                DType::F32,
            )?),
            _ => None,
        };
        let mut timeline = self.timeline()?;
        let mut a = self.stream.launch_builder(&f_pre);
        a.arg(&*out.data)
            .arg(&*d_out.data)
            .arg(&mut *delta.data)
            .arg(&shape)
            .arg(&batch);
        self.launch(&mut timeline, &pre, a)?;
        let mut a = self.stream.launch_builder(&f_dkdv);
        a.arg(&*q.data)
            .arg(&*k.data)
            .arg(&*v.data)
            .arg(&*d_out.data)
            .arg(&*lse.data)
            .arg(&*delta.data)
            .arg(&mut *dk.data)
            .arg(&mut *dv.data)
            .arg(&shape);
        push_extras(&mut a, &extras);
        self.launch(&mut timeline, &dkdv, a)?;
        let mut a = self.stream.launch_builder(&f_dq);
        a.arg(&*q.data)
            .arg(&*k.data)
            .arg(&*v.data)
            .arg(&*d_out.data)
            .arg(&*lse.data)
            .arg(&*delta.data)
            .arg(&mut *dq.data);
        match &bias_grads {
            Some(g) => a.arg(&*g.data),
            None => a.arg(&NULL_POINTER),
        };
        a.arg(&shape);
        push_extras(&mut a, &extras);
        self.launch(&mut timeline, &dq_l, a)?;
        let find = |entry: &str| launches.iter().find(|l| l.entry == entry);
        // with sinks: their gradient, from lse and delta
        let d_sinks = match find("flash_sinks_grad") {
            Some(l) => {
                let f = self.function(&key, l)?;
                let mut d = self.result(TensorRole::DSinks, &[cfg.heads_q], DType::F32)?;
                let mut a = self.stream.launch_builder(&f);
                a.arg(&*lse.data)
                    .arg(&*delta.data)
                    .arg(&mut *d.data)
                    .arg(&shape)
                    .arg(&batch);
                push_extras(&mut a, &extras);
                self.launch(&mut timeline, l, a)?;
                Some(d)
            }
            _ => None,
        };
        // with a bias that asks for it: the kept gradients summed into d_bias, one thread
        // per entry
        let d_bias = match (find("flash_bias_reduce"), &cfg.bias, &bias_grads) {
            (Some(l), Some(bias), Some(grads)) => {
                let f = self.function(&key, l)?;
                let mut d = self.result(TensorRole::DBias, &bias.shape(), dtype)?;
                let entries = bias.len() as u32;
                let mut a = self.stream.launch_builder(&f);
                a.arg(&*grads.data)
                    .arg(&mut *d.data)
                    .arg(&shape)
                    .arg(&batch)
                    .arg(&entries);
                self.launch(&mut timeline, l, a)?;
                Some(d)
            }
            _ => None,
        };
        *self.timing.lock().unwrap() = Some(timeline);
        Ok(Gradients {
            dq,
            dk,
            dv,
            d_sinks,
            d_bias,
            d_table: None,
        })
    }
}

impl CudaContext {
    /// A decode call's f32 scratch for the splits' partial results (out, lse), zero-filled;
    /// none with one split (the kernel never reads them). Made before the call's start event:
    /// the fill is a memset on the stream, not part of the call's time.
    fn decode_partials(&self, cfg: &AttentionConfig) -> Result<DecodePartials> {
        let g = decode_geometry(cfg);
        if g.splits == 1 {
            return Ok((None, None));
        }
        let rows = g.splits as usize * cfg.batch * cfg.heads_q * cfg.seq_q;
        let scratch = |n: usize| {
            self.stream
                .alloc_zeros::<f32>(n)
                .map_err(driver_error("alloc decode partials"))
        };
        Ok((Some(scratch(rows * cfg.head_dim)?), Some(scratch(rows)?)))
    }

    /// A decode call's launches (`cuda/flash_decode.cu`): one block per (row chunk, key
    /// split) of each kv head; with one split it writes out and lse itself, else each split's
    /// partial result goes to the scratch from [`decode_partials`](Self::decode_partials)
    /// and `flash_decode_combine` merges them.
    #[allow(clippy::too_many_arguments)]
    fn decode(
        &self,
        cfg: &AttentionConfig,
        key: &CudaKey,
        shape: &Params,
        [q, k, v]: [&CudaTensor; 3],
        (out, lse): (&mut CudaTensor, &mut CudaTensor),
        (extras, (part_out, part_lse)): (&Option<CudaSlice<u8>>, &DecodePartials),
        timeline: &mut Timeline,
    ) -> Result<()> {
        let g = decode_geometry(cfg);
        let launches = key.launches(cfg);
        let direct = u32::from(g.splits == 1);
        let f = self.function(key, &launches[0])?;
        let mut a = self.stream.launch_builder(&f);
        a.arg(&*q.data).arg(&*k.data).arg(&*v.data);
        for part in [part_out, part_lse] {
            match part {
                Some(p) => a.arg(p),
                None => a.arg(&NULL_POINTER),
            };
        }
        a.arg(&mut *out.data)
            .arg(&mut *lse.data)
            .arg(shape)
            .arg(&g.splits)
            .arg(&g.split_keys)
            .arg(&direct);
        push_extras(&mut a, extras);
        self.launch(timeline, &launches[0], a)?;
        if let (Some(combine), Some(po), Some(pl)) = (launches.get(1), part_out, part_lse) {
            let f = self.function(key, combine)?;
            let batch = cfg.batch as u32;
            let mut a = self.stream.launch_builder(&f);
            a.arg(po)
                .arg(pl)
                .arg(&mut *out.data)
                .arg(&mut *lse.data)
                .arg(shape)
                .arg(&g.splits)
                .arg(&batch);
            push_extras(&mut a, extras);
            self.launch(timeline, combine, a)?;
        }
        Ok(())
    }

    /// The block mask of a user mask, as [`Context::create_block_mask`](crate::Context::create_block_mask)
    /// (the same arguments, semantics and errors), evaluated on this device from the mask's
    /// CUDA C ([`MaskMod::with_cuda`](crate::MaskMod::with_cuda)), captured tensors
    /// included; a typed `Unsupported` without it. Waits for the result.
    pub fn create_block_mask(
        &self,
        mask: &crate::MaskMod,
        (batch, heads, seq_q, seq_kv): (usize, usize, usize, usize),
        (block_q, block_kv): (usize, usize),
    ) -> Result<crate::BlockMask> {
        use crate::plan::mask_blocks::{block_grid, block_mask};
        let (_, cols, n) = block_grid((batch, heads, seq_q, seq_kv), (block_q, block_kv))?;
        // a config that carries the mask (its captured tensors are the extras)
        let mut cfg = AttentionConfig::new(1, seq_q, seq_kv, heads, heads, 1);
        cfg.mask_mod = Some(mask.clone());
        // the SIMT program holds the entry (compiled with the user's mask)
        let mut key = CudaKey::new(CudaKernel::SimtForward, DType::F32, 8, self.arch)?;
        key.flags = crate::kernels::flags::MASK_MOD;
        key.set_user_code(&cfg)?;
        let launch = Launch {
            entry: "flash_mask_blocks",
            grid: ((n as u32).div_ceil(256), 1, 1),
            threads: 256,
            shared_bytes: 0,
        };
        // seq_q, seq_kv and heads_q are the config's
        let mut params = cuda_params(&cfg)?;
        params.set_block_size(block_q, block_kv);
        params.blocks_cols = cols as u32;
        let f = self.function(&key, &launch)?;
        let extras = self.extras(&cfg)?;
        self.bind_captured(&key, &params, &extras)?;
        let mut flags = self.result(TensorRole::Out, &[n as usize], DType::F32)?;
        let mut timeline = self.timeline()?;
        let items = n as u32;
        let mut a = self.stream.launch_builder(&f);
        a.arg(&mut *flags.data).arg(&params).arg(&items);
        self.launch(&mut timeline, &launch, a)?;
        let flags: Vec<f32> = self.download(&flags)?;
        Ok(block_mask(
            mask,
            &flags,
            (batch, heads),
            (block_q, block_kv),
        ))
    }

    /// Merges partial results over disjoint key shards into the exact result over all their
    /// keys: the same semantics, checks and layouts as [`Context::merge`](crate::Context::merge)
    /// (an f32 running result, one launch per shard). Returns once the launches are queued.
    pub fn merge(&self, shards: &[Forward<CudaTensor>]) -> Result<Forward<CudaTensor>> {
        let metas: Vec<ShardMeta<'_>> = shards
            .iter()
            .map(|s| ShardMeta {
                out: (&s.out.shape, s.out.dtype),
                lse: (&s.lse.shape, s.lse.dtype),
            })
            .collect();
        let (shape, dtype) = check_shards(&metas)?;
        for (i, s) in shards.iter().enumerate() {
            s.out
                .check_owner(self.owner, || format!("shard {i}'s out"))?;
            s.lse
                .check_owner(self.owner, || format!("shard {i}'s lse"))?;
        }
        let [batch, seq_q, heads, head_dim] = shape;
        let elements = crate::plan::merge::merge_elements(shape)?;
        // the merge kernel is in every program (cuda/common.cuh): the forward's for this
        // dtype and head dim, loaded already where a forward ran
        let kernel = CudaKernel::for_pass(Pass::Forward, dtype, head_dim as u32);
        let key = CudaKey::new(kernel, dtype, head_dim as u32, self.arch)?;
        let launch = Launch {
            entry: "flash_merge",
            grid: (elements.div_ceil(256), 1, 1),
            threads: 256,
            shared_bytes: 0,
        };
        let f = self.function(&key, &launch)?;
        let lse_shape = [batch, heads, seq_q];
        let mut acc = self.result(TensorRole::Out, &shape, DType::F32)?;
        let mut lse_tmp = [
            self.result(TensorRole::Lse, &lse_shape, DType::F32)?,
            self.result(TensorRole::Lse, &lse_shape, DType::F32)?,
        ];
        let mut out = self.result(TensorRole::Out, &shape, dtype)?;
        let mut lse = self.result(TensorRole::Lse, &lse_shape, DType::F32)?;
        let (seq_q, heads) = (seq_q as u32, heads as u32);
        let mut timeline = self.timeline()?;
        for (i, s) in shards.iter().enumerate() {
            let resume = u32::from(i > 0);
            let [a_buf, b_buf] = &mut lse_tmp;
            // shard i reads the lse shard i - 1 wrote, and writes the other (the last: lse)
            let (lse_in, lse_out) = if i % 2 == 0 {
                (&*b_buf, a_buf)
            } else {
                (&*a_buf, b_buf)
            };
            let lse_out = if i + 1 == shards.len() {
                &mut lse
            } else {
                lse_out
            };
            let mut a = self.stream.launch_builder(&f);
            a.arg(&*s.out.data)
                .arg(&*s.lse.data)
                .arg(&*lse_in.data)
                .arg(&mut *acc.data)
                .arg(&mut *lse_out.data)
                .arg(&mut *out.data)
                .arg(&seq_q)
                .arg(&heads)
                .arg(&elements)
                .arg(&resume);
            self.launch(&mut timeline, &launch, a)?;
        }
        *self.timing.lock().unwrap() = Some(timeline);
        Ok(Forward { out, lse })
    }
}

impl CudaContext {
    /// Attention over a KV cache after an optional append: the same semantics, checks and
    /// layouts as [`Context::forward_with_kvcache`](crate::Context::forward_with_kvcache);
    /// the append is a device-to-device copy per batch on the context's stream.
    pub fn forward_with_kvcache(
        &self,
        cfg: &AttentionConfig,
        q: &CudaTensor,
        k_cache: &mut CudaTensor,
        v_cache: &mut CudaTensor,
        cache_seqlens: &[usize],
        append: Option<(&CudaTensor, &CudaTensor)>,
    ) -> Result<Forward<CudaTensor>> {
        let dtype = q.dtype;
        let new_rows = match append {
            Some((k, v)) => {
                k.check_owner(self.owner, || "k_new".into())?;
                v.check_owner(self.owner, || "v_new".into())?;
                append_rows(
                    cfg,
                    ((&k.shape, k.dtype), Some((&v.shape[..], v.dtype))),
                    dtype,
                )?
            }
            None => 0,
        };
        let c = kvcache_config(cfg, cache_seqlens, new_rows)?;
        crate::plan::head_dims::refuse(&c, "the CUDA kernels", Backend::Cuda, CUDA_INSTEAD)?;
        self.check(TensorRole::Q, q, &c.q_shape(), dtype)?;
        self.check(TensorRole::K, k_cache, &c.kv_shape(), dtype)?;
        self.check(TensorRole::V, v_cache, &c.kv_shape(), dtype)?;
        // everything the forward refuses, refused before the caches are written
        self.prepare(Pass::Forward, &c, dtype)?;
        if let Some((k_new, v_new)) = append {
            let row = c.heads_kv * c.head_dim * dtype.size_bytes();
            let copy = |src: &CudaTensor, dst: &mut CudaTensor, run: (usize, usize, usize)| {
                let (s0, d0, n) = (run.0 * row, run.1 * row, run.2 * row);
                self.stream
                    .memcpy_dtod(
                        &src.data.slice(s0..s0 + n),
                        &mut dst.data.slice_mut(d0..d0 + n),
                    )
                    .map_err(driver_error("KV cache append"))
            };
            for (b, &len) in cache_seqlens.iter().enumerate() {
                for run in append_runs(&c, b, len, new_rows) {
                    copy(k_new, k_cache, run)?;
                    copy(v_new, v_cache, run)?;
                }
            }
        }
        self.forward(&c, q, k_cache, v_cache)
    }
}

impl CudaContext {
    /// Attention over a KV cache with a rotary embedding fused in: the same semantics, checks
    /// and positions as
    /// [`Context::forward_with_kvcache_rotary`](crate::Context::forward_with_kvcache_rotary);
    /// q and the new keys are rotated by `flash_rotary` (cuda/common.cuh) on the stream before
    /// the append and the attention.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with_kvcache_rotary(
        &self,
        cfg: &AttentionConfig,
        q: &CudaTensor,
        k_cache: &mut CudaTensor,
        v_cache: &mut CudaTensor,
        cache_seqlens: &[usize],
        append: Option<(&CudaTensor, &CudaTensor)>,
        rotary: Rotary<'_, CudaTensor>,
    ) -> Result<Forward<CudaTensor>> {
        let dtype = q.dtype;
        let new_rows = match append {
            Some((k, v)) => append_rows(
                cfg,
                ((&k.shape, k.dtype), Some((&v.shape[..], v.dtype))),
                dtype,
            )?,
            None => 0,
        };
        let c = kvcache_config(cfg, cache_seqlens, new_rows)?;
        crate::plan::head_dims::refuse(&c, "the CUDA kernels", Backend::Cuda, CUDA_INSTEAD)?;
        self.check(TensorRole::Q, q, &c.q_shape(), dtype)?;
        let (q_pos, k_pos) = Positions::for_kvcache(cfg, cache_seqlens);
        let q_rot = self.rotary_of((TensorRole::Q, q), rotary, &q_pos)?;
        let k_rot = match append {
            Some((k, _)) => Some(self.rotary_of((TensorRole::KNew, k), rotary, &k_pos)?),
            None => None,
        };
        let append = append.zip(k_rot.as_ref()).map(|((_, v), k)| (k, v));
        self.forward_with_kvcache(cfg, &q_rot, k_cache, v_cache, cache_seqlens, append)
    }

    /// Rotary embedding (module [`rotary`](crate::rotary)) of `x`, `[batch, rows, heads,
    /// head_dim]` in the tables' dtype, row i of batch b at `positions.at(b, i)`: a new tensor
    /// of `x`'s shape, as [`Context::apply_rotary`](crate::Context::apply_rotary).
    pub fn apply_rotary(
        &self,
        x: &CudaTensor,
        rotary: Rotary<'_, CudaTensor>,
        positions: &Positions,
    ) -> Result<CudaTensor> {
        self.rotary_of((TensorRole::Q, x), rotary, positions)
    }

    /// Checks `x` (`role` names it in errors) and the tables, and queues the rotation.
    fn rotary_of(
        &self,
        (role, x): (TensorRole, &CudaTensor),
        rotary: Rotary<'_, CudaTensor>,
        positions: &Positions,
    ) -> Result<CudaTensor> {
        x.check_owner(self.owner, || role.to_string())?;
        rotary
            .cos
            .check_owner(self.owner, || TensorRole::RotaryCos.to_string())?;
        rotary
            .sin
            .check_owner(self.owner, || TensorRole::RotarySin.to_string())?;
        let (shape, dims) = check_rotation(
            (role, &x.shape, x.dtype),
            (&rotary.cos.shape, rotary.cos.dtype),
            (&rotary.sin.shape, rotary.sin.dtype),
            positions,
        )?;
        let elements = shape_elements(&shape)?;
        index_fits(&format!("{role}'s elements to rotate"), elements as u64)?;
        let elements = elements as u32;
        let mut out = self.result(role, &shape, x.dtype)?;
        if elements == 0 {
            return Ok(out);
        }
        // flash_rotary is in every program (cuda/common.cuh): the forward's for this dtype
        // and head dim, which the call loads next anyway
        let head_dim = shape[3] as u32;
        let kernel = CudaKernel::for_pass(Pass::Forward, x.dtype, head_dim);
        let key = CudaKey::new(kernel, x.dtype, head_dim, self.arch)?;
        let launch = Launch {
            entry: "flash_rotary",
            grid: (elements.div_ceil(256), 1, 1),
            threads: 256,
            shared_bytes: 0,
        };
        let f = self.function(&key, &launch)?;
        let starts: Vec<u32> = positions.start.iter().map(|&p| p as u32).collect();
        let starts = self
            .stream
            .clone_htod(&starts)
            .map_err(driver_error("upload rotary positions"))?;
        let [_, rows, heads, _] = shape.map(|n| n as u32);
        let (rotary_dim, interleaved, step) = (
            dims.rotary_dim as u32,
            u32::from(rotary.interleaved),
            positions.step as u32,
        );
        let mut timeline = self.timeline()?;
        let mut a = self.stream.launch_builder(&f);
        a.arg(&*x.data)
            .arg(&*rotary.cos.data)
            .arg(&*rotary.sin.data)
            .arg(&starts)
            .arg(&mut *out.data)
            .arg(&elements)
            .arg(&rows)
            .arg(&heads)
            .arg(&head_dim)
            .arg(&rotary_dim)
            .arg(&interleaved)
            .arg(&step);
        self.launch(&mut timeline, &launch, a)?;
        Ok(out)
    }
}

impl CudaContext {
    /// [`Context::forward_with_quantized_kvcache`](crate::Context::forward_with_quantized_kvcache)
    /// on CUDA: a typed `Unsupported` (docs/CUDA.md): the CUDA kernels read f32, f16 and bf16
    /// caches only.
    pub fn forward_with_quantized_kvcache(
        &self,
        _cfg: &AttentionConfig,
        _q: &CudaTensor,
        _caches: (
            &mut crate::QuantizedCache<CudaTensor>,
            &mut crate::QuantizedCache<CudaTensor>,
        ),
        _cache_seqlens: &[usize],
        _append: Option<(&CudaTensor, &CudaTensor)>,
    ) -> Result<Forward<CudaTensor>> {
        Err(eight_bit_caches_unsupported())
    }

    /// [`Context::forward_with_quantized_kvcache_rotary`](crate::Context::forward_with_quantized_kvcache_rotary)
    /// on CUDA: a typed `Unsupported`, as
    /// [`forward_with_quantized_kvcache`](Self::forward_with_quantized_kvcache).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with_quantized_kvcache_rotary(
        &self,
        _cfg: &AttentionConfig,
        _q: &CudaTensor,
        _caches: (
            &mut crate::QuantizedCache<CudaTensor>,
            &mut crate::QuantizedCache<CudaTensor>,
        ),
        _cache_seqlens: &[usize],
        _append: Option<(&CudaTensor, &CudaTensor)>,
        _rotary: Rotary<'_, CudaTensor>,
    ) -> Result<Forward<CudaTensor>> {
        Err(eight_bit_caches_unsupported())
    }

    /// [`Context::forward_with_latent_cache`](crate::Context::forward_with_latent_cache) on
    /// CUDA: a typed `Unsupported` (docs/CUDA.md): the CUDA kernels read values from a v
    /// buffer of their own.
    pub fn forward_with_latent_cache(
        &self,
        _cfg: &AttentionConfig,
        _q: &CudaTensor,
        _cache: &mut CudaTensor,
        _cache_seqlens: &[usize],
        _k_new: Option<&CudaTensor>,
    ) -> Result<Forward<CudaTensor>> {
        Err(latent_caches_unsupported())
    }

    /// [`Context::forward_with_quantized_latent_cache`](crate::Context::forward_with_quantized_latent_cache)
    /// on CUDA: a typed `Unsupported`, as
    /// [`forward_with_latent_cache`](Self::forward_with_latent_cache).
    pub fn forward_with_quantized_latent_cache(
        &self,
        _cfg: &AttentionConfig,
        _q: &CudaTensor,
        _cache: &mut crate::QuantizedCache<CudaTensor>,
        _cache_seqlens: &[usize],
        _k_new: Option<&CudaTensor>,
    ) -> Result<Forward<CudaTensor>> {
        Err(latent_caches_unsupported())
    }
}

fn latent_caches_unsupported() -> Error {
    Error::Unsupported {
        feature: "an MLA latent cache (forward_with_latent_cache: values read from the key \
                  rows)"
            .into(),
        backend: Backend::Cuda,
        reason: "the CUDA kernels read values from a v buffer of their own; pass k and v \
                 caches (the values stored apart) or use the wgpu path"
            .into(),
    }
}

/// What CUDA answers a call over 8-bit KV caches.
fn eight_bit_caches_unsupported() -> Error {
    Error::Unsupported {
        feature: "8-bit KV caches (q8_0, e4m3)".into(),
        backend: Backend::Cuda,
        reason: "the CUDA kernels read f32, f16 and bf16 caches only; the wgpu backend reads \
                 8-bit ones"
            .into(),
    }
}

crate::backend::attention_backend!(CudaContext, CudaTensor, Backend::Cuda, |c| c
    .device_name()
    .to_string());

/// A null device pointer: the `extras` argument of calls without any extras (the kernels
/// compiled without them never read it).
static NULL_POINTER: u64 = 0;

/// Pushes the kernels' last argument, the extras pointer.
fn push_extras<'a>(a: &mut LaunchArgs<'a>, extras: &'a Option<CudaSlice<u8>>) {
    match extras {
        Some(x) => {
            a.arg(x);
        }
        None => {
            a.arg(&NULL_POINTER);
        }
    }
}
