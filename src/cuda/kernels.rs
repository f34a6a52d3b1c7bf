//! The CUDA kernels (sources in `cuda/`), what NVRTC is told to compile for each, and their
//! launch geometry: pure, built and unit-tested with or without the `cuda` feature.
//!
//! The geometry lives here only: it reaches the CUDA C as `-D` defines, so the host and the
//! kernel cannot disagree about block sizes or shared memory.

use crate::kernels::flags;
use crate::kernels::params::{Params, PARAMS_C};
use crate::{AttentionConfig, DType, Error, Result};

/// What every kernel shares (cuda/common.cuh: element types, the call's scalars, masking),
/// put before each program's source, with the modifiers' functions at its `@modifiers` line
/// ([`common`]).
pub const COMMON: &str = include_str!("../../cuda/common.cuh");

/// Where [`COMMON`] takes the modifiers' CUDA functions (cuda/modifiers/).
const MODIFIERS_AT: &str = "// @modifiers:";

/// [`COMMON`] with the modifiers' CUDA functions (src/modifiers/, cuda/modifiers/) in place.
pub fn common() -> String {
    common_with("")
}

/// [`common`] with a user's score modifier (its CUDA C) before the modifiers' functions.
fn common_with(user: &str) -> String {
    let at = COMMON
        .find(MODIFIERS_AT)
        .expect("cuda/common.cuh has its @modifiers line");
    format!(
        "{}{user}\n{}\n{}",
        &COMMON[..at],
        crate::kernels::hooks::cuda_snippets(),
        &COMMON[at..]
    )
}

/// What every program starts with: the call's scalars ([`PARAMS_C`]) and the bits of
/// `Params::flags` the kernels read at run time ([`CUDA_RUNTIME`]: `FLAG_CAUSAL`,
/// `FLAG_WINDOW`).
pub fn prelude() -> String {
    format!(
        "{PARAMS_C}#define FLAG_CAUSAL {}u\n#define FLAG_WINDOW {}u\n",
        flags::CAUSAL,
        flags::WINDOW
    )
}

/// What a key with MASK_MOD but no user code (the compile checks) takes in its place.
const MASK_MOD_STUB: &str = "
__device__ bool mask_mod(unsigned int b, unsigned int h, unsigned int i, unsigned int j) {
    return true;
}
";

/// What a key with SCORE_MOD but no user code (the compile checks) takes in its place.
const SCORE_MOD_STUB: &str = "
__device__ float score_mod(float s, unsigned int b, unsigned int h, unsigned int i,
                           unsigned int j) { return s; }
__device__ float score_mod_ds(float s, unsigned int b, unsigned int h, unsigned int i,
                              unsigned int j) { return 1.f; }
";

/// The tensor-core kernels' helpers (cuda/mma.cuh), put after [`common`] in their programs.
pub const MMA: &str = include_str!("../../cuda/mma.cuh");

/// Warps per block of the tensor-core kernels, 16 resident rows (query rows, or keys in
/// dK/dV) each.
const WARPS: u32 = 4;

/// Threads per block of the SIMT kernels: 8 lanes per resident row, so 32 rows.
const SIMT_THREADS: u32 = 256;

/// Threads per block of the decode kernel: four warps of lane groups, each group on its own
/// keys.
const DECODE_THREADS: u32 = 128;

/// The most packed rows (query heads of a kv head x query rows) a decode block holds: their
/// q slices and outputs live in registers.
pub const DECODE_ROWS: u32 = 4;

/// Which pass a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    Forward,
    Backward,
}

/// A CUDA program of this crate: one source file (after the shared helpers), compiled as one
/// unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaKernel {
    /// FlashAttention-2 forward on tensor cores (`cuda/flash_fwd.cu`): entry `flash_fwd`.
    Forward,
    /// The backward on tensor cores (`cuda/flash_bwd.cu`): entries `flash_bwd_preprocess`,
    /// `flash_bwd_dkdv`, `flash_bwd_dq`.
    Backward,
    /// The forward on the CUDA cores in f32 arithmetic (`cuda/flash_simt.cu`): entry
    /// `flash_simt_fwd`.
    SimtForward,
    /// The backward on the CUDA cores (`cuda/flash_simt.cu`): entries
    /// `flash_simt_bwd_preprocess`, `flash_simt_dkdv`, `flash_simt_dq`.
    SimtBackward,
    /// Decode, split-KV with GQA packing, on the CUDA cores (`cuda/flash_decode.cu`): entries
    /// `flash_decode` and (calls of more than one split) `flash_decode_combine`.
    Decode,
}

impl CudaKernel {
    pub const ALL: [CudaKernel; 5] = [
        CudaKernel::Forward,
        CudaKernel::Backward,
        CudaKernel::SimtForward,
        CudaKernel::SimtBackward,
        CudaKernel::Decode,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CudaKernel::Forward => "flash_fwd",
            CudaKernel::Backward => "flash_bwd",
            CudaKernel::SimtForward => "flash_simt_fwd",
            CudaKernel::SimtBackward => "flash_simt_bwd",
            CudaKernel::Decode => "flash_decode",
        }
    }

    /// The program that runs a forward call: the decode kernel for a decode step's shape
    /// ([`decode_shaped`](crate::plan::decode::decode_shaped): at most 4 query rows, not
    /// packed), else [`for_pass`](CudaKernel::for_pass)'s.
    pub fn for_forward(cfg: &AttentionConfig, dtype: DType) -> CudaKernel {
        if crate::plan::decode::decode_shaped(cfg) {
            CudaKernel::Decode
        } else {
            CudaKernel::for_pass(Pass::Forward, dtype, cfg.head_dim as u32)
        }
    }

    /// The program that runs `pass` for `dtype` and `head_dim`: the tensor cores where their
    /// kernels take it (f16/bf16, head dims that are multiples of 16 up to 256 forward and 128
    /// backward), else the exact SIMT kernels (f32, other head dims, the backward past 128).
    pub fn for_pass(pass: Pass, dtype: DType, head_dim: u32) -> CudaKernel {
        let tc = match pass {
            Pass::Forward => CudaKernel::Forward,
            Pass::Backward => CudaKernel::Backward,
        };
        let fits = dtype != DType::F32
            && head_dim.is_multiple_of(16)
            && head_dim >= 16
            && head_dim <= tc.max_head_dim();
        match (fits, pass) {
            (true, _) => tc,
            (false, Pass::Forward) => CudaKernel::SimtForward,
            (false, Pass::Backward) => CudaKernel::SimtBackward,
        }
    }

    /// Whether the program multiplies on tensor cores (f16/bf16 only, head dims multiples of
    /// 16).
    pub fn tensor_cores(self) -> bool {
        matches!(self, CudaKernel::Forward | CudaKernel::Backward)
    }

    /// The largest head dim the program takes (multiples of 16 up to it on tensor cores).
    pub fn max_head_dim(self) -> u32 {
        match self {
            // dK/dV keeps two head_dim-wide accumulators per thread beside the score blocks
            CudaKernel::Backward => 128,
            _ => crate::MAX_HEAD_DIM as u32,
        }
    }

    /// The kernel's own CUDA C source.
    pub fn source(self) -> &'static str {
        match self {
            CudaKernel::Forward => include_str!("../../cuda/flash_fwd.cu"),
            CudaKernel::Backward => include_str!("../../cuda/flash_bwd.cu"),
            CudaKernel::SimtForward | CudaKernel::SimtBackward => {
                include_str!("../../cuda/flash_simt.cu")
            }
            CudaKernel::Decode => include_str!("../../cuda/flash_decode.cu"),
        }
    }

    /// The program NVRTC compiles: the call's scalars ([`prelude`]), the shared
    /// helpers ([`common`], and [`MMA`] for the tensor-core kernels), then the kernel.
    pub fn program(self) -> String {
        self.program_with("")
    }

    /// [`CudaKernel::program`] with a user's score modifier (its CUDA C) in place.
    pub fn program_with(self, user: &str) -> String {
        let common = common_with(user);
        if self.tensor_cores() {
            format!("{}\n{common}\n{MMA}\n{}", prelude(), self.source())
        } else {
            format!("{}\n{common}\n{}", prelude(), self.source())
        }
    }
}

/// The call's scalars as the CUDA kernels take them: the wgpu parameter block ([`Params`]:
/// band, softcap, extras offsets, dropout and the block grid, decided in one place for both
/// paths) with the pair data placed after the extras, or a typed error where a size does not
/// fit the kernels' 32-bit indices.
pub fn cuda_params(cfg: &AttentionConfig) -> Result<Params> {
    if cfg.block.is_some() {
        return Err(Error::Unsupported {
            feature: "a block of a call (AttentionConfig::block)".into(),
            backend: crate::Backend::Cuda,
            reason: "the CUDA kernels take whole calls: run the blocks on wgpu, or the call \
                     whole"
                .into(),
        });
    }
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
    // the pair data (the mask's words, the bias's entries, the block table) follows the
    // extras on CUDA
    let mask_base = crate::registry::params::extras_layout(cfg).words.len();
    // the kernels index the mask's bits with u32
    if let Some(m) = &cfg.block_mask {
        u32::try_from(m.blocks.len()).map_err(|_| {
            Error::InvalidConfig(format!(
                "block_mask holds {} blocks; the CUDA kernels index at most 2^32 - 1",
                m.blocks.len()
            ))
        })?;
    }
    // the kernels form every other index in 32 bits too: the extras words (the pair data
    // after them), the boolean mask's bits, the bias's entries, the backward's rows
    let pair_words = cfg.mask.as_ref().map_or(0, |m| m.words().len())
        + cfg.bias.as_ref().map_or(0, |b| b.words().len())
        + cfg.paged.as_ref().map_or(0, |p| p.block_table.len());
    index_fits(
        "the extras and pair-data words",
        (mask_base + pair_words) as u64,
    )?;
    index_fits(
        "the boolean mask's bits",
        cfg.mask.as_ref().map_or(0, |m| m.words().len() as u64 * 32),
    )?;
    index_fits(
        "the bias's entries",
        cfg.bias.as_ref().map_or(0, |b| b.len() as u64),
    )?;
    index_fits(
        "the backward's rows (batch x heads_q x seq_q)",
        (cfg.batch * cfg.heads_q * cfg.seq_q) as u64,
    )?;
    for (what, x) in [
        ("seq_q", cfg.seq_q),
        ("seq_kv", cfg.seq_kv),
        ("heads_q", cfg.heads_q),
        ("heads_kv", cfg.heads_kv),
    ] {
        fits(what, x)?;
    }
    let mut p = Params::from_config(cfg);
    p.pairs_base = mask_base as u32;
    Ok(p)
}

/// `Ok` where `n` fits the CUDA kernels' 32-bit indices, else a typed `Unsupported` naming
/// `what` (an index past 2^32 would wrap and read the wrong entry).
pub fn index_fits(what: &str, n: u64) -> Result<()> {
    if n <= u32::MAX as u64 {
        return Ok(());
    }
    Err(Error::Unsupported {
        feature: format!("{what}: {n}, past 2^32"),
        backend: crate::Backend::Cuda,
        reason: "the CUDA kernels index with 32 bits; split the call over batch or heads (a \
                 bias or mask per call then shrinks with it), or use the wgpu path"
            .into(),
    })
}

/// The modifier bits the CUDA kernels read at run time (from `Params::flags`; views
/// are the wgpu path's); every other bit is compiled in ([`CudaKey::flags`]).
pub const CUDA_RUNTIME: u32 = flags::CAUSAL | flags::WINDOW | flags::VIEWS;

/// Every bit the CUDA kernels compile in.
pub const CUDA_COMPILED: u32 = flags::every() & !CUDA_RUNTIME;

/// One compiled variant: a kernel for one storage dtype, head dimension and GPU architecture
/// (compute capability x 10 + y, e.g. 80 for sm_80, 90 for sm_90).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaKey {
    pub kernel: CudaKernel,
    pub dtype: DType,
    pub head_dim: u32,
    pub arch: u32,
    /// The call's modifiers (`kernels::flags` bits, from src/modifiers/), each compiled in
    /// as `-D{NAME}=1` (the others `=0`), so that calls without one pay nothing for it:
    /// every bit but [`CUDA_RUNTIME`], which the kernels read from `Params::flags`.
    pub flags: u32,
    /// A user's score modifier (`AttentionConfig::score_mod`): its CUDA C, put before the
    /// modifiers' functions (with SCORE_MOD in `flags`).
    pub score_mod: Option<&'static str>,
    /// A user's mask (`AttentionConfig::mask_mod`): its CUDA C, after the score modifier's
    /// (with MASK_MOD in `flags`).
    pub mask_mod: Option<&'static str>,
    /// The accessors of the user code's captured tensors (`flash_captured` and one function a
    /// tensor), put before it; the host sets `flash_captured` for each call.
    pub captured: Option<&'static str>,
    /// The decode kernel's packed rows per block (`-DDECODE_ROWS`; [`decode_geometry`]
    /// picks them per call); 0 for the other kernels.
    pub decode_rows: u32,
}

/// How a decode call runs on CUDA: packed rows per block, row chunks, key splits and keys
/// per split (grid: chunks x splits, heads_kv, batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeGeometry {
    pub rows: u32,
    pub chunks: u32,
    pub splits: u32,
    pub split_keys: u32,
}

/// The decode geometry of a call, pure: the packed rows (query heads sharing a kv head x
/// query rows) in chunks of up to [`DECODE_ROWS`] (the next power of two of the rows when
/// fewer), the keys split as on wgpu ([`key_splits`](crate::plan::decode::key_splits): the
/// override, or enough splits for [`TARGET_WORKGROUPS`](crate::plan::decode::TARGET_WORKGROUPS)
/// blocks, none under 512 keys).
pub fn decode_geometry(cfg: &AttentionConfig) -> DecodeGeometry {
    let packed = (cfg.group() * cfg.seq_q).max(1);
    let rows = (packed.next_power_of_two() as u32).min(DECODE_ROWS);
    let chunks = packed.div_ceil(rows as usize);
    let (splits, split_keys) = crate::plan::decode::key_splits(
        cfg,
        cfg.batch * cfg.heads_kv * chunks,
        crate::config::MAX_KV_SPLITS,
    );
    DecodeGeometry {
        rows,
        chunks: chunks as u32,
        splits: splits as u32,
        split_keys: split_keys as u32,
    }
}

/// The oldest architecture the kernels are written for: `mma.sync` m16n8k16 with bf16,
/// `ldmatrix` and `cp.async` (Ampere).
pub const MIN_ARCH: u32 = 80;

/// The SIMT kernels' head dims compiled by the checks. Their code depends on the head dim
/// only through PER = ceil(head_dim / 8), the dims a lane holds, and whether the last of
/// them is partial: these cover PER from 1 to 32 (registers grow with it: 256 is the most),
/// full and partial, and the dims the models use.
pub const SIMT_CHECK_DIMS: [u32; 14] = [1, 8, 13, 40, 64, 72, 80, 96, 100, 128, 160, 200, 255, 256];

/// One kernel launch: entry point, grid, block and dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub entry: &'static str,
    pub grid: (u32, u32, u32),
    pub threads: u32,
    pub shared_bytes: u32,
}

impl CudaKey {
    /// The program NVRTC compiles for this key: the kernel's, with the user's score modifier
    /// and mask where the key has them (stand-ins where SCORE_MOD or MASK_MOD is on without
    /// them: the checks).
    pub fn program(&self) -> String {
        let user = |bit: u32, code: Option<&'static str>, stub: &'static str| match (
            self.flags & bit != 0,
            code,
        ) {
            (true, Some(user)) => user,
            (true, None) => stub,
            (false, _) => "",
        };
        self.kernel.program_with(&format!(
            "{}\n{}\n{}",
            self.captured.unwrap_or(""),
            user(flags::SCORE_MOD, self.score_mod, SCORE_MOD_STUB),
            user(flags::MASK_MOD, self.mask_mod, MASK_MOD_STUB)
        ))
    }

    /// The call's user code (`AttentionConfig::score_mod`, `mask_mod`: their CUDA C, and
    /// their captured tensors' accessors), or a typed `Unsupported` for a modifier given as
    /// WGSL alone.
    pub fn set_user_code(&mut self, cfg: &AttentionConfig) -> Result<()> {
        let missing = |what: &str, why: Option<&str>, with: &str| Error::Unsupported {
            feature: format!("a {what} whose WGSL is not translated to CUDA C"),
            backend: crate::Backend::Cuda,
            reason: format!(
                "{}; give its CUDA C: {with}",
                why.unwrap_or("the translation does not take it")
            ),
        };
        if let Some(m) = &cfg.score_mod {
            let code = m.cuda_source();
            self.score_mod = Some(code.ok_or_else(|| {
                missing(
                    "score_mod",
                    m.cuda_missing().as_deref(),
                    "ScoreMod::with_cuda",
                )
            })?);
        }
        if let Some(m) = &cfg.mask_mod {
            let code = m.cuda_source();
            self.mask_mod = Some(code.ok_or_else(|| {
                missing(
                    "mask_mod",
                    m.cuda_missing().as_deref(),
                    "MaskMod::with_cuda",
                )
            })?);
        }
        self.captured = crate::registry::user_code::kernel_cuda_captured(cfg);
        Ok(())
    }

    /// A key, or a typed error for what the kernels cannot do.
    pub fn new(kernel: CudaKernel, dtype: DType, head_dim: u32, arch: u32) -> Result<CudaKey> {
        if kernel.tensor_cores() && dtype == DType::F32 {
            return Err(Error::Unsupported {
                feature: format!("f32 tensors in {}", kernel.name()),
                backend: crate::Backend::Cuda,
                reason: "the tensor-core kernels multiply f16 or bf16; f32 runs on the SIMT \
                         kernels (CudaKernel::for_pass picks them), or use the wgpu path"
                    .into(),
            });
        }
        let max = kernel.max_head_dim();
        let step = if kernel.tensor_cores() { 16 } else { 1 };
        if head_dim == 0 || !head_dim.is_multiple_of(step) || head_dim > max {
            return Err(Error::Unsupported {
                feature: format!("head_dim {head_dim} in {}", kernel.name()),
                backend: crate::Backend::Cuda,
                reason: format!(
                    "{} takes head dims that are multiples of {step} up to {max} \
                     (CudaKernel::for_pass picks the SIMT kernels for others); use the wgpu \
                     path for others",
                    kernel.name()
                ),
            });
        }
        if arch < MIN_ARCH {
            return Err(Error::Unsupported {
                feature: format!("CUDA architecture sm_{arch}"),
                backend: crate::Backend::Cuda,
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
            flags: 0,
            score_mod: None,
            mask_mod: None,
            captured: None,
            decode_rows: if kernel == CudaKernel::Decode {
                DECODE_ROWS
            } else {
                0
            },
        })
    }

    pub fn threads(&self) -> u32 {
        match self.kernel {
            CudaKernel::Forward | CudaKernel::Backward => WARPS * 32,
            CudaKernel::Decode => DECODE_THREADS,
            _ => SIMT_THREADS,
        }
    }

    /// The decode kernel's lanes per key (`-DKEY_LANES`): each lane holds at most 8 dims of a
    /// row (its slices of q and of the rows' outputs stay in registers for 4 rows).
    pub fn key_lanes(&self) -> u32 {
        match self.head_dim {
            d if d <= 64 => 8,
            d if d <= 128 => 16,
            _ => 32,
        }
    }

    /// Whether the decode kernel reads each lane's dims as whole 16-byte words
    /// (`-DDECODE_VEC`): the lanes cover head_dim exactly and a lane's dims are a multiple of
    /// 16 bytes (every row then starts on a word, as the allocations do).
    pub fn decode_vec(&self) -> bool {
        let lanes = self.key_lanes();
        let per = self.head_dim.div_ceil(lanes);
        lanes * per == self.head_dim && (per * self.dtype.size_bytes() as u32).is_multiple_of(16)
    }

    /// Rows resident in a block: query rows (forward, dQ) or keys (dK/dV); 8 lanes a row in
    /// the SIMT kernels.
    pub fn block_rows(&self) -> u32 {
        if self.kernel.tensor_cores() {
            WARPS * 16
        } else {
            SIMT_THREADS / 8
        }
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
            // SIMT: a K and a V tile (or Q and dO) of f32, 64 KiB at most
            (_, d) if d <= 128 => 64,
            (_, _) => 32,
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

    /// A SIMT tile: `rows` x head_dim f32.
    fn f32_tile_bytes(&self, rows: u32) -> u32 {
        rows * self.head_dim * 4
    }

    /// Every launch of the program's entries, for a call (grid from `cfg`).
    pub fn launches(&self, cfg: &AttentionConfig) -> Vec<Launch> {
        let row_blocks = (cfg.seq_q as u32).div_ceil(self.block_rows());
        let per_head = (row_blocks, cfg.heads_q as u32, cfg.batch as u32);
        let mut launches = self.pass_launches(cfg, per_head);
        let backward = matches!(self.kernel, CudaKernel::Backward | CudaKernel::SimtBackward);
        // with sinks, the backward ends with their gradient: one block per query head
        if self.flags & flags::SINKS != 0 && backward {
            launches.push(Launch {
                entry: "flash_sinks_grad",
                grid: (cfg.heads_q as u32, 1, 1),
                threads: 256,
                shared_bytes: 0,
            });
        }
        // with a bias that asks for it, then the sum of the gradients the dQ kernel kept into
        // d_bias: one thread per entry
        if let Some(b) = cfg
            .bias
            .as_ref()
            .filter(|b| self.flags & flags::BIAS != 0 && b.grad && backward)
        {
            launches.push(Launch {
                entry: "flash_bias_reduce",
                grid: ((b.len() as u64).div_ceil(256) as u32, 1, 1),
                threads: 256,
                shared_bytes: 0,
            });
        }
        launches
    }

    fn pass_launches(&self, cfg: &AttentionConfig, per_head: (u32, u32, u32)) -> Vec<Launch> {
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
            // a K and a V tile
            CudaKernel::SimtForward => vec![Launch {
                entry: "flash_simt_fwd",
                grid: per_head,
                threads: self.threads(),
                shared_bytes: self.f32_tile_bytes(2 * self.block_keys()),
            }],
            // one block per (row chunk, split) of each kv head, then the splits' merge: one
            // thread per element of out
            CudaKernel::Decode => {
                let g = decode_geometry(cfg);
                let mut launches = vec![Launch {
                    entry: "flash_decode",
                    grid: (g.chunks * g.splits, cfg.heads_kv as u32, cfg.batch as u32),
                    threads: self.threads(),
                    shared_bytes: 0,
                }];
                if g.splits > 1 {
                    let elements = (cfg.batch * cfg.seq_q * cfg.heads_q * cfg.head_dim) as u64;
                    launches.push(Launch {
                        entry: "flash_decode_combine",
                        grid: (elements.div_ceil(256) as u32, 1, 1),
                        threads: 256,
                        shared_bytes: 0,
                    });
                }
                launches
            }
            CudaKernel::SimtBackward => {
                let rows = (cfg.batch * cfg.heads_q * cfg.seq_q) as u32;
                vec![
                    Launch {
                        entry: "flash_simt_bwd_preprocess",
                        grid: (rows.div_ceil(self.threads()), 1, 1),
                        threads: self.threads(),
                        shared_bytes: 0,
                    },
                    // a Q and a dO tile, lse2 and delta per tile row
                    Launch {
                        entry: "flash_simt_dkdv",
                        grid: (
                            (cfg.seq_kv as u32).div_ceil(self.block_rows()),
                            cfg.heads_kv as u32,
                            cfg.batch as u32,
                        ),
                        threads: self.threads(),
                        shared_bytes: self.f32_tile_bytes(2 * self.block_keys())
                            + 2 * 4 * self.block_keys(),
                    },
                    // a K and a V tile
                    Launch {
                        entry: "flash_simt_dq",
                        grid: per_head,
                        threads: self.threads(),
                        shared_bytes: self.f32_tile_bytes(2 * self.block_keys()),
                    },
                ]
            }
        }
    }

    /// NVRTC options: the exact architecture (real code, not PTX only) and the geometry.
    pub fn options(&self) -> Vec<String> {
        let elem_kind = match self.dtype {
            DType::F16 => 0,
            DType::BF16 => 1,
            DType::F32 => 2,
        };
        let mut opts = vec![
            format!("--gpu-architecture=sm_{}", self.arch),
            "--std=c++17".into(),
            format!("-DHEAD_DIM={}", self.head_dim),
            format!("-DELEM_KIND={elem_kind}"),
            format!("-DBLOCK_N={}", self.block_keys()),
        ];
        for (bit, name) in flags::ALL {
            if bit & CUDA_RUNTIME == 0 {
                opts.push(format!("-D{name}={}", u32::from(self.flags & bit != 0)));
            }
        }
        if self.kernel.tensor_cores() {
            opts.push(format!("-DWARPS={WARPS}"));
            opts.push(format!("-DBLOCK_Q={}", self.block_queries()));
        } else {
            opts.push(format!("-DTHREADS={}", self.threads()));
        }
        if self.kernel == CudaKernel::Decode {
            opts.push(format!("-DDECODE_ROWS={}", self.decode_rows));
            opts.push(format!("-DKEY_LANES={}", self.key_lanes()));
            opts.push(format!("-DDECODE_VEC={}", u32::from(self.decode_vec())));
        }
        opts
    }

    pub fn label(&self) -> String {
        format!(
            "{} {:?} head_dim {} sm_{}{}{}",
            self.kernel.name(),
            self.dtype,
            self.head_dim,
            self.arch,
            if self.decode_rows > 0 {
                format!(" rows {}", self.decode_rows)
            } else {
                String::new()
            },
            if self.flags == 0 {
                String::new()
            } else {
                format!(" {}", flags::names(self.flags))
            }
        )
    }

    /// The variants a build is checked with on one architecture: every tensor-core variant
    /// (both half dtypes, every head dim they take), the SIMT kernels in every dtype at
    /// [`SIMT_CHECK_DIMS`], and the decode kernel at those dims in f16 and at a few of them
    /// (word reads and element reads, the most registers) in bf16 and f32, with 1 and 2 rows
    /// a block too at head_dim 128; with the score modifiers (softcap, ALiBi, sinks, key
    /// lengths, dropout, the block mask, packed sequences, the boolean mask, the bias and
    /// paged K/V, all at once) too at head dims 64, 128 and 256. (Key lengths and packed
    /// sequences never meet in a call, but their code compiles together; the decode kernel
    /// never takes packed sequences.)
    pub fn all_for_arch(arch: u32) -> Vec<CudaKey> {
        let mut keys = Vec::new();
        for kernel in CudaKernel::ALL {
            let variants: Vec<(DType, u32)> = match kernel {
                CudaKernel::Forward | CudaKernel::Backward => [DType::F16, DType::BF16]
                    .into_iter()
                    .flat_map(|t| {
                        (16..=kernel.max_head_dim())
                            .step_by(16)
                            .map(move |d| (t, d))
                    })
                    .collect(),
                CudaKernel::SimtForward | CudaKernel::SimtBackward => {
                    [DType::F32, DType::F16, DType::BF16]
                        .into_iter()
                        .flat_map(|t| SIMT_CHECK_DIMS.map(|d| (t, d)))
                        .collect()
                }
                CudaKernel::Decode => SIMT_CHECK_DIMS
                    .map(|d| (DType::F16, d))
                    .into_iter()
                    .chain(
                        [DType::BF16, DType::F32]
                            .into_iter()
                            .flat_map(|t| [13, 64, 128, 256].map(|d| (t, d))),
                    )
                    .collect(),
            };
            for (dtype, head_dim) in variants {
                // the score modifiers' code at the head dims the models use them with
                let mods: &[bool] = if [64, 128, 256].contains(&head_dim) {
                    &[false, true]
                } else {
                    &[false]
                };
                let Ok(base) = CudaKey::new(kernel, dtype, head_dim, arch) else {
                    continue; // an architecture the kernels do not take: nothing to check
                };
                for &on in mods {
                    keys.push(CudaKey {
                        flags: if !on {
                            0
                        } else if kernel == CudaKernel::Decode {
                            CUDA_COMPILED & !flags::VARLEN
                        } else {
                            CUDA_COMPILED
                        },
                        ..base
                    });
                }
                if kernel == CudaKernel::Decode && dtype == DType::F16 && head_dim == 128 {
                    for decode_rows in [1, 2] {
                        keys.push(CudaKey {
                            decode_rows,
                            ..base
                        });
                    }
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
    fn indices_past_32_bits_are_typed_unsupported_errors_naming_what_overflows() {
        assert!(index_fits("x", u32::MAX as u64).is_ok());
        // a bias of 4 x 32 x 8K x 8K entries fits an H200 but not a 32-bit index
        match index_fits("the bias's entries", 4 * 32 * 8192 * 8192) {
            Err(Error::Unsupported {
                feature, backend, ..
            }) => {
                assert_eq!(backend, crate::Backend::Cuda);
                assert!(
                    feature.contains("bias") && feature.contains("8589934592"),
                    "{feature}"
                );
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
        // the backward's rows are checked from the config alone (no data is needed)
        let cfg = AttentionConfig::new(1 << 12, 1 << 11, 1 << 11, 1 << 10, 1 << 10, 64);
        match cuda_params(&cfg) {
            Err(Error::Unsupported { feature, .. }) => {
                assert!(feature.contains("rows"), "{feature}")
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }

    #[test]
    fn a_block_of_a_call_is_unsupported_on_cuda_naming_the_field() {
        // every CUDA call (forward, backward, caches, decode) takes its scalars here
        let mut cfg = AttentionConfig::new(1, 64, 128, 2, 1, 32);
        cfg.causal = true;
        assert!(cuda_params(&cfg).is_ok());
        cfg.block = Some(crate::Block {
            whole_seq_q: 256,
            whole_seq_kv: 256,
            q0: 128,
            k0: 0,
        });
        match cuda_params(&cfg) {
            Err(Error::Unsupported {
                feature, backend, ..
            }) => {
                assert_eq!(backend, crate::Backend::Cuda);
                assert!(feature.contains("AttentionConfig::block"), "{feature}");
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }

    #[test]
    fn each_pass_goes_to_the_tensor_cores_where_they_take_it_else_to_the_simt_kernels() {
        use CudaKernel::*;
        for (pass, dtype, d, want) in [
            (Pass::Forward, DType::BF16, 128, Forward),
            (Pass::Forward, DType::F16, 256, Forward),
            (Pass::Forward, DType::F32, 64, SimtForward),
            (Pass::Forward, DType::F16, 72, SimtForward),
            (Pass::Forward, DType::BF16, 8, SimtForward),
            (Pass::Backward, DType::F16, 128, Backward),
            (Pass::Backward, DType::F16, 144, SimtBackward),
            (Pass::Backward, DType::BF16, 100, SimtBackward),
            (Pass::Backward, DType::F32, 64, SimtBackward),
        ] {
            let k = CudaKernel::for_pass(pass, dtype, d);
            assert_eq!(k, want, "{pass:?} {dtype:?} {d}");
            // and the chosen program takes it
            assert!(CudaKey::new(k, dtype, d, 80).is_ok());
        }
    }

    #[test]
    fn keys_refuse_what_the_kernels_cannot_do_with_typed_errors() {
        assert!(CudaKey::new(CudaKernel::Forward, DType::BF16, 128, 90).is_ok());
        assert!(CudaKey::new(CudaKernel::SimtForward, DType::F32, 255, 90).is_ok());
        for (kernel, dtype, d, arch) in [
            (CudaKernel::Forward, DType::F32, 64, 90),
            (CudaKernel::Forward, DType::F16, 72, 90),
            (CudaKernel::Forward, DType::F16, 0, 90),
            (CudaKernel::Forward, DType::F16, 272, 90),
            (CudaKernel::Forward, DType::F16, 64, 75),
            (CudaKernel::Backward, DType::F16, 144, 90),
            (CudaKernel::SimtBackward, DType::F32, 0, 90),
            (CudaKernel::SimtBackward, DType::F32, 257, 90),
            (CudaKernel::SimtForward, DType::F32, 64, 75),
        ] {
            match CudaKey::new(kernel, dtype, d, arch) {
                Err(Error::Unsupported {
                    feature,
                    backend,
                    reason,
                }) => {
                    assert_eq!(backend, crate::Backend::Cuda);
                    assert!(!feature.is_empty() && reason.contains("wgpu path"))
                }
                other => panic!("{kernel:?} {dtype:?} {d} sm_{arch}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_scalar_argument_is_declared_once_for_both_backends() {
        // every field 4-byte words and none padded: the C struct generated from the same list
        // lays them out as repr(C) does
        let words: usize = PARAMS_C
            .lines()
            .filter(|l| l.starts_with("    ") && !l.trim_start().starts_with("//"))
            .map(|l| if l.contains("[5][4]") { 20 } else { 1 })
            .sum();
        assert_eq!(std::mem::size_of::<Params>(), 4 * words);
        assert_eq!(std::mem::align_of::<Params>(), 4);
        assert!(PARAMS_C.contains("    unsigned int views[5][4];\n};"));
        assert!(PARAMS_C.contains("    float softcap2;"));
        assert!(PARAMS_C.contains("    int band_lo;"));
        // no second, hand-kept declaration in the shared source, and every program starts
        // with the generated one
        assert!(!COMMON.contains("struct Params {"));
        for kernel in CudaKernel::ALL {
            assert!(kernel.program().starts_with(PARAMS_C));
        }
        // the pair data follows the extras on CUDA
        let mut cfg = AttentionConfig::new(1, 4, 4, 2, 2, 8);
        cfg.sinks = Some(vec![0.5, -0.5]);
        assert_eq!(cuda_params(&cfg).unwrap().pairs_base, 2);
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
                    assert!(l.threads <= 1024 && l.threads % 32 == 0);
                    // every entry the host launches is in the program (the sinks' gradient
                    // in the shared part; it and the decode's merge of its splits with their
                    // own block size)
                    let source = if l.entry == "flash_sinks_grad" {
                        assert_eq!(l.threads, 256);
                        COMMON
                    } else {
                        let own = l.entry == "flash_decode_combine";
                        assert_eq!(l.threads, if own { 256 } else { key.threads() });
                        key.kernel.source()
                    };
                    assert!(source.contains(&format!("{}(", l.entry)), "{}", l.entry);
                }
            }
        }
        let opts = key.options();
        assert!(opts.contains(&"--gpu-architecture=sm_80".to_string()));
        assert!(opts.contains(&"-DBLOCK_N=64".to_string()));
        // every define a source requires is passed
        for kernel in CudaKernel::ALL {
            let key = CudaKey::new(kernel, DType::BF16, 64, 90).unwrap();
            let program = key.program();
            for name in [
                "HEAD_DIM",
                "ELEM_KIND",
                "WARPS",
                "THREADS",
                "BLOCK_N",
                "BLOCK_Q",
                "DECODE_ROWS",
                "KEY_LANES",
                "DECODE_VEC",
            ] {
                if program.contains(&format!("defined({name})")) {
                    let opts = key.options();
                    assert!(
                        opts.iter().any(|o| o.starts_with(&format!("-D{name}="))),
                        "{name}"
                    );
                }
            }
            // every modifier has a default in the source (off) and the key always sets it,
            // so no program compiles a modifier its key did not ask for
            for name in [
                "SOFTCAP", "ALIBI", "SINKS", "SEQLENS", "DROPOUT", "BLOCKS", "VARLEN", "MASK",
                "PAGED",
            ] {
                assert!(
                    program.contains(&format!("#ifndef {name}")),
                    "{name} default"
                );
                assert!(
                    key.options().iter().any(|o| o == &format!("-D{name}=0")),
                    "{name} passed off by a plain key"
                );
            }
        }
        // the tensor-core backward's head dims stop at 128; the SIMT one takes the rest
        assert!(CudaKey::new(CudaKernel::Backward, DType::F16, 144, 90).is_err());
        assert!(CudaKey::new(CudaKernel::Forward, DType::F16, 144, 90).is_ok());
        assert!(CudaKey::new(CudaKernel::SimtBackward, DType::F16, 144, 90).is_ok());
    }

    #[test]
    fn decode_steps_take_the_decode_kernel_packed_per_kv_head_and_split() {
        // one row, 32 query heads over 8 at 32K keys: 4 packed rows a kv head, 32 splits of
        // 1024 keys (256 blocks), then their merge, one thread an element of out
        let mut c = AttentionConfig::new(1, 1, 32768, 32, 8, 128);
        assert_eq!(CudaKernel::for_forward(&c, DType::F16), CudaKernel::Decode);
        let g = decode_geometry(&c);
        let want = DecodeGeometry {
            rows: 4,
            chunks: 1,
            splits: 32,
            split_keys: 1024,
        };
        assert_eq!(g, want);
        let key = CudaKey::new(CudaKernel::Decode, DType::F16, 128, 90).unwrap();
        let l = key.launches(&c);
        let entries: Vec<&str> = l.iter().map(|l| l.entry).collect();
        assert_eq!(entries, ["flash_decode", "flash_decode_combine"]);
        assert_eq!((l[0].grid, l[0].threads), ((32, 8, 1), 128));
        assert_eq!(l[1].grid, (32 * 128 / 256, 1, 1));
        // an override: n splits of ceil(seq_kv / n) keys
        c.kv_splits = Some(7);
        c.seq_kv = 1000;
        assert_eq!(
            (decode_geometry(&c).splits, decode_geometry(&c).split_keys),
            (7, 143)
        );
        // MHA under 512 keys: one row a block, one split, no merge launched
        let c = AttentionConfig::new(2, 1, 300, 8, 8, 64);
        let g = decode_geometry(&c);
        assert_eq!((g.rows, g.chunks, g.splits), (1, 1, 1));
        let key = CudaKey::new(CudaKernel::Decode, DType::F32, 64, 80).unwrap();
        assert_eq!(key.launches(&c).len(), 1);
        // 3 query rows of 8 heads a kv head: 24 packed rows in 6 chunks of 4
        let c = AttentionConfig::new(1, 3, 4096, 16, 2, 64);
        let g = decode_geometry(&c);
        assert_eq!((g.rows, g.chunks), (4, 6));
        // 2 packed rows: blocks of 2
        assert_eq!(
            decode_geometry(&AttentionConfig::new(1, 2, 64, 4, 4, 64)).rows,
            2
        );
        // five query rows, or packed sequences: the forward kernels
        let mut c = AttentionConfig::new(1, 5, 4096, 32, 8, 128);
        assert_eq!(CudaKernel::for_forward(&c, DType::F16), CudaKernel::Forward);
        assert_eq!(
            CudaKernel::for_forward(&c, DType::F32),
            CudaKernel::SimtForward
        );
        c.seq_q = 1;
        c.algorithm = crate::Algorithm::Naive;
        assert_ne!(CudaKernel::for_forward(&c, DType::F16), CudaKernel::Decode);
        let p = AttentionConfig::packed(vec![0, 1, 2], vec![0, 50, 90], 4, 2, 64);
        assert_ne!(CudaKernel::for_forward(&p, DType::F16), CudaKernel::Decode);
        // lanes a key, at most 8 dims a lane; whole 16-byte words where the lanes cover the
        // row and a lane's dims fill words
        let lanes_vec = |t: DType, d: u32| {
            let k = CudaKey::new(CudaKernel::Decode, t, d, 90).unwrap();
            (k.key_lanes(), k.decode_vec())
        };
        assert_eq!(lanes_vec(DType::F16, 128), (16, true));
        assert_eq!(lanes_vec(DType::F32, 128), (16, true));
        assert_eq!(lanes_vec(DType::BF16, 256), (32, true));
        assert_eq!(lanes_vec(DType::F16, 64), (8, true));
        assert_eq!(lanes_vec(DType::F16, 32), (8, false));
        assert_eq!(lanes_vec(DType::F32, 32), (8, true));
        assert_eq!(lanes_vec(DType::F16, 40), (8, false));
        assert_eq!(lanes_vec(DType::BF16, 13), (8, false));
        let opts = CudaKey::new(CudaKernel::Decode, DType::F16, 128, 90)
            .unwrap()
            .options();
        for o in [
            "-DTHREADS=128",
            "-DDECODE_ROWS=4",
            "-DKEY_LANES=16",
            "-DDECODE_VEC=1",
        ] {
            assert!(opts.contains(&o.to_string()), "{o}");
        }
    }
}
