//! The pure tile chooser: the largest tiles that fit the device's workgroup memory and
//! invocation limits, and the workgroup memory each tiled kernel needs for a tile shape.

use super::{Kernel, Pass, Variant};
use crate::error::{Error, Result};

/// Tile shape of a tiled kernel: BR query rows and BC keys per tile; RPT rows per thread (rows
/// family, TPR 1); the blocks family uses both: TPR threads across the streamed rows (NTX) and
/// RPT resident rows per thread (TM); the coop family TPR invocations per resident row and RPT
/// the cooperative matrices' fragment size (16 or 8: [`DeviceCaps::coop`]), which sizes its
/// padding and blocks (the prelude's CF).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tiles {
    pub br: u32,
    pub bc: u32,
    pub tpr: u32,
    pub rpt: u32,
}

impl Tiles {
    pub const ONE: Tiles = Tiles {
        br: 1,
        bc: 1,
        tpr: 1,
        rpt: 1,
    };

    /// Rows a workgroup owns: queries, or keys for the dK/dV kernels.
    pub fn rows(&self, kernel: Kernel) -> u32 {
        if kernel.rows_are_keys() {
            self.bc
        } else {
            self.br
        }
    }

    /// Threads per workgroup: for the decode kernels, a key of the tile for each invocation
    /// of each row group (`tpr` groups: `decode_tiles_for`).
    pub fn threads(&self, kernel: Kernel) -> u32 {
        if kernel.is_decode() {
            return self.bc * self.tpr.max(1);
        }
        if kernel.is_coop() {
            return self.rows(kernel) * self.tpr;
        }
        self.rows(kernel) * self.tpr / self.rpt.max(1)
    }
}

/// What the tile chooser needs to know about the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCaps {
    pub max_workgroup_storage_bytes: u32,
    pub max_invocations_per_workgroup: u32,
    /// The fragment size of the cooperative matrices the coop kernels multiply on here: 16
    /// (16x16x16) or 8 (8x8x8: Apple GPUs through Metal, lavapipe 26), f16 operands and f32
    /// accumulators, with SHADER_F16 and SUBGROUP; 0 where the adapter offers neither
    /// (`device::coop::fragment_size`).
    pub coop: u32,
    /// Private (per-invocation) f32 values a kernel may hold in arrays before a GPU compiler
    /// spills them: [`GPU_PRIVATE_FLOATS`] on GPUs (an invocation has about 255 32-bit
    /// registers, and addresses and loop state need their share), [`CPU_PRIVATE_FLOATS`] on
    /// CPU drivers (lavapipe, SwiftShader, WARP), whose private arrays live in memory anyway.
    pub private_floats: u32,
    /// The class of GPU whose compiler the blocks kernels' tiles were chosen against
    /// ([`GpuClass::blocks_tiles`]); [`GpuClass::Other`] takes the default tiles.
    pub gpu: GpuClass,
}

/// GPUs whose compilers shape the blocks kernels' tiles (docs/log/compilers.md): each class has
/// a table of tiles by pass and the largest head dim each serves, chosen from its compiler's
/// statistics (`compiler_stats --search` under Mesa's no-op DRM shims), which the chooser tries
/// before the default candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GpuClass {
    /// The default tiles.
    #[default]
    Other,
    /// A GPU that runs only 64-wide subgroups on compute units of four SIMDs sharing 64 KiB
    /// of workgroup memory, with 256 registers a lane (AMD's GCN, Vega and CDNA: a GPU whose
    /// subgroup is 64..64): there a blocks workgroup needs at most 32 KiB and 128 registers an
    /// invocation for two waves a SIMD, which the default tiles miss (one wave):
    /// [`WAVE64_CU_TILES`].
    Wave64Cu,
    /// Apple's GPUs (vendor 0x106B: Metal, Honeykrisp): AGX gives an invocation at most 128
    /// 32-bit registers, and 512 threads a core need about 104; the default blocks tiles
    /// spill at 128: [`APPLE_TILES`].
    Apple,
    /// Qualcomm's Adreno (vendor 0x5143): ir3 runs the default blocks forward at 2 waves a core
    /// and spills its f32 form at head dim 128: [`ADRENO_TILES`].
    Adreno,
    /// NVIDIA's GPUs (vendor 0x10DE: NVIDIA's driver, NVK): NAK runs the default blocks
    /// tiles at 6-16 warps an SM: [`NVIDIA_TILES`]; the decode reads K and V in one-word
    /// columns ([`GpuClass::decode_max_words`]).
    Nvidia,
}

impl GpuClass {
    /// The class of an adapter: `vendor` is the PCI (or Vulkan) vendor id, `name` its name
    /// (Metal reports no vendor id: Apple's GPUs name themselves "Apple ..."), `subgroups` its
    /// subgroup size range; CPU drivers are [`GpuClass::Other`].
    pub fn of(vendor: u32, name: &str, subgroups: (u32, u32), cpu: bool) -> GpuClass {
        match vendor {
            _ if cpu => GpuClass::Other,
            0x106B => GpuClass::Apple,
            0x5143 => GpuClass::Adreno,
            0x10DE => GpuClass::Nvidia,
            _ if name.starts_with("Apple") => GpuClass::Apple,
            _ if name.contains("Adreno") => GpuClass::Adreno,
            // GCN, Vega, CDNA: wave64 only (RDNA offers 32..64; NVIDIA 32, Intel 8..32)
            _ if subgroups == (64, 64) => GpuClass::Wave64Cu,
            _ => GpuClass::Other,
        }
    }

    /// The class's blocks tiles, `(pass, largest head dim, (resident, streamed, NTX, TM))`,
    /// tried before the default candidates: for each pass the first entry whose head dim is at
    /// least the call's.
    pub fn blocks_tiles(self) -> &'static [(Pass, u32, BlocksEntry)] {
        match self {
            GpuClass::Other => &[],
            GpuClass::Wave64Cu => &WAVE64_CU_TILES,
            GpuClass::Nvidia => &NVIDIA_TILES,
            GpuClass::Apple => &APPLE_TILES,
            GpuClass::Adreno => &ADRENO_TILES,
        }
    }

    /// The widest columns (16-byte words) the decode kernel reads K and V in on this class, for
    /// values of up to 256 dims (`plan::decode::wide_words`): each output row keeps a column's
    /// sums in registers (f16 at 2 words: 4 vec4s a row), and 1 word halves them; the 8-bit
    /// caches' decode reads half a 16-byte word a column there (`plan::quantized::read_cache`).
    /// Measured (docs/log/compilers.md): on Apple's GPUs (AGX) the f16 decode 112-116 registers
    /// to 80 (448 threads a core to 640), f32 84 to 60 (576 to 832), 8-bit 124-128 to 80-84
    /// (384 to 576-640, E4M3's 2 spills gone); on NVIDIA's (NAK, GA100) f16 168-176 to 96-104
    /// (8-12 warps an SM to 16-20), f32 104 to 56-64 (16 to 32-36), 8-bit 176 to 104 (8 to
    /// 16); on wave64 GCN (ACO 26.1, vega20) f16 and 8-bit 256 VGPRs to 128 (1 wave a SIMD
    /// to 2).
    pub fn decode_max_words(self) -> u32 {
        match self {
            GpuClass::Apple | GpuClass::Nvidia | GpuClass::Wave64Cu => 1,
            GpuClass::Other | GpuClass::Adreno => 2,
        }
    }

    /// Every class with tiles of its own.
    pub const TABLED: [GpuClass; 4] = [
        GpuClass::Wave64Cu,
        GpuClass::Apple,
        GpuClass::Adreno,
        GpuClass::Nvidia,
    ];
}

/// [`DeviceCaps::private_floats`] on a GPU.
pub const GPU_PRIVATE_FLOATS: u32 = 192;
/// [`DeviceCaps::private_floats`] on a CPU driver.
pub const CPU_PRIVATE_FLOATS: u32 = 1024;

impl DeviceCaps {
    /// The WebGPU defaults every conforming adapter offers (and a GPU's register budget).
    pub const WEBGPU_DEFAULT: DeviceCaps = DeviceCaps {
        max_workgroup_storage_bytes: 16384,
        max_invocations_per_workgroup: 256,
        coop: 0,
        private_floats: GPU_PRIVATE_FLOATS,
        gpu: GpuClass::Other,
    };
}

/// The blocks kernels' tiles on a [`GpuClass::Wave64Cu`] GPU, by pass and the largest
/// head dim each serves, as `(resident, streamed, NTX, TM)` entries of the chooser's
/// candidates: from AMD's compiler's statistics on Renoir (`compiler_stats --search`, the
/// table in docs/log/compilers.md, "Wave64 tiles"), the largest tile of each with at least
/// two waves a SIMD (forward d=64: 32 x 32, 128 registers, 2 waves, against 1 with the default
/// 64 x 64), up to the listed head dim (dQ from 32: below, its default runs 2 waves and a
/// 16 x 16 tile leaves too little memory for a trainable tensor's fold). Past these head dims,
/// and for dK/dV past 64 (its K and V tiles leave no 16 x 16 tile within 32 KiB at 128: one
/// wave either way), the default choice stands.
pub const WAVE64_CU_TILES: [(Pass, u32, BlocksEntry); 5] = [
    (Pass::Forward, 64, (32, 32, 16, 2)),
    (Pass::Forward, 128, (16, 16, 16, 1)),
    (Pass::DkDv, 64, (16, 16, 16, 1)),
    (Pass::Dq, 64, (16, 16, 16, 1)),
    (Pass::Dq, 128, (8, 4, 4, 1)),
];

/// The blocks kernels' tiles on Apple's GPUs ([`GpuClass::Apple`]), from AGX's statistics on
/// the M1 (`compiler_stats --search`, docs/log/compilers.md, "Apple and Adreno tiles"): the
/// largest tile of each pass with no spills and at least 512 threads a core, in f16 and f32
/// (forward d=64: 54 registers, 896 threads, against 128, 3-6 spills and 384 with the default).
/// At head dim 128 dK/dV takes 8 x 8 (100-104 registers, 512 threads: every larger tile
/// spills) and dQ 8 x 8 (68 registers, 768 threads).
pub const APPLE_TILES: [(Pass, u32, BlocksEntry); 6] = [
    (Pass::Forward, 64, (32, 32, 16, 2)),
    (Pass::Forward, 128, (16, 16, 16, 1)),
    (Pass::DkDv, 64, (16, 16, 16, 1)),
    (Pass::DkDv, 128, (8, 8, 8, 1)),
    (Pass::Dq, 64, (16, 16, 16, 1)),
    (Pass::Dq, 128, (8, 8, 8, 1)),
];

/// The blocks kernels' tiles on Qualcomm's Adreno ([`GpuClass::Adreno`]), from ir3's statistics
/// on the Adreno 730 (docs/log/compilers.md, "Apple and Adreno tiles"): the forwards' largest
/// tiles with 4 waves a core and no spills (the default: 2 waves, and 52 spills in f32 at head
/// dim 128). The backward passes keep the default (2 waves, their floor): at head dim 128 every
/// dK/dV candidate spills in f32, the default least (9).
pub const ADRENO_TILES: [(Pass, u32, BlocksEntry); 2] = [
    (Pass::Forward, 64, (32, 32, 16, 2)),
    (Pass::Forward, 128, (16, 16, 16, 1)),
];

/// The blocks kernels' tiles on NVIDIA's GPUs ([`GpuClass::Nvidia`]), from NAK's statistics on
/// the GA100 (`compiler_stats --search`, docs/log/compilers.md, "NVIDIA tiles"): of the tiles
/// with no spills, at least 16 warps an SM and at most 48 KiB (NVIDIA's default for a
/// workgroup), the highest fraction of peak in the inner-loop model (`device::isa`), the larger
/// tile where two are within 0.02 (it reads K and V fewer times). The defaults: 6-16 warps,
/// 0.05-0.08; these 28-40 warps (dK/dV and dQ at head dim 64: 16 and 24), 0.13-0.23. At head
/// dim 128 the backward tiles take 35 KiB: on a GPU of 32 KiB the chooser goes on to the
/// default candidates.
pub const NVIDIA_TILES: [(Pass, u32, BlocksEntry); 6] = [
    (Pass::Forward, 64, (32, 32, 16, 2)),
    (Pass::Forward, 128, (16, 16, 16, 1)),
    (Pass::DkDv, 64, (16, 16, 8, 2)),
    (Pass::DkDv, 128, (16, 16, 16, 1)),
    (Pass::Dq, 64, (16, 16, 8, 2)),
    (Pass::Dq, 128, (16, 16, 16, 1)),
];

/// Invocations of a coop workgroup: a multiple of every subgroup size (4 subgroups of 32, 2
/// of 64); the matrix blocks are shared out by subgroup id, whatever the size.
pub const COOP_THREADS: u32 = 128;

/// Keys per tile of the decode kernel (`shaders/flash_decode.wgsl`): one invocation of each
/// row group scores each key.
pub const DECODE_KEYS: u32 = 64;

/// Packed rows one group of [`DECODE_KEYS`] invocations scores; a workgroup of more rows
/// has a group for each such share (`Tiles::tpr`), and P V shares the rows out alike, so an
/// invocation's private sums stay those of 8 rows however many the workgroup serves.
pub const DECODE_GROUP_ROWS: u32 = 8;

/// The most packed rows (query heads sharing a kv head, times query rows) one decode
/// workgroup serves; calls with more run in chunks of rows. 64 rows are 8 groups of
/// [`DECODE_KEYS`] invocations, 512 (where the adapter allows them: WebGPU's default 256 give
/// 32 rows): MLA's 128 query heads over one latent head read each latent row in 2 workgroups
/// (as FlashMLA's 64-head blocks), or 4. All 128 in one would hold 32 KiB of scores alone.
pub const DECODE_MAX_ROWS: u32 = 64;

/// The decode kernel's tiles for a call of `rows` packed rows and `head_dim` (the wider of
/// the q/k and v dims): `br` packed rows (a power of two, the most up to [`DECODE_MAX_ROWS`]
/// and `rows` that fit), [`DECODE_KEYS`] keys a tile (`bc`), `tpr` row groups of
/// [`DECODE_GROUP_ROWS`] (the workgroup's invocations: `bc * tpr`), and `rpt` the vec4s of
/// each row's q the workgroup memory holds at once: all of them (q staged once), or a
/// multiple of 4 (q staged in chunks each tile: wide heads, as MLA's 576, at many rows).
/// With `q_chunks` (`Tuning::decode_q_chunks`) more rows win over holding q whole (each
/// workgroup reads every key of its split, and q's chunks a tile are `br / bc` of the keys'
/// bytes); without, rows are halved until q fits whole.
pub fn decode_tiles_for(
    rows: u32,
    head_dim: u32,
    caps: DeviceCaps,
    q_chunks: bool,
) -> Result<Tiles> {
    let d4 = head_dim.div_ceil(4);
    let words = caps.max_workgroup_storage_bytes / 4;
    let mut br = DECODE_MAX_ROWS.min(rows.max(1).next_power_of_two());
    loop {
        let groups = br.div_ceil(DECODE_GROUP_ROWS);
        // what the rows' scores and factors leave holds q
        let fixed = decode_words(br, 0);
        let t = Tiles {
            br,
            bc: DECODE_KEYS,
            tpr: groups,
            rpt: 0,
        };
        if t.threads(Kernel::FlashDecode) <= caps.max_invocations_per_workgroup && fixed < words {
            let room = (words - fixed) / (4 * br);
            let chunk = if room >= d4 {
                d4
            } else if q_chunks {
                room / 4 * 4
            } else {
                0
            };
            if chunk > 0 {
                return Ok(Tiles { rpt: chunk, ..t });
            }
        }
        if br == 1 {
            return Err(Error::DeviceLimit {
                what: format!("flash_decode workgroup memory at head_dim {head_dim}"),
                // one row: its q whole or a chunk of 4 vec4s
                needed: decode_words(1, if q_chunks { d4.min(4) } else { d4 }) as u64 * 4,
                limit: caps.max_workgroup_storage_bytes as u64,
                hint: "use a smaller head_dim".into(),
            });
        }
        br /= 2;
    }
}

/// Workgroup memory (f32 words) of the decode kernel for `br` packed rows holding `q_vec4s`
/// of each row's q at once: that q, and of each row its scores (a tile of [`DECODE_KEYS`]) and
/// a factor.
fn decode_words(br: u32, q_vec4s: u32) -> u32 {
    br * q_vec4s * 4 + br * DECODE_KEYS + br
}

/// Words of the rows kernels' `pins` array (the generated prelude, src/kernels/wgsl.rs).
pub const PIN_WORDS: u32 = 4;

/// Workgroup memory (in f32 words) a kernel needs for a tile shape.
pub fn workgroup_words(kernel: Kernel, head_dim: u32, t: Tiles) -> u32 {
    let (br, bc, d) = (t.br, t.bc, head_dim);
    match kernel {
        // rows variants keep their own row in private arrays: only the streamed tiles
        // (head_dim padded to a subgroup multiple: up to 7 more words a row at SG = 8), and
        // the prelude's `pins` (PIN_WORDS) that hand the tile coordinates to every invocation
        Kernel::Flash(Variant::Rows, Pass::Forward) | Kernel::Flash(Variant::Rows, Pass::Dq) => {
            2 * bc * d.next_multiple_of(8) + PIN_WORDS
        }
        Kernel::Flash(Variant::Rows, Pass::DkDv) => {
            2 * br * d.next_multiple_of(8) + 2 * br + PIN_WORDS
        }
        // blocks: rows of RS vec4s (odd), weight tiles of WS vec4s per resident row
        // Q, K, V, P as f16 (rows padded to whole fragments); S, then O_tile, as f32; row
        // partials
        Kernel::Flash(Variant::Coop, Pass::Forward) => {
            let dp = d.next_multiple_of(t.rpt);
            (br * dp + 2 * bc * dp + br * bc).div_ceil(2) + br * bc.max(dp) + br * t.tpr
        }
        // Q, dO, K, V, dS as f16; S and dP, then dQ_tile, as f32
        Kernel::Flash(Variant::Coop, Pass::Dq) => {
            let dp = d.next_multiple_of(t.rpt);
            (2 * br * dp + 2 * bc * dp + br * bc).div_ceil(2) + br * (2 * bc).max(dp)
        }
        // K, V, Q, dO, P^T, dS^T as f16; S^T and dP^T, then dV_tile and dK_tile, as f32;
        // lse and delta of the Q tile
        Kernel::Flash(Variant::Coop, Pass::DkDv) => {
            let dp = d.next_multiple_of(t.rpt);
            (2 * bc * dp + 2 * br * dp + 2 * bc * br).div_ceil(2) + bc * (2 * br).max(dp) + 2 * br
        }
        Kernel::Flash(Variant::Blocks, Pass::Forward)
        | Kernel::Flash(Variant::Blocks, Pass::Dq)
        | Kernel::Flash(Variant::Blocks, Pass::DkDv) => {
            let rs = d.div_ceil(4) | 1;
            let (resident, streamed) = (t.rows(kernel), t.br + t.bc - t.rows(kernel));
            let ws = streamed.div_ceil(4);
            4 * match kernel {
                // Q; K then V; P; plus the row maxima (words)
                Kernel::Flash(Variant::Blocks, Pass::Forward) => {
                    (resident + streamed) * rs + resident * ws
                }
                // Q, dO; K, V; dS
                Kernel::Flash(Variant::Blocks, Pass::Dq) => {
                    2 * (resident + streamed) * rs + resident * ws
                }
                // K, V; Q, dO; P^T, dS^T
                _ => 2 * (resident + streamed) * rs + 2 * resident * ws,
            } + if kernel == Kernel::Flash(Variant::Blocks, Pass::Forward) {
                resident * t.tpr
            } else {
                0
            }
        }
        // q whole or a chunk of `rpt` vec4s a row (bc is DECODE_KEYS)
        Kernel::FlashDecode | Kernel::FlashDecodeOne => decode_words(br, d.div_ceil(4).min(t.rpt)),
        _ => 0,
    }
}

/// The pure tile chooser: the largest tiles (most reuse per byte loaded) that fit the device's
/// workgroup memory and invocation limits. Preference order favours square-ish tiles.
pub fn choose_tiles(kernel: Kernel, head_dim: u32, caps: DeviceCaps) -> Result<Tiles> {
    if kernel.is_decode() {
        return decode_tiles_for(DECODE_MAX_ROWS, head_dim, caps, true);
    }
    if !kernel.is_tiled() {
        // the coop roofline probe: no tiles, the fragment size
        let rpt = if kernel.is_coop() { caps.coop } else { 1 };
        return Ok(Tiles { rpt, ..Tiles::ONE });
    }
    let budget = caps.max_workgroup_storage_bytes / 4;
    let mut smallest_need = u32::MAX;
    for t in tile_candidates(kernel, head_dim, caps)? {
        let words = workgroup_words(kernel, head_dim, t);
        smallest_need = smallest_need.min(words);
        if words <= budget && t.threads(kernel) <= caps.max_invocations_per_workgroup {
            return Ok(t);
        }
    }
    Err(Error::DeviceLimit {
        what: format!(
            "{} with head_dim {head_dim}: workgroup memory",
            kernel.name()
        ),
        needed: smallest_need as u64 * 4,
        limit: caps.max_workgroup_storage_bytes as u64,
        hint: "use a smaller head_dim or an adapter with more workgroup storage".into(),
    })
}

/// The tiles a tiled kernel may take on `caps`, in the chooser's order of preference (the
/// largest first; the coop kernels' by what a KV block issues): [`choose_tiles`] takes the first whose
/// workgroup memory and invocations fit; the compiler-statistics tool compiles them all to see
/// what a driver makes of each.
pub fn tile_candidates(kernel: Kernel, head_dim: u32, caps: DeviceCaps) -> Result<Vec<Tiles>> {
    // (rows per workgroup, streamed rows per tile, rows per thread); the streamed count also
    // sizes each invocation's private score array. Four rows per thread quarter the tile reads
    // per FMA in the forward and dQ kernels (their products are written out with literal
    // indices, src/kernels/rows.rs, so the private arrays stay in registers or whole-vector
    // spills); the private arrays grow with them, so only up to head_dim 128, and fewer where
    // a kernel keeps more per row (`max_rpt` below caps an entry's rows per thread). The dK/dV
    // kernel's 128-key tiles halve the Q/dO tile loads per key. (No two-rows entries:
    // wherever 128 rows at two a thread would fit, 128 x 8 at four does.)
    const ROWS: [(u32, u32, u32); 15] = [
        (128, 32, 4),
        (128, 16, 4),
        (128, 8, 4),
        (128, 32, 1),
        (128, 16, 1),
        (64, 64, 1),
        (64, 32, 1),
        (64, 16, 1),
        (64, 8, 1),
        (32, 8, 1),
        (64, 4, 1),
        (32, 4, 1),
        (16, 4, 1),
        (16, 2, 1),
        (8, 1, 1),
    ];
    // (resident rows, streamed rows per tile, NTX, TM): NT = resident / TM * NTX threads, each
    // with a TM x (streamed / NTX) score block. Largest first; TM = 4 where the output block
    // (TM x 4 GPT floats, GPT = ceil(head_dim / 4 / NTX)) stays within 64 registers.
    const BLOCKS: [(u32, u32, u32, u32); 14] = [
        (64, 64, 16, 4),
        (64, 32, 8, 4),
        (64, 32, 16, 4),
        (32, 32, 8, 4),
        (32, 32, 16, 2),
        (32, 16, 8, 4),
        (16, 16, 8, 2),
        (16, 16, 16, 1),
        (16, 8, 8, 2),
        (8, 8, 8, 1),
        (8, 4, 4, 1),
        (4, 4, 4, 1),
        (4, 2, 2, 1),
        (2, 1, 1, 1),
    ];
    if !kernel.is_tiled() || kernel.is_decode() {
        return Ok(vec![choose_tiles(kernel, head_dim, caps)?]);
    }
    if kernel.is_coop() && caps.coop == 0 {
        return Err(Error::Unsupported {
            feature: format!("{} (cooperative matrices)", kernel.name()),
            backend: crate::Backend::Wgpu,
            reason: "the adapter offers no 16x16x16 or 8x8x8 f16 x f16 + f32 cooperative \
                     matrix configuration with SHADER_F16 and SUBGROUP; use Variant::Blocks"
                .into(),
        });
    }
    let candidates: Vec<Tiles> = if kernel.is_coop() {
        // (resident rows, streamed rows): multiples of the 16x16 blocks (and so of 8x8);
        // COOP_THREADS / resident invocations per row; the fragment size in `rpt`. Ordered by
        // what a block issues (`compiler_stats`, the per-block column: every instruction of
        // one KV block over the workgroup's subgroups; docs/log/compilers.md, "The coop kernels
        // per block"): up to head dim 64, 32 x 32 first, whose block gives 0.37-0.49 of its
        // issue slots to matrix work on ACO (25.0.7 and 26.1, navi31 and gfx1201) against
        // 16 x 16's 0.26-0.36, at 4-6 waves; past 64 the forward's 16 queries x 32 keys (0.35-0.42
        // against 16 x 16's 0.31-0.36, 4-6 waves) and the backward's 16 x 16 (its larger tiles
        // take 35-54 KiB and 2 waves on Mesa 26.1). The others stay for the search. The cost the
        // compilers cannot show: every 16 resident rows read the streamed rows again (from L2
        // on a GPU), which only a GPU run measures.
        let order: &[(u32, u32)] = match kernel {
            _ if head_dim <= 64 => &[(32, 32), (16, 16), (32, 16), (64, 32)],
            Kernel::Flash(_, Pass::Forward) => &[(16, 32), (16, 16), (32, 16), (32, 32), (64, 32)],
            _ => &[(16, 16), (32, 16), (16, 32), (32, 32), (64, 32)],
        };
        order
            .iter()
            .map(|&(resident, streamed)| {
                let (br, bc) = if kernel.rows_are_keys() {
                    (streamed, resident)
                } else {
                    (resident, streamed)
                };
                Tiles {
                    br,
                    bc,
                    tpr: COOP_THREADS / resident,
                    rpt: caps.coop,
                }
            })
            .collect()
    } else if let (false, Kernel::Flash(Variant::Blocks, pass)) =
        (caps.gpu.blocks_tiles().is_empty(), kernel)
    {
        // (dQ under head dim 32 keeps the default: a 16 x 16 dQ tile there has fewer free
        // words than threads for a trainable tensor's fold, `FOLD_WORDS >= NT`, and its
        // default tile already runs well)
        let listed = caps
            .gpu
            .blocks_tiles()
            .iter()
            .filter(|(p, max_d, _)| {
                *p == pass && head_dim <= *max_d && (head_dim >= 32 || *p != Pass::Dq)
            })
            .map(|&(_, _, entry)| blocks_tiles(kernel, entry))
            .take(1);
        let default = tile_candidates(
            kernel,
            head_dim,
            DeviceCaps {
                gpu: GpuClass::Other,
                ..caps
            },
        )?;
        listed.chain(default).collect()
    } else if kernel.is_blocks_variant() {
        // registers for the output blocks: dK/dV keeps two; a third of the private floats
        // (64 of a GPU's 192: the score block, the operands and the addresses take the rest)
        let outputs = if kernel.rows_are_keys() { 2 } else { 1 };
        let budget = caps.private_floats / 3;
        BLOCKS
            .iter()
            .filter(|&&(_, _, ntx, tm)| {
                outputs * tm * 4 * head_dim.div_ceil(4).div_ceil(ntx) <= budget || tm == 1
            })
            .map(|&entry| blocks_tiles(kernel, entry))
            .collect()
    } else if kernel.is_rows_variant() {
        // rows (keys for dK/dV) a thread may own. dK/dV keeps four arrays per key (k, v and
        // two tile sums) and dQ four per row past head_dim 64 (q, dO, the tile sums, the
        // accumulator) where the forward keeps three; at four rows or keys those spill
        // (N=1024: dK/dV at head_dim 64 188 ms with four, 123 with two; dQ at head_dim 128
        // 322-335 ms with four, 262-289 with two)
        let max_rpt = match kernel {
            _ if head_dim > 128 => 1,
            Kernel::Flash(Variant::Rows, Pass::Dq) if head_dim > 64 => 2,
            Kernel::Flash(Variant::Rows, Pass::DkDv) => 2,
            _ => 4,
        };
        ROWS.iter()
            .filter(|&&(_, _, rpt)| rpt == 1 || max_rpt > 1)
            .map(|&(rows, streamed, rpt)| (rows, streamed, rpt.min(max_rpt)))
            .map(|(rows, streamed, rpt)| {
                if kernel.rows_are_keys() {
                    Tiles {
                        br: streamed,
                        bc: rows,
                        tpr: 1,
                        rpt,
                    }
                } else {
                    Tiles {
                        br: rows,
                        bc: streamed,
                        tpr: 1,
                        rpt,
                    }
                }
            })
            .collect()
    } else {
        unreachable!("every tiled kernel is of the rows, blocks or coop family")
    };
    Ok(candidates)
}

/// `dense` (the chooser's tiles) halved until its query rows fit in `block_q` and its keys in
/// `block_kv` (a block mask's block sizes), as far as the kernel's thread layout allows and
/// not below [`MIN_FITTED`], so
/// that a tile lies within one block and is skipped whenever that block is off. Each thread
/// keeps its share (rows per thread, threads per row): only the thread count shrinks.
/// `subgroup` is the rows kernels' shared subgroup size (their workgroups hold whole
/// subgroups). The coop kernels' tiles (whole 16 x 16 blocks over 128 invocations) stay.
pub fn fit_to_blocks(kernel: Kernel, dense: Tiles, blocks: (u32, u32), subgroup: u32) -> Tiles {
    if !kernel.is_tiled() || kernel.is_coop() {
        return dense;
    }
    let allows = |t: Tiles| {
        let resident = t.rows(kernel);
        let streamed = t.br + t.bc - resident;
        if kernel.is_rows_variant() {
            resident.is_multiple_of(t.rpt) && t.threads(kernel).is_multiple_of(subgroup.max(1))
        } else if kernel.is_blocks_variant() {
            resident.is_multiple_of(t.rpt) && streamed.is_multiple_of(t.tpr)
        } else {
            true
        }
    };
    let mut t = dense;
    while t.br > blocks.0 && t.br >= 2 * MIN_FITTED && allows(Tiles { br: t.br / 2, ..t }) {
        t.br /= 2;
    }
    while t.bc > blocks.1 && t.bc >= 2 * MIN_FITTED && allows(Tiles { bc: t.bc / 2, ..t }) {
        t.bc /= 2;
    }
    t
}

/// The fewest rows or keys [`fit_to_blocks`] halves a tile to: below it, each row of K and V
/// a workgroup loads would serve too few queries (and each query too few keys) for the loads
/// to pay, and pair-by-pair masking inside the tile costs less.
pub const MIN_FITTED: u32 = 16;

/// A blocks kernel's tile entry: `(resident, streamed, NTX, TM)` rows ([`GpuClass::blocks_tiles`]).
pub type BlocksEntry = (u32, u32, u32, u32);

/// A blocks kernel's tiles from a `(resident, streamed, NTX, TM)` entry: NT = resident / TM *
/// NTX threads, each with a TM x (streamed / NTX) score block.
fn blocks_tiles(kernel: Kernel, (resident, streamed, ntx, tm): BlocksEntry) -> Tiles {
    let (br, bc) = if kernel.rows_are_keys() {
        (streamed, resident)
    } else {
        (resident, streamed)
    };
    Tiles {
        br,
        bc,
        tpr: ntx,
        rpt: tm,
    }
}

/// Where a variant's kernel for a pass is chosen by whether its tiles fit (here, beside the
/// tile chooser it asks, so that the kernels' catalogue in mod.rs does not import it back).
impl Variant {
    /// The kernel `self` runs for `pass` on
    /// tensors in element format `elem` at `head_dim` on a device with `caps`: a coop kernel
    /// only for f16 in native storage (its operands are f16, so f32 and bf16 values would be
    /// rounded; packed f16 stores are atomics, which naga's SPIR-V for cooperative matrices
    /// scopes to the device without declaring it) and where its tiles fit the workgroup
    /// memory; the blocks kernel of the same pass otherwise.
    pub fn kernel_for(
        self,
        pass: Pass,
        elem: crate::dtype::ElemFormat,
        head_dim: u32,
        caps: DeviceCaps,
    ) -> Kernel {
        let kernel = Kernel::Flash(self, pass);
        if !kernel.is_coop() {
            return kernel;
        }
        let fits = !matches!(
            choose_tiles(kernel, head_dim, caps),
            Err(crate::Error::DeviceLimit { .. })
        );
        if elem == crate::dtype::ElemFormat::F16Native && fits {
            kernel
        } else {
            Kernel::Flash(Variant::Blocks, pass)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_threads_own_four_rows_or_two_keys_up_to_head_dim_128() {
        let caps = DeviceCaps::WEBGPU_DEFAULT;
        let rpt = |kernel, d| choose_tiles(kernel, d, caps).unwrap().rpt;
        assert_eq!(rpt(Kernel::Flash(Variant::Rows, Pass::Forward), 64), 4);
        assert_eq!(rpt(Kernel::Flash(Variant::Rows, Pass::Forward), 128), 4);
        assert_eq!(rpt(Kernel::Flash(Variant::Rows, Pass::Forward), 256), 1);
        assert_eq!(rpt(Kernel::Flash(Variant::Rows, Pass::Dq), 64), 4);
        assert_eq!(rpt(Kernel::Flash(Variant::Rows, Pass::Dq), 128), 2);
        assert_eq!(rpt(Kernel::Flash(Variant::Rows, Pass::DkDv), 64), 2);
        assert_eq!(rpt(Kernel::Flash(Variant::Rows, Pass::DkDv), 128), 2);
        assert_eq!(rpt(Kernel::Flash(Variant::Rows, Pass::DkDv), 256), 1);
        assert_eq!(
            choose_tiles(Kernel::Flash(Variant::Rows, Pass::DkDv), 64, caps)
                .unwrap()
                .bc,
            128
        );
    }

    #[test]
    fn tiles_fit_webgpu_defaults_for_every_head_dim() {
        for kernel in [
            Kernel::Flash(Variant::Rows, Pass::Forward),
            Kernel::Flash(Variant::Rows, Pass::DkDv),
            Kernel::Flash(Variant::Rows, Pass::Dq),
            Kernel::Flash(Variant::Blocks, Pass::Forward),
            Kernel::Flash(Variant::Blocks, Pass::DkDv),
            Kernel::Flash(Variant::Blocks, Pass::Dq),
            Kernel::FlashDecode,
        ] {
            for d in 1..=256u32 {
                let t = choose_tiles(kernel, d, DeviceCaps::WEBGPU_DEFAULT).unwrap();
                assert!(
                    workgroup_words(kernel, d, t) * 4 <= 16384,
                    "{kernel:?} d={d} {t:?}"
                );
                assert!(t.threads(kernel) <= 256);
            }
        }
    }

    #[test]
    fn coop_tiles_are_whole_blocks_of_128_invocations_and_fit_48_kib_at_every_head_dim() {
        let caps = DeviceCaps {
            max_workgroup_storage_bytes: 49152,
            max_invocations_per_workgroup: 1024,
            coop: 16,
            ..DeviceCaps::WEBGPU_DEFAULT
        };
        for d in 1..=256u32 {
            let t = choose_tiles(Kernel::Flash(Variant::Coop, Pass::Forward), d, caps).unwrap();
            assert_eq!((t.br % 16, t.bc % 16), (0, 0), "d={d} {t:?}");
            assert_eq!(
                t.threads(Kernel::Flash(Variant::Coop, Pass::Forward)),
                COOP_THREADS,
                "d={d} {t:?}"
            );
            assert!(
                workgroup_words(Kernel::Flash(Variant::Coop, Pass::Forward), d, t) * 4 <= 49152,
                "d={d} {t:?}"
            );
        }
        // the backward's coop kernels fit up to head_dim 128 (at 256 the blocks kernels run)
        for kernel in [
            Kernel::Flash(Variant::Coop, Pass::DkDv),
            Kernel::Flash(Variant::Coop, Pass::Dq),
        ] {
            for d in 1..=128u32 {
                let t = choose_tiles(kernel, d, caps).unwrap();
                assert_eq!((t.br % 16, t.bc % 16), (0, 0), "{kernel:?} d={d} {t:?}");
                assert_eq!(t.threads(kernel), COOP_THREADS, "{kernel:?} d={d} {t:?}");
                assert!(
                    workgroup_words(kernel, d, t) * 4 <= 49152,
                    "{kernel:?} d={d}"
                );
            }
        }
        // what a block issues picks them (the compilers' statistics): 32 x 32 up to head dim
        // 64 (4 invocations a row); past it 16 queries x 32 keys in the forward, 16 x 16 in the
        // backward (8)
        for (kernel, past_64) in [
            (Kernel::Flash(Variant::Coop, Pass::Forward), (16, 32)),
            (Kernel::Flash(Variant::Coop, Pass::DkDv), (16, 16)),
            (Kernel::Flash(Variant::Coop, Pass::Dq), (16, 16)),
        ] {
            let t = choose_tiles(kernel, 64, caps).unwrap();
            assert_eq!((t.br, t.bc, t.tpr), (32, 32, 4), "{kernel:?}");
            let t = choose_tiles(kernel, 128, caps).unwrap();
            assert_eq!((t.br, t.bc, t.tpr), (past_64.0, past_64.1, 8), "{kernel:?}");
        }
    }

    #[test]
    fn more_workgroup_memory_gives_larger_forward_tiles() {
        let small = choose_tiles(
            Kernel::Flash(Variant::Blocks, Pass::Forward),
            128,
            DeviceCaps::WEBGPU_DEFAULT,
        )
        .unwrap();
        let big = choose_tiles(
            Kernel::Flash(Variant::Blocks, Pass::Forward),
            128,
            DeviceCaps {
                max_workgroup_storage_bytes: 32768,
                max_invocations_per_workgroup: 256,
                coop: 0,
                ..DeviceCaps::WEBGPU_DEFAULT
            },
        )
        .unwrap();
        assert!(
            big.br * big.bc > small.br * small.bc,
            "{small:?} vs {big:?}"
        );
    }

    #[test]
    fn too_little_workgroup_memory_is_a_device_limit_error() {
        let caps = DeviceCaps {
            max_workgroup_storage_bytes: 1024,
            max_invocations_per_workgroup: 256,
            coop: 0,
            ..DeviceCaps::WEBGPU_DEFAULT
        };
        match choose_tiles(Kernel::Flash(Variant::Blocks, Pass::Forward), 256, caps) {
            Err(Error::DeviceLimit { needed, limit, .. }) => {
                assert_eq!(limit, 1024);
                assert!(needed > limit);
            }
            other => panic!("expected DeviceLimit, got {other:?}"),
        }
    }

    #[test]
    fn apple_and_adreno_adapters_take_their_tiles() {
        assert_eq!(
            GpuClass::of(0x106B, "Apple M1 (G13G A0)", (32, 32), false),
            GpuClass::Apple
        );
        assert_eq!(
            GpuClass::of(0, "Apple M2 Pro", (32, 32), false),
            GpuClass::Apple
        );
        assert_eq!(
            GpuClass::of(0x5143, "Turnip Adreno (TM) 730", (64, 128), false),
            GpuClass::Adreno
        );
        assert_eq!(
            GpuClass::of(0x10DE, "NVIDIA H100 80GB HBM3", (32, 32), false),
            GpuClass::Nvidia
        );
        assert_eq!(
            GpuClass::of(0x1002, "AMD Radeon", (64, 64), false),
            GpuClass::Wave64Cu
        );
        assert_eq!(
            GpuClass::of(0x1002, "AMD Radeon", (32, 64), false),
            GpuClass::Other
        );
        assert_eq!(
            GpuClass::of(0x10005, "llvmpipe", (8, 8), true),
            GpuClass::Other
        );
        // the tables' tiles fit the 32 KiB and 1,024 invocations of an M1 and an Adreno 730
        // (NVIDIA's 48 KiB), and are what the chooser takes there
        for gpu in GpuClass::TABLED {
            let caps = DeviceCaps {
                max_workgroup_storage_bytes: match gpu {
                    GpuClass::Nvidia => 49152,
                    _ => 32768,
                },
                max_invocations_per_workgroup: 1024,
                gpu,
                ..DeviceCaps::WEBGPU_DEFAULT
            };
            for &(pass, d, entry) in gpu.blocks_tiles() {
                let kernel = Kernel::Flash(Variant::Blocks, pass);
                let t = choose_tiles(kernel, d, caps).unwrap();
                assert_eq!(t, blocks_tiles(kernel, entry), "{gpu:?} {pass:?} {d}");
            }
        }
    }

    #[test]
    fn invocation_limit_is_respected() {
        let caps = DeviceCaps {
            max_workgroup_storage_bytes: 65536,
            max_invocations_per_workgroup: 64,
            coop: 0,
            ..DeviceCaps::WEBGPU_DEFAULT
        };
        for kernel in [
            Kernel::Flash(Variant::Blocks, Pass::Forward),
            Kernel::Flash(Variant::Rows, Pass::Forward),
        ] {
            let t = choose_tiles(kernel, 64, caps).unwrap();
            assert!(t.threads(kernel) <= 64, "{kernel:?} {t:?}");
        }
    }
}
