//! Where the CUDA tests take NVRTC from: FLASH_ATTN_NVRTC_DIR when set, else
//! .tools/cuda-13.0/lib, where `bash scripts/ensure-cuda.sh` (part of the README's test
//! command) unpacks the pinned wheel.

use std::path::{Path, PathBuf};

pub fn nvrtc_dir() -> PathBuf {
    flash_attn_wgpu::cuda::nvrtc::dir_from_env().unwrap_or_else(|| {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(".tools/cuda-13.0/lib")
    })
}
