//! [`CudaContext`]: one NVIDIA GPU through the CUDA driver, with the same host calls as the
//! wgpu [`Context`](crate::Context): `forward_host` and `backward_host`.
//!
//! The driver and NVRTC are loaded at run time. What is missing (no driver, no device, no
//! NVRTC, a GPU older than sm_80) is a typed error that says which and how to fix it; cudarc
//! panics when asked for a library it cannot find, so each is checked before it is used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    self as drv, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
    PushKernelArg,
};

use super::kernels::{AttnShape, CudaKernel, CudaKey, Launch, MIN_ARCH};
use super::nvrtc::Nvrtc;
use crate::checks::{check_backward_host, check_forward_host};
use crate::{Algorithm, AttentionConfig, Element, Error, HostForward, HostGradients, Result};

// SAFETY: #[repr(C)], plain 4-byte fields, the layout of the kernel's struct (tested in
// kernels.rs).
unsafe impl DeviceRepr for AttnShape {}

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
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver_error("compute capability"))?;
        let arch = (major * 10 + minor) as u32;
        let name = ctx.name().map_err(driver_error("device name"))?;
        if arch < MIN_ARCH {
            return Err(Error::Unsupported {
                feature: format!("the CUDA path on {name} (sm_{arch})"),
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
        let stream = ctx.default_stream();
        Ok(CudaContext {
            ctx,
            stream,
            arch,
            name,
            max_shared_optin,
            nvrtc,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
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
        let module = {
            let mut modules = self.modules.lock().unwrap();
            match modules.get(key) {
                Some(m) => m.clone(),
                None => {
                    let compiled = self.nvrtc.compile(key)?;
                    let m = self
                        .ctx
                        .load_module(cudarc::nvrtc::Ptx::from_binary(compiled.cubin.clone()))
                        .map_err(driver_error("module load"))?;
                    modules.insert(*key, m.clone());
                    m
                }
            }
        };
        let f = module
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

    /// The checks every call shares, and its program's key and scalars.
    fn prepare<T: Element>(
        &self,
        kernel: CudaKernel,
        cfg: &AttentionConfig,
    ) -> Result<(CudaKey, AttnShape)> {
        if cfg.algorithm == Algorithm::Naive {
            return Err(Error::Unsupported {
                feature: "Algorithm::Naive on the CUDA path".into(),
                reason: "the CUDA path has the tiled kernels only; use the wgpu path".into(),
            });
        }
        let key = CudaKey::new(kernel, T::DTYPE, cfg.head_dim as u32, self.arch)?;
        let shape = AttnShape::new(cfg)?;
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

    fn upload<T: Element>(&self, x: &[T]) -> Result<CudaSlice<u16>> {
        self.stream
            .clone_htod(bytemuck::cast_slice::<T, u16>(x))
            .map_err(driver_error("upload"))
    }

    fn zeros<U: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<U>> {
        self.stream
            .alloc_zeros::<U>(n)
            .map_err(driver_error("alloc"))
    }

    fn download<T: Element>(&self, x: &CudaSlice<u16>) -> Result<Vec<T>> {
        let bits: Vec<u16> = self
            .stream
            .clone_dtoh(x)
            .map_err(driver_error("download"))?;
        Ok(bytemuck::cast_slice::<u16, T>(&bits).to_vec())
    }

    fn config(launch: &Launch) -> LaunchConfig {
        LaunchConfig {
            grid_dim: launch.grid,
            block_dim: (launch.threads, 1, 1),
            shared_mem_bytes: launch.shared_bytes,
        }
    }

    /// Forward pass from host slices: q `[batch, seq_q, heads_q, head_dim]`, k and v
    /// `[batch, seq_kv, heads_kv, head_dim]`, f16 or bf16; the same call and results as
    /// [`Context::forward_host`](crate::Context::forward_host) (out, and lse in natural log).
    pub fn forward_host<T: Element>(
        &self,
        cfg: &AttentionConfig,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<HostForward<T>> {
        check_forward_host(cfg, q, k, v)?;
        let (key, shape) = self.prepare::<T>(CudaKernel::Forward, cfg)?;
        let rows = cfg.batch * cfg.heads_q * cfg.seq_q;
        if q.is_empty() || k.is_empty() {
            // nothing to launch: rows that see no key get out = 0 and lse = -inf
            return Ok(HostForward {
                out: vec![T::from_f32(0.0); q.len()],
                lse: vec![f32::NEG_INFINITY; rows],
            });
        }
        let launch = key.launches(cfg)[0];
        let f = self.function(&key, &launch)?;
        let (dq, dk, dv) = (self.upload(q)?, self.upload(k)?, self.upload(v)?);
        let mut out = self.zeros::<u16>(q.len())?;
        let mut lse = self.zeros::<f32>(rows)?;
        let mut args = self.stream.launch_builder(&f);
        args.arg(&dq)
            .arg(&dk)
            .arg(&dv)
            .arg(&mut out)
            .arg(&mut lse)
            .arg(&shape);
        // SAFETY: the arguments are flash_fwd's, in order, with the sizes it indexes (checked
        // above against the config it is given).
        unsafe { args.launch(Self::config(&launch)) }.map_err(driver_error("launch"))?;
        Ok(HostForward {
            out: self.download(&out)?,
            lse: self
                .stream
                .clone_dtoh(&lse)
                .map_err(driver_error("download"))?,
        })
    }

    /// Backward pass from host slices, given the forward's out and lse: the same call and
    /// results as [`Context::backward_host`](crate::Context::backward_host) (f16 or bf16,
    /// head dims up to 128). Deterministic: no atomics.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_host<T: Element>(
        &self,
        cfg: &AttentionConfig,
        q: &[T],
        k: &[T],
        v: &[T],
        out: &[T],
        lse: &[f32],
        d_out: &[T],
    ) -> Result<HostGradients<T>> {
        check_backward_host(cfg, (q, k, v), out, lse, d_out)?;
        let (key, shape) = self.prepare::<T>(CudaKernel::Backward, cfg)?;
        if q.is_empty() || k.is_empty() {
            // no pair: every gradient is zero
            return Ok(HostGradients {
                dq: vec![T::from_f32(0.0); q.len()],
                dk: vec![T::from_f32(0.0); k.len()],
                dv: vec![T::from_f32(0.0); v.len()],
            });
        }
        let launches = key.launches(cfg);
        let (pre, dkdv, dq_l) = (launches[0], launches[1], launches[2]);
        let (f_pre, f_dkdv, f_dq) = (
            self.function(&key, &pre)?,
            self.function(&key, &dkdv)?,
            self.function(&key, &dq_l)?,
        );
        let (q_d, k_d, v_d) = (self.upload(q)?, self.upload(k)?, self.upload(v)?);
        let (out_d, do_d) = (self.upload(out)?, self.upload(d_out)?);
        let lse_d = self
            .stream
            .clone_htod(lse)
            .map_err(driver_error("upload"))?;
        let mut delta = self.zeros::<f32>(lse.len())?;
        let mut dq = self.zeros::<u16>(q.len())?;
        let mut dk = self.zeros::<u16>(k.len())?;
        let mut dv = self.zeros::<u16>(v.len())?;
        let batch = cfg.batch as u32;
        let mut a = self.stream.launch_builder(&f_pre);
        a.arg(&out_d)
            .arg(&do_d)
            .arg(&mut delta)
            .arg(&shape)
            .arg(&batch);
        // SAFETY: flash_bwd_preprocess's arguments, in order, sized by the checks above.
        unsafe { a.launch(Self::config(&pre)) }.map_err(driver_error("launch"))?;
        let mut a = self.stream.launch_builder(&f_dkdv);
        a.arg(&q_d)
            .arg(&k_d)
            .arg(&v_d)
            .arg(&do_d)
            .arg(&lse_d)
            .arg(&delta)
            .arg(&mut dk)
            .arg(&mut dv)
            .arg(&shape);
        // SAFETY: flash_bwd_dkdv's arguments, in order.
        unsafe { a.launch(Self::config(&dkdv)) }.map_err(driver_error("launch"))?;
        let mut a = self.stream.launch_builder(&f_dq);
        a.arg(&q_d)
            .arg(&k_d)
            .arg(&v_d)
            .arg(&do_d)
            .arg(&lse_d)
            .arg(&delta)
            .arg(&mut dq)
            .arg(&shape);
        // SAFETY: flash_bwd_dq's arguments, in order.
        unsafe { a.launch(Self::config(&dq_l)) }.map_err(driver_error("launch"))?;
        Ok(HostGradients {
            dq: self.download(&dq)?,
            dk: self.download(&dk)?,
            dv: self.download(&dv)?,
        })
    }
}
