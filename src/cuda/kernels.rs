//! The CUDA kernels (sources in `cuda/`), what NVRTC is told to compile for each, and their
//! launch geometry: pure, built and unit-tested with or without the `cuda` feature.
//!
//! The geometry lives here only: it reaches the CUDA C as `-D` defines, so the host and the
//! kernel cannot disagree about block sizes or shared memory.

use crate::{AttentionConfig, DType, Error, Result};

/// Warps per forward block, 16 query rows each.
const FWD_WARPS: u32 = 4;

/// A CUDA kernel of this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaKernel {
    /// FlashAttention-2 forward on tensor cores (`cuda/flash_fwd.cu`).
    Forward,
}

impl CudaKernel {
    pub const ALL: [CudaKernel; 1] = [CudaKernel::Forward];

    pub fn name(self) -> &'static str {
        match self {
            CudaKernel::Forward => "flash_fwd",
        }
    }

    /// The CUDA C source.
    pub fn source(self) -> &'static str {
        match self {
            CudaKernel::Forward => include_str!("../../cuda/flash_fwd.cu"),
        }
    }

    /// The `extern "C"` entry point.
    pub fn entry(self) -> &'static str {
        self.name()
    }
}

/// The forward's scalar argument, as the kernel's `FwdShape` (cuda/flash_fwd.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FwdShape {
    pub seq_q: u32,
    pub seq_kv: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    pub causal: i32,
    pub causal_offset: i32,
    /// softmax scale * log2(e): the kernel works in the exp2 domain
    pub scale_log2: f32,
}

impl FwdShape {
    /// The scalars of a validated config, or a typed error where they do not fit the kernel's
    /// 32-bit indices.
    pub fn new(cfg: &AttentionConfig) -> Result<FwdShape> {
        let fits = |what: &str, x: usize| {
            u32::try_from(x)
                .ok()
                .filter(|&x| x < i32::MAX as u32)
                .ok_or_else(|| {
                    Error::InvalidConfig(format!(
                        "{what} = {x} does not fit the CUDA kernels' 31-bit sizes"
                    ))
                })
        };
        Ok(FwdShape {
            seq_q: fits("seq_q", cfg.seq_q)?,
            seq_kv: fits("seq_kv", cfg.seq_kv)?,
            heads_q: fits("heads_q", cfg.heads_q)?,
            heads_kv: fits("heads_kv", cfg.heads_kv)?,
            causal: i32::from(cfg.causal),
            causal_offset: cfg.causal_offset() as i32,
            scale_log2: cfg.scale() * std::f32::consts::LOG2_E,
        })
    }
}

/// One compiled variant: a kernel for one storage dtype, head dimension and GPU architecture
/// (compute capability x 10 + y, e.g. 80 for sm_80, 90 for sm_90).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaKey {
    pub kernel: CudaKernel,
    pub dtype: DType,
    pub head_dim: u32,
    pub arch: u32,
}

/// The oldest architecture the kernels are written for: `mma.sync` m16n8k16 with bf16,
/// `ldmatrix` and `cp.async` (Ampere).
pub const MIN_ARCH: u32 = 80;

/// Head dims the tensor-core kernels take: multiples of 16 up to this.
pub const MAX_CUDA_HEAD_DIM: u32 = 256;

impl CudaKey {
    /// A key, or a typed error for what the kernels cannot do.
    pub fn new(kernel: CudaKernel, dtype: DType, head_dim: u32, arch: u32) -> Result<CudaKey> {
        if dtype == DType::F32 {
            return Err(Error::Unsupported {
                feature: "f32 on the CUDA path".into(),
                reason: "the CUDA kernels multiply f16 or bf16 on tensor cores; use f16/bf16 \
                         tensors, or the wgpu path for exact f32"
                    .into(),
            });
        }
        if head_dim == 0 || !head_dim.is_multiple_of(16) || head_dim > MAX_CUDA_HEAD_DIM {
            return Err(Error::Unsupported {
                feature: format!("head_dim {head_dim} on the CUDA path"),
                reason: format!(
                    "the CUDA kernels take head dims that are multiples of 16 up to \
                     {MAX_CUDA_HEAD_DIM}; use the wgpu path for others"
                ),
            });
        }
        if arch < MIN_ARCH {
            return Err(Error::Unsupported {
                feature: format!("CUDA architecture sm_{arch}"),
                reason: format!(
                    "the CUDA kernels need sm_{MIN_ARCH} or newer (mma.sync with bf16, \
                     ldmatrix, cp.async); use the wgpu path on older GPUs"
                ),
            });
        }
        Ok(CudaKey {
            kernel,
            dtype,
            head_dim,
            arch,
        })
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        FWD_WARPS * 32
    }

    /// Query rows per block.
    pub fn block_rows(&self) -> u32 {
        FWD_WARPS * 16
    }

    /// Keys per K/V tile: the score block (keys / 2 floats a thread), the output block
    /// (head_dim / 2) and Q's fragments (head_dim / 4 registers) share 255 registers; past
    /// head_dim 128, 16 keys keep them from spilling (tests/cuda_compile.rs checks).
    pub fn block_keys(&self) -> u32 {
        if self.head_dim <= 128 {
            64
        } else {
            16
        }
    }

    /// Dynamic shared memory per block, bytes: two stages of a K and a V tile, or the Q tile
    /// (staged once, in the same space), rows padded by 8 elements against bank conflicts.
    pub fn shared_bytes(&self) -> u32 {
        let stride = self.head_dim + 8;
        (4 * self.block_keys()).max(self.block_rows()) * stride * 2
    }

    /// The grid for a call: (query-row blocks, heads_q, batch).
    pub fn grid(&self, cfg: &AttentionConfig) -> (u32, u32, u32) {
        (
            (cfg.seq_q as u32).div_ceil(self.block_rows()),
            cfg.heads_q as u32,
            cfg.batch as u32,
        )
    }

    /// NVRTC options: the exact architecture (real code, not PTX only) and the geometry.
    pub fn options(&self) -> Vec<String> {
        vec![
            format!("--gpu-architecture=sm_{}", self.arch),
            "--std=c++17".into(),
            format!("-DHEAD_DIM={}", self.head_dim),
            format!("-DELEM_BF16={}", u32::from(self.dtype == DType::BF16)),
            format!("-DWARPS={FWD_WARPS}"),
            format!("-DBLOCK_N={}", self.block_keys()),
        ]
    }

    pub fn label(&self) -> String {
        format!(
            "{} {:?} head_dim {} sm_{}",
            self.kernel.name(),
            self.dtype,
            self.head_dim,
            self.arch
        )
    }

    /// Every variant a build can be asked for on one architecture: both half dtypes, every
    /// head dim the kernels take.
    pub fn all_for_arch(arch: u32) -> Vec<CudaKey> {
        let mut keys = Vec::new();
        for kernel in CudaKernel::ALL {
            for dtype in [DType::F16, DType::BF16] {
                for head_dim in (16..=MAX_CUDA_HEAD_DIM).step_by(16) {
                    keys.push(CudaKey {
                        kernel,
                        dtype,
                        head_dim,
                        arch,
                    });
                }
            }
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_refuse_what_the_kernels_cannot_do_with_typed_errors() {
        let f = CudaKernel::Forward;
        assert!(CudaKey::new(f, DType::BF16, 128, 90).is_ok());
        for (dtype, d, arch) in [
            (DType::F32, 64, 90),
            (DType::F16, 72, 90),
            (DType::F16, 0, 90),
            (DType::F16, 272, 90),
            (DType::F16, 64, 75),
        ] {
            match CudaKey::new(f, dtype, d, arch) {
                Err(Error::Unsupported { feature, reason }) => {
                    assert!(!feature.is_empty() && reason.contains("wgpu path"))
                }
                other => panic!("{dtype:?} {d} sm_{arch}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_scalar_argument_matches_the_kernels_struct() {
        // seven 4-byte fields, no padding: the C struct's layout
        assert_eq!(std::mem::size_of::<FwdShape>(), 28);
        assert_eq!(std::mem::align_of::<FwdShape>(), 4);
        let src = CudaKernel::Forward.source();
        let body = &src[src.find("struct FwdShape {").unwrap()..];
        let body = &body[..body.find("};").unwrap()];
        let fields: Vec<&str> = body
            .lines()
            .skip(1)
            .filter_map(|l| l.trim().strip_suffix(';').or_else(|| l.split(';').next()))
            .filter_map(|l| l.split_whitespace().last())
            .map(|f| f.trim_end_matches(';'))
            .filter(|f| !f.is_empty())
            .collect();
        assert_eq!(
            fields,
            [
                "seq_q",
                "seq_kv",
                "heads_q",
                "heads_kv",
                "causal",
                "causal_offset",
                "scale_log2"
            ]
        );
        let mut cfg = AttentionConfig::new(1, 100, 300, 4, 2, 64);
        cfg.causal = true;
        let s = FwdShape::new(&cfg).unwrap();
        assert_eq!((s.causal, s.causal_offset), (1, 200));
        assert!((s.scale_log2 - 0.125 * std::f32::consts::LOG2_E).abs() < 1e-7);
    }

    #[test]
    fn geometry_fits_the_architectures_and_reaches_the_source() {
        let cfg = AttentionConfig::new(2, 1000, 777, 8, 2, 128);
        let key = CudaKey::new(CudaKernel::Forward, DType::F16, 128, 80).unwrap();
        assert_eq!(key.grid(&cfg), (16, 8, 2));
        // 227 KiB is sm_90's opt-in maximum, 163 KiB sm_80's, 99 KiB sm_86/89's
        for key in CudaKey::all_for_arch(80) {
            assert!(key.shared_bytes() <= 99 * 1024, "{}", key.label());
            assert_eq!(key.shared_bytes() % 16, 0);
        }
        let opts = key.options();
        assert!(opts.contains(&"--gpu-architecture=sm_80".to_string()));
        assert!(opts.contains(&"-DBLOCK_N=64".to_string()));
        // every define the source requires is passed
        for name in ["HEAD_DIM", "ELEM_BF16", "WARPS", "BLOCK_N"] {
            assert!(key.kernel.source().contains(name));
            assert!(opts.iter().any(|o| o.starts_with(&format!("-D{name}="))));
        }
    }
}
