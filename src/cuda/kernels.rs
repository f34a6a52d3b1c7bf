//! The CUDA kernels (sources in `cuda/`), what NVRTC is told to compile for each, and their
//! launch geometry: pure, built and unit-tested with or without the `cuda` feature.
//!
//! The geometry lives here only: it reaches the CUDA C as `-D` defines, so the host and the
//! kernel cannot disagree about block sizes or shared memory.

use crate::{AttentionConfig, DType, Error, Result};

/// The helpers every kernel shares (cuda/common.cuh), put before each kernel's source.
pub const COMMON: &str = include_str!("../../cuda/common.cuh");

/// Warps per block, 16 resident rows (query rows, or keys in dK/dV) each.
const WARPS: u32 = 4;

/// A CUDA program of this crate: one source file, compiled as one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaKernel {
    /// FlashAttention-2 forward on tensor cores (`cuda/flash_fwd.cu`): entry `flash_fwd`.
    Forward,
    /// The backward (`cuda/flash_bwd.cu`): entries `flash_bwd_preprocess`, `flash_bwd_dkdv`,
    /// `flash_bwd_dq`.
    Backward,
}

impl CudaKernel {
    pub const ALL: [CudaKernel; 2] = [CudaKernel::Forward, CudaKernel::Backward];

    pub fn name(self) -> &'static str {
        match self {
            CudaKernel::Forward => "flash_fwd",
            CudaKernel::Backward => "flash_bwd",
        }
    }

    /// The largest head dim the program takes (multiples of 16 up to it).
    pub fn max_head_dim(self) -> u32 {
        match self {
            CudaKernel::Forward => 256,
            // dK/dV keeps two head_dim-wide accumulators per thread beside the score blocks
            CudaKernel::Backward => 128,
        }
    }

    /// The kernel's own CUDA C source; NVRTC compiles [`COMMON`] followed by it.
    pub fn source(self) -> &'static str {
        match self {
            CudaKernel::Forward => include_str!("../../cuda/flash_fwd.cu"),
            CudaKernel::Backward => include_str!("../../cuda/flash_bwd.cu"),
        }
    }

    /// The program NVRTC compiles: the shared helpers, then the kernel.
    pub fn program(self) -> String {
        format!("{COMMON}\n{}", self.source())
    }
}

/// A call's scalar argument, as the kernels' `AttnShape` (cuda/common.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    pub seq_q: u32,
    pub seq_kv: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    pub causal: i32,
    pub causal_offset: i32,
    /// softmax scale * log2(e): the kernel works in the exp2 domain
    pub scale_log2: f32,
}

impl AttnShape {
    /// The scalars of a validated config, or a typed error where they do not fit the kernel's
    /// 32-bit indices.
    pub fn new(cfg: &AttentionConfig) -> Result<AttnShape> {
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
        Ok(AttnShape {
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

/// One kernel launch: entry point, grid, block and dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub entry: &'static str,
    pub grid: (u32, u32, u32),
    pub threads: u32,
    pub shared_bytes: u32,
}

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
        let max = kernel.max_head_dim();
        if head_dim == 0 || !head_dim.is_multiple_of(16) || head_dim > max {
            return Err(Error::Unsupported {
                feature: format!("head_dim {head_dim} in the CUDA {}", kernel.name()),
                reason: format!(
                    "the CUDA {} takes head dims that are multiples of 16 up to {max}; use \
                     the wgpu path for others",
                    kernel.name()
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

    fn threads(&self) -> u32 {
        WARPS * 32
    }

    /// Rows resident in a block: query rows (forward, dQ) or keys (dK/dV).
    pub fn block_rows(&self) -> u32 {
        WARPS * 16
    }

    /// Keys per streamed K/V tile (forward, dQ). The forward's score block (keys / 2 floats a
    /// thread), output block (head_dim / 2) and Q fragments (head_dim / 4 registers) share 255
    /// registers: past head_dim 128, 16 keys keep them from spilling. The dQ kernel also keeps
    /// dO's fragments and a dP block: 32 keys past head_dim 64. (tests/cuda_compile.rs checks
    /// that nothing spills.)
    pub fn block_keys(&self) -> u32 {
        match (self.kernel, self.head_dim) {
            (CudaKernel::Forward, d) if d <= 128 => 64,
            (CudaKernel::Forward, _) => 16,
            (CudaKernel::Backward, d) if d <= 64 => 64,
            (CudaKernel::Backward, _) => 32,
        }
    }

    /// Query rows per streamed Q/dO tile of the dK/dV kernel (two head_dim-wide accumulators
    /// and the S^T and dP^T blocks per thread): 32 past head_dim 64.
    pub fn block_queries(&self) -> u32 {
        if self.head_dim <= 64 {
            64
        } else {
            32
        }
    }

    fn tile_bytes(&self, rows: u32) -> u32 {
        rows * (self.head_dim + 8) * 2
    }

    /// Every launch of the program's entries, for a call (grid from `cfg`).
    pub fn launches(&self, cfg: &AttentionConfig) -> Vec<Launch> {
        let row_blocks = (cfg.seq_q as u32).div_ceil(self.block_rows());
        let per_head = (row_blocks, cfg.heads_q as u32, cfg.batch as u32);
        match self.kernel {
            // Q staged once, then two stages of a K and a V tile, in the same space
            CudaKernel::Forward => vec![Launch {
                entry: "flash_fwd",
                grid: per_head,
                threads: self.threads(),
                shared_bytes: self.tile_bytes((4 * self.block_keys()).max(self.block_rows())),
            }],
            CudaKernel::Backward => {
                let rows = (cfg.batch * cfg.heads_q * cfg.seq_q) as u32;
                vec![
                    Launch {
                        entry: "flash_bwd_preprocess",
                        grid: (rows.div_ceil(self.threads()), 1, 1),
                        threads: self.threads(),
                        shared_bytes: 0,
                    },
                    // K and V resident, a Q and a dO tile, lse and delta per tile row
                    Launch {
                        entry: "flash_bwd_dkdv",
                        grid: (
                            (cfg.seq_kv as u32).div_ceil(self.block_rows()),
                            cfg.heads_kv as u32,
                            cfg.batch as u32,
                        ),
                        threads: self.threads(),
                        shared_bytes: self
                            .tile_bytes(2 * self.block_rows() + 2 * self.block_queries())
                            + 2 * 4 * self.block_queries(),
                    },
                    // Q and dO staged once, then a K and a V tile, in the same space
                    Launch {
                        entry: "flash_bwd_dq",
                        grid: per_head,
                        threads: self.threads(),
                        shared_bytes: self.tile_bytes(2 * self.block_rows().max(self.block_keys())),
                    },
                ]
            }
        }
    }

    /// NVRTC options: the exact architecture (real code, not PTX only) and the geometry.
    pub fn options(&self) -> Vec<String> {
        vec![
            format!("--gpu-architecture=sm_{}", self.arch),
            "--std=c++17".into(),
            format!("-DHEAD_DIM={}", self.head_dim),
            format!("-DELEM_BF16={}", u32::from(self.dtype == DType::BF16)),
            format!("-DWARPS={WARPS}"),
            format!("-DBLOCK_N={}", self.block_keys()),
            format!("-DBLOCK_Q={}", self.block_queries()),
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
                for head_dim in (16..=kernel.max_head_dim()).step_by(16) {
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
        assert_eq!(std::mem::size_of::<AttnShape>(), 28);
        assert_eq!(std::mem::align_of::<AttnShape>(), 4);
        let body = &COMMON[COMMON.find("struct AttnShape {").unwrap()..];
        let body = &body[..body.find("};").unwrap()];
        let fields: Vec<&str> = body
            .lines()
            .skip(1)
            .filter_map(|l| l.split(';').next())
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
        let s = AttnShape::new(&cfg).unwrap();
        assert_eq!((s.causal, s.causal_offset), (1, 200));
        assert!((s.scale_log2 - 0.125 * std::f32::consts::LOG2_E).abs() < 1e-7);
    }

    #[test]
    fn geometry_fits_the_architectures_and_reaches_the_source() {
        let cfg = AttentionConfig::new(2, 1000, 777, 8, 2, 128);
        let key = CudaKey::new(CudaKernel::Forward, DType::F16, 128, 80).unwrap();
        assert_eq!(key.launches(&cfg)[0].grid, (16, 8, 2));
        let bwd = CudaKey::new(CudaKernel::Backward, DType::F16, 128, 80).unwrap();
        let l = bwd.launches(&cfg);
        let entries: Vec<&str> = l.iter().map(|l| l.entry).collect();
        assert_eq!(
            entries,
            ["flash_bwd_preprocess", "flash_bwd_dkdv", "flash_bwd_dq"]
        );
        assert_eq!(l[0].grid, ((2 * 8 * 1000u32).div_ceil(128), 1, 1));
        assert_eq!(l[1].grid, (13, 2, 2));
        assert_eq!(l[2].grid, (16, 8, 2));
        // 99 KiB is the opt-in maximum of sm_86/89, the smallest of the sm_80+ parts
        for arch in [80, 90] {
            for key in CudaKey::all_for_arch(arch) {
                for l in key.launches(&cfg) {
                    assert!(l.shared_bytes <= 99 * 1024, "{} {}", key.label(), l.entry);
                    assert_eq!(l.shared_bytes % 16, 0);
                    assert_eq!(l.threads, 128);
                    // every entry the host launches is in the program
                    assert!(
                        key.kernel.source().contains(&format!("{}(", l.entry)),
                        "{}",
                        l.entry
                    );
                }
            }
        }
        let opts = key.options();
        assert!(opts.contains(&"--gpu-architecture=sm_80".to_string()));
        assert!(opts.contains(&"-DBLOCK_N=64".to_string()));
        // every define a source requires is passed
        for kernel in CudaKernel::ALL {
            let key = CudaKey::new(kernel, DType::BF16, 64, 90).unwrap();
            let program = key.kernel.program();
            for name in ["HEAD_DIM", "ELEM_BF16", "WARPS", "BLOCK_N", "BLOCK_Q"] {
                if program.contains(&format!("defined({name})")) {
                    let opts = key.options();
                    assert!(
                        opts.iter().any(|o| o.starts_with(&format!("-D{name}="))),
                        "{name}"
                    );
                }
            }
        }
        // the backward's head dims stop at 128
        assert!(CudaKey::new(CudaKernel::Backward, DType::F16, 144, 90).is_err());
        assert!(CudaKey::new(CudaKernel::Forward, DType::F16, 144, 90).is_ok());
    }
}
