//! NVRTC: the CUDA kernels compiled at run time to CUBIN for the device's exact architecture,
//! once per process per variant.
//!
//! NVRTC is loaded dynamically (cudarc's `dynamic-loading`), so the crate builds with no CUDA
//! toolkit. It is taken from the folder named by `FLASH_ATTN_NVRTC_DIR` when set (for example
//! the lib folder of the `nvidia-cuda-nvrtc` wheel, which `scripts/ensure-cuda.sh` unpacks into
//! .tools/), else from the dynamic loader's path. A missing NVRTC is a typed
//! [`Error::CudaUnavailable`] that says how to get one, never a panic: cudarc panics when asked
//! for a library it cannot find, so presence is checked first.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::nvrtc::{result, sys};

use super::kernels::CudaKey;
use crate::{Error, Result};

/// The environment variable naming NVRTC's folder.
pub const NVRTC_DIR_ENV: &str = "FLASH_ATTN_NVRTC_DIR";

const FIX: &str = "install the CUDA 13 toolkit, or `pip install nvidia-cuda-nvrtc==13.0.88` and \
                   set FLASH_ATTN_NVRTC_DIR to the wheel's nvidia/cu13/lib folder \
                   (`bash scripts/ensure-cuda.sh` puts one in .tools/cuda-13.0/lib)";

/// The folder `FLASH_ATTN_NVRTC_DIR` names, if set.
pub fn dir_from_env() -> Option<PathBuf> {
    std::env::var_os(NVRTC_DIR_ENV).map(PathBuf::from)
}

/// A compiled variant.
#[derive(Debug)]
pub struct Compiled {
    /// Machine code for the key's architecture.
    pub cubin: Vec<u8>,
    /// NVRTC's log, with ptxas's resource report (`--ptxas-options=-v`).
    pub log: String,
    /// The most registers per thread of any entry point, from the report.
    pub registers: Option<u32>,
    /// Bytes spilled to local memory (stores plus loads) over every entry point.
    pub spill_bytes: u32,
}

/// A loaded NVRTC with a per-process cache of compiled variants.
pub struct Nvrtc {
    version: (i32, i32),
    cache: Mutex<HashMap<CudaKey, Arc<Compiled>>>,
}

/// Libraries opened from a folder, kept for the life of the process: cudarc then finds them
/// already loaded (the loader matches its library names against loaded ones). Once NVRTC is
/// loaded, later folders are not consulted; a failed attempt loads nothing and can be retried.
static PRELOADED: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

fn preload(dir: &Path) -> Result<()> {
    let mut loaded = PRELOADED.lock().unwrap();
    if !loaded.is_empty() {
        return Ok(());
    }
    let unavailable = |e: String| Error::CudaUnavailable {
        missing: format!("NVRTC in {} ({e})", dir.display()),
        fix: FIX.into(),
    };
    // the builtins first: libnvrtc opens them by name when it compiles
    let mut libs = Vec::new();
    for prefix in ["libnvrtc-builtins.so", "libnvrtc.so"] {
        let path = std::fs::read_dir(dir)
            .map_err(|e| unavailable(e.to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && !n.contains(".alt."))
            })
            .min()
            .ok_or_else(|| unavailable(format!("no {prefix}*")))?;
        // SAFETY: loading NVRTC runs its initializers, which have no preconditions.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| unavailable(format!("{}: {e}", path.display())))?;
        libs.push(lib);
    }
    *loaded = libs;
    Ok(())
}

impl Nvrtc {
    /// NVRTC from `FLASH_ATTN_NVRTC_DIR` when set, else from the loader's path.
    pub fn load() -> Result<Nvrtc> {
        Nvrtc::load_from(dir_from_env().as_deref())
    }

    /// NVRTC from `dir` (None: the loader's path).
    pub fn load_from(dir: Option<&Path>) -> Result<Nvrtc> {
        if let Some(dir) = dir {
            preload(dir)?;
        }
        // SAFETY: only opens and closes candidate libraries.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::CudaUnavailable {
                missing: "NVRTC (libnvrtc.so.13 on the loader's path)".into(),
                fix: FIX.into(),
            });
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two out-pointers to live integers.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| Error::CudaUnavailable {
                missing: format!("a working NVRTC (nvrtcVersion: {e:?})"),
                fix: FIX.into(),
            })?;
        Ok(Nvrtc {
            version: (major, minor),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// NVRTC's (major, minor) version.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The key's kernel compiled for its architecture (cached: each key compiles once).
    pub fn compile(&self, key: &CudaKey) -> Result<Arc<Compiled>> {
        if let Some(c) = self.cache.lock().unwrap().get(key) {
            return Ok(c.clone());
        }
        let compiled = Arc::new(compile_uncached(key)?);
        self.cache.lock().unwrap().insert(*key, compiled.clone());
        Ok(compiled)
    }
}

fn compile_uncached(key: &CudaKey) -> Result<Compiled> {
    let failed = |what: &str, e: result::NvrtcError| Error::CudaCompile {
        kernel: key.label(),
        log: format!("{what}: {e:?}"),
    };
    let src = CString::new(key.program()).expect("kernel sources have no NUL");
    let name = CString::new(format!("{}.cu", key.kernel.name())).expect("no NUL");
    let prog = result::create_program(&src, Some(&name)).map_err(|e| failed("create", e))?;
    let mut options = key.options();
    options.push("--ptxas-options=-v".into());
    // SAFETY: `prog` was just created and is destroyed once below; `src` and `name` outlive it.
    let compiled = unsafe { result::compile_program(prog, &options) };
    let log = unsafe { result::get_program_log(prog) }
        .map(|chars| c_chars_to_string(&chars))
        .unwrap_or_default();
    let out = match compiled {
        Err(e) => Err(Error::CudaCompile {
            kernel: key.label(),
            log: format!("{e:?}\n{log}"),
        }),
        Ok(()) => unsafe { cubin(prog) }
            .map_err(|e| failed("get CUBIN", e))
            .map(|cubin| Compiled {
                cubin,
                registers: report_values(&log, "Used ", " registers").into_iter().max(),
                spill_bytes: report_values(&log, "bytes stack frame, ", " bytes spill stores")
                    .iter()
                    .chain(&report_values(&log, "spill stores, ", " bytes spill loads"))
                    .sum(),
                log,
            }),
    };
    // SAFETY: created above, not destroyed before.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// # Safety
/// `prog` must be a live, compiled program.
unsafe fn cubin(prog: sys::nvrtcProgram) -> std::result::Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
    let mut buf = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char).result()?;
    Ok(buf)
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The numbers between `before` and `after` on the report lines that have both (one line per
/// entry point of the program).
fn report_values(log: &str, before: &str, after: &str) -> Vec<u32> {
    log.lines()
        .filter_map(|line| {
            let start = line.find(before)? + before.len();
            let end = start + line[start..].find(after)?;
            line[start..end].trim().parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_report_is_read() {
        let log = "ptxas info    : Compiling entry function 'a' for 'sm_90'\n\
                   ptxas         .     48 bytes stack frame, 8 bytes spill stores, 16 bytes spill loads\n\
                   ptxas info    : Used 255 registers, used 1 barriers, 48 bytes cumulative stack size\n\
                   ptxas info    : Compiling entry function 'b' for 'sm_90'\n\
                   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 4 bytes spill loads\n\
                   ptxas info    : Used 32 registers, used 0 barriers\n";
        assert_eq!(report_values(log, "Used ", " registers"), [255, 32]);
        assert_eq!(
            report_values(log, "bytes stack frame, ", " bytes spill stores"),
            [8, 0]
        );
        assert_eq!(
            report_values(log, "spill stores, ", " bytes spill loads"),
            [16, 4]
        );
        assert!(report_values("", "Used ", " registers").is_empty());
    }
}
