//! [`CudaContext`]: one NVIDIA GPU through the CUDA driver, with the same calls as the wgpu
//! [`Context`](crate::Context) where the CUDA kernels exist (so far the forward).
//!
//! The driver and NVRTC are loaded at run time. What is missing (no driver, no device, no
//! NVRTC, a GPU older than sm_80) is a typed error that says which and how to fix it; cudarc
//! panics when asked for a library it cannot find, so each is checked before it is used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    self as drv, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::kernels::{CudaKernel, CudaKey, FwdShape, MIN_ARCH};
use super::nvrtc::Nvrtc;
use crate::checks::check_slice;
use crate::{Algorithm, AttentionConfig, Element, Error, HostForward, Result, TensorRole};

// SAFETY: #[repr(C)], plain 4-byte fields, the layout of the kernel's struct (tested in
// kernels.rs).
unsafe impl DeviceRepr for FwdShape {}

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
    functions: Mutex<HashMap<CudaKey, CudaFunction>>,
}

impl CudaContext {
    /// CUDA device `ordinal` (0 for the first), with NVRTC from `FLASH_ATTN_NVRTC_DIR` when
    /// set, else from the loader's path.
    pub fn new(ordinal: usize) -> Result<CudaContext> {
        let dir = std::env::var_os(super::nvrtc::NVRTC_DIR_ENV).map(std::path::PathBuf::from);
        CudaContext::with_nvrtc_dir(ordinal, dir.as_deref())
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

    /// The key's kernel, compiled and loaded once per context.
    fn function(&self, key: &CudaKey) -> Result<CudaFunction> {
        if let Some(f) = self.functions.lock().unwrap().get(key) {
            return Ok(f.clone());
        }
        let shared = key.shared_bytes();
        if shared > self.max_shared_optin {
            return Err(Error::DeviceLimit {
                what: format!("{}: shared memory per block", key.label()),
                needed: shared as u64,
                limit: self.max_shared_optin as u64,
                hint: "use a smaller head_dim, or the wgpu path".into(),
            });
        }
        let compiled = self.nvrtc.compile(key)?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(compiled.cubin.clone()))
            .map_err(driver_error("module load"))?;
        let f = module
            .load_function(key.kernel.entry())
            .map_err(driver_error("function"))?;
        f.set_attribute(
            drv::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            shared as i32,
        )
        .map_err(driver_error("shared memory attribute"))?;
        self.functions.lock().unwrap().insert(*key, f.clone());
        Ok(f)
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
        cfg.validate()?;
        check_slice(TensorRole::Q, q.len(), &cfg.q_shape())?;
        check_slice(TensorRole::K, k.len(), &cfg.kv_shape())?;
        check_slice(TensorRole::V, v.len(), &cfg.kv_shape())?;
        if cfg.algorithm == Algorithm::Naive {
            return Err(Error::Unsupported {
                feature: "Algorithm::Naive on the CUDA path".into(),
                reason: "the CUDA path has the tiled kernels only; use the wgpu path".into(),
            });
        }
        let key = CudaKey::new(
            CudaKernel::Forward,
            T::DTYPE,
            cfg.head_dim as u32,
            self.arch,
        )?;
        let shape = FwdShape::new(cfg)?;
        let (gx, gy, gz) = key.grid(cfg);
        if gy > 65_535 || gz > 65_535 {
            return Err(Error::DeviceLimit {
                what: "CUDA grid: heads_q and batch".into(),
                needed: gy.max(gz) as u64,
                limit: 65_535,
                hint: "split the call over batch or heads".into(),
            });
        }
        let rows = cfg.batch * cfg.heads_q * cfg.seq_q;
        if q.is_empty() || k.is_empty() {
            // nothing to launch: rows that see no key get out = 0 and lse = -inf
            return Ok(HostForward {
                out: vec![T::from_f32(0.0); q.len()],
                lse: vec![f32::NEG_INFINITY; rows],
            });
        }
        let f = self.function(&key)?;
        let s = &self.stream;
        let upload = |x: &[T]| {
            s.clone_htod(bytemuck::cast_slice::<T, u16>(x))
                .map_err(driver_error("upload"))
        };
        let (dq, dk, dv) = (upload(q)?, upload(k)?, upload(v)?);
        let mut out = s
            .alloc_zeros::<u16>(q.len())
            .map_err(driver_error("alloc"))?;
        let mut lse = s.alloc_zeros::<f32>(rows).map_err(driver_error("alloc"))?;
        let launch = LaunchConfig {
            grid_dim: (gx, gy, gz),
            block_dim: (key.threads(), 1, 1),
            shared_mem_bytes: key.shared_bytes(),
        };
        let mut args = s.launch_builder(&f);
        args.arg(&dq)
            .arg(&dk)
            .arg(&dv)
            .arg(&mut out)
            .arg(&mut lse)
            .arg(&shape);
        // SAFETY: the arguments are the kernel's, in order, with the sizes it indexes (checked
        // above against the config it is given).
        unsafe { args.launch(launch) }.map_err(driver_error("launch"))?;
        let out: Vec<u16> = s.clone_dtoh(&out).map_err(driver_error("download"))?;
        let lse = s.clone_dtoh(&lse).map_err(driver_error("download"))?;
        Ok(HostForward {
            out: bytemuck::cast_slice::<u16, T>(&out).to_vec(),
            lse,
        })
    }
}
