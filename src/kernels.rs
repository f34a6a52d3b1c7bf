//! Kernel identities, the pure tile chooser, the parameter block and WGSL assembly.
//!
//! Every pipeline is `prelude + common.wgsl + kernel.wgsl`, where the prelude holds the shape
//! constants that size register and workgroup arrays. Booleans are `override` constants.

use crate::error::{Error, Result};

const COMMON: &str = include_str!("../shaders/common.wgsl");

/// Every compute kernel of the crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    FlashFwd,
    FlashBwdPreprocess,
    FlashBwdDkDv,
    FlashBwdDq,
    FlashFwdRows,
    FlashBwdDkDvRows,
    FlashBwdDqRows,
    NaiveScores,
    NaiveSoftmax,
    NaivePv,
    NaiveBwdProbs,
    NaiveBwdDp,
    NaiveBwdDs,
    NaiveBwdDkDv,
    NaiveBwdDq,
    Canary,
    RooflineFma,
    RooflineCopy,
}

/// How a kernel uses binding slot i+1 (slot 0 is always the `Params` uniform).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
}

use Access::{Read as R, ReadWrite as W};

impl Kernel {
    pub const ALL: [Kernel; 18] = [
        Kernel::FlashFwd,
        Kernel::FlashBwdPreprocess,
        Kernel::FlashBwdDkDv,
        Kernel::FlashBwdDq,
        Kernel::FlashFwdRows,
        Kernel::FlashBwdDkDvRows,
        Kernel::FlashBwdDqRows,
        Kernel::NaiveScores,
        Kernel::NaiveSoftmax,
        Kernel::NaivePv,
        Kernel::NaiveBwdProbs,
        Kernel::NaiveBwdDp,
        Kernel::NaiveBwdDs,
        Kernel::NaiveBwdDkDv,
        Kernel::NaiveBwdDq,
        Kernel::Canary,
        Kernel::RooflineFma,
        Kernel::RooflineCopy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::FlashFwd => "flash_fwd",
            Kernel::FlashBwdPreprocess => "flash_bwd_preprocess",
            Kernel::FlashBwdDkDv => "flash_bwd_dkdv",
            Kernel::FlashBwdDq => "flash_bwd_dq",
            Kernel::FlashFwdRows => "flash_fwd_rows",
            Kernel::FlashBwdDkDvRows => "flash_bwd_dkdv_rows",
            Kernel::FlashBwdDqRows => "flash_bwd_dq_rows",
            Kernel::NaiveScores => "naive_scores",
            Kernel::NaiveSoftmax => "naive_softmax",
            Kernel::NaivePv => "naive_pv",
            Kernel::NaiveBwdProbs => "naive_bwd_probs",
            Kernel::NaiveBwdDp => "naive_bwd_dp",
            Kernel::NaiveBwdDs => "naive_bwd_ds",
            Kernel::NaiveBwdDkDv => "naive_bwd_dkdv",
            Kernel::NaiveBwdDq => "naive_bwd_dq",
            Kernel::Canary => "canary",
            Kernel::RooflineFma => "roofline_fma",
            Kernel::RooflineCopy => "roofline_copy",
        }
    }

    pub fn source(self) -> &'static str {
        match self {
            Kernel::FlashFwd => include_str!("../shaders/flash_fwd.wgsl"),
            Kernel::FlashBwdPreprocess => include_str!("../shaders/flash_bwd_preprocess.wgsl"),
            Kernel::FlashBwdDkDv => include_str!("../shaders/flash_bwd_dkdv.wgsl"),
            Kernel::FlashBwdDq => include_str!("../shaders/flash_bwd_dq.wgsl"),
            Kernel::FlashFwdRows => include_str!("../shaders/flash_fwd_rows.wgsl"),
            Kernel::FlashBwdDkDvRows => include_str!("../shaders/flash_bwd_dkdv_rows.wgsl"),
            Kernel::FlashBwdDqRows => include_str!("../shaders/flash_bwd_dq_rows.wgsl"),
            Kernel::NaiveScores => include_str!("../shaders/naive_scores.wgsl"),
            Kernel::NaiveSoftmax => include_str!("../shaders/naive_softmax.wgsl"),
            Kernel::NaivePv => include_str!("../shaders/naive_pv.wgsl"),
            Kernel::NaiveBwdProbs => include_str!("../shaders/naive_bwd_probs.wgsl"),
            Kernel::NaiveBwdDp => include_str!("../shaders/naive_bwd_dp.wgsl"),
            Kernel::NaiveBwdDs => include_str!("../shaders/naive_bwd_ds.wgsl"),
            Kernel::NaiveBwdDkDv => include_str!("../shaders/naive_bwd_dkdv.wgsl"),
            Kernel::NaiveBwdDq => include_str!("../shaders/naive_bwd_dq.wgsl"),
            Kernel::Canary => include_str!("../shaders/canary.wgsl"),
            Kernel::RooflineFma => include_str!("../shaders/roofline_fma.wgsl"),
            Kernel::RooflineCopy => include_str!("../shaders/roofline_copy.wgsl"),
        }
    }

    /// Storage bindings 1.. in order; must match the shader (checked by naga in tests and by
    /// wgpu at pipeline creation).
    pub fn bindings(self) -> &'static [Access] {
        match self {
            // q, k, v -> out, lse
            Kernel::FlashFwd | Kernel::FlashFwdRows => &[R, R, R, W, W],
            // out, d_out -> delta
            Kernel::FlashBwdPreprocess => &[R, R, W],
            // q, k, v, d_out, lse, delta -> dk, dv  (8 storage buffers: the WebGPU default cap)
            Kernel::FlashBwdDkDv | Kernel::FlashBwdDkDvRows => &[R, R, R, R, R, R, W, W],
            // q, k, v, d_out, lse, delta -> dq
            Kernel::FlashBwdDq | Kernel::FlashBwdDqRows => &[R, R, R, R, R, R, W],
            // q, k -> scores
            Kernel::NaiveScores => &[R, R, W],
            // scores -> probs, lse
            Kernel::NaiveSoftmax => &[R, W, W],
            // probs, v -> out
            Kernel::NaivePv => &[R, R, W],
            // q, k, lse -> probs
            Kernel::NaiveBwdProbs => &[R, R, R, W],
            // d_out, v -> dp
            Kernel::NaiveBwdDp => &[R, R, W],
            // probs, delta, dp -> ds (in place over dp)
            Kernel::NaiveBwdDs => &[R, R, W],
            // probs, ds, q, d_out -> dk, dv
            Kernel::NaiveBwdDkDv => &[R, R, R, R, W, W],
            // ds, k -> dq
            Kernel::NaiveBwdDq => &[R, R, W],
            Kernel::Canary | Kernel::RooflineFma => &[W],
            Kernel::RooflineCopy => &[R, W],
        }
    }

    pub fn is_tiled(self) -> bool {
        matches!(
            self,
            Kernel::FlashFwd
                | Kernel::FlashBwdDkDv
                | Kernel::FlashBwdDq
                | Kernel::FlashFwdRows
                | Kernel::FlashBwdDkDvRows
                | Kernel::FlashBwdDqRows
        )
    }

    /// Kernels whose workgroup rows are keys (BC of them) rather than queries.
    pub fn rows_are_keys(self) -> bool {
        matches!(self, Kernel::FlashBwdDkDv | Kernel::FlashBwdDkDvRows)
    }

    pub fn is_rows_variant(self) -> bool {
        matches!(
            self,
            Kernel::FlashFwdRows | Kernel::FlashBwdDkDvRows | Kernel::FlashBwdDqRows
        )
    }
}

/// How a tiled kernel spreads a row over invocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// TPR invocations share a row; scores pass through workgroup memory. Suits GPUs, whose
    /// lanes exchange data through shared memory cheaply and whose registers are scarce.
    Lanes,
    /// One invocation per row with the row's vectors in private arrays; every invocation reads
    /// the same K/V (or Q/dO) element at once. Suits CPU drivers (lavapipe, SwiftShader, WARP),
    /// where invocations are SIMD lanes and a per-lane workgroup-memory index is a gather.
    Rows,
}

impl Variant {
    /// The variant for an adapter of this device type.
    pub fn for_device_type(device_type: wgpu::DeviceType) -> Variant {
        match device_type {
            wgpu::DeviceType::Cpu => Variant::Rows,
            _ => Variant::Lanes,
        }
    }

    pub fn forward(self) -> Kernel {
        match self {
            Variant::Lanes => Kernel::FlashFwd,
            Variant::Rows => Kernel::FlashFwdRows,
        }
    }

    pub fn backward_dkdv(self) -> Kernel {
        match self {
            Variant::Lanes => Kernel::FlashBwdDkDv,
            Variant::Rows => Kernel::FlashBwdDkDvRows,
        }
    }

    pub fn backward_dq(self) -> Kernel {
        match self {
            Variant::Lanes => Kernel::FlashBwdDq,
            Variant::Rows => Kernel::FlashBwdDqRows,
        }
    }
}

/// Tile shape of a tiled kernel: BR query rows and BC keys per tile; TPR threads per row
/// (lanes variant) or RPT rows per thread (rows variant); the other is 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tiles {
    pub br: u32,
    pub bc: u32,
    pub tpr: u32,
    pub rpt: u32,
}

impl Tiles {
    pub const ONE: Tiles = Tiles { br: 1, bc: 1, tpr: 1, rpt: 1 };

    /// Rows a workgroup owns: queries, or keys for the dK/dV kernels.
    pub fn rows(&self, kernel: Kernel) -> u32 {
        if kernel.rows_are_keys() {
            self.bc
        } else {
            self.br
        }
    }

    /// Threads per workgroup.
    pub fn threads(&self, kernel: Kernel) -> u32 {
        self.rows(kernel) * self.tpr / self.rpt.max(1)
    }
}

/// What the tile chooser needs to know about the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCaps {
    pub max_workgroup_storage_bytes: u32,
    pub max_invocations_per_workgroup: u32,
}

impl DeviceCaps {
    /// The WebGPU defaults every conforming adapter offers.
    pub const WEBGPU_DEFAULT: DeviceCaps = DeviceCaps {
        max_workgroup_storage_bytes: 16384,
        max_invocations_per_workgroup: 256,
    };
}

/// Threads per row: enough lanes that each owns at most ~8 output dims, a power of two <= 16.
fn threads_per_row(head_dim: u32) -> u32 {
    head_dim.div_ceil(8).next_power_of_two().min(16)
}

/// Workgroup memory (in f32 words) a kernel needs for a tile shape.
pub fn workgroup_words(kernel: Kernel, head_dim: u32, t: Tiles) -> u32 {
    let (br, bc, d) = (t.br, t.bc, head_dim);
    match kernel {
        // Q tile, one K/V tile, scores, probabilities, row-sum partials
        Kernel::FlashFwd => br * d + bc * d + 2 * br * bc + br * t.tpr,
        // Q, dO, K, V tiles; P and dS (dK/dV) or dS (dQ) score tiles; lse and delta
        Kernel::FlashBwdDkDv => 2 * br * d + 2 * bc * d + 2 * br * bc + 2 * br,
        Kernel::FlashBwdDq => 2 * br * d + 2 * bc * d + br * bc + 2 * br,
        // rows variants keep their own row in private arrays: only the streamed tiles
        // (head_dim padded to a subgroup multiple: up to 7 more words a row at SG = 8)
        Kernel::FlashFwdRows | Kernel::FlashBwdDqRows => 2 * bc * d.next_multiple_of(8),
        Kernel::FlashBwdDkDvRows => 2 * br * d.next_multiple_of(8) + 2 * br,
        _ => 0,
    }
}

/// The pure tile chooser: the largest tiles (most reuse per byte loaded) that fit the device's
/// workgroup memory and invocation limits. Preference order favours square-ish tiles.
pub fn choose_tiles(kernel: Kernel, head_dim: u32, caps: DeviceCaps) -> Result<Tiles> {
    const LANES: [(u32, u32); 12] = [
        (32, 32),
        (16, 32),
        (32, 16),
        (16, 16),
        (8, 16),
        (16, 8),
        (8, 8),
        (4, 8),
        (8, 4),
        (4, 4),
        (2, 4),
        (1, 4),
    ];
    // (rows per workgroup, streamed rows per tile, rows per thread); the streamed count also
    // sizes each invocation's private score array. Two rows per thread halve the tile reads
    // per FMA in the forward and dQ kernels; the private arrays double, so only up to
    // head_dim 128.
    const ROWS: [(u32, u32, u32); 12] = [
        (128, 32, 2),
        (128, 16, 2),
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
    if !kernel.is_tiled() {
        return Ok(Tiles::ONE);
    }
    let candidates: Vec<Tiles> = if kernel.is_rows_variant() {
        let multi_row = matches!(kernel, Kernel::FlashFwdRows | Kernel::FlashBwdDqRows) && head_dim <= 128;
        ROWS.iter()
            .filter(|&&(_, _, rpt)| rpt == 1 || multi_row)
            .map(|&(rows, streamed, rpt)| {
                if kernel.rows_are_keys() {
                    Tiles { br: streamed, bc: rows, tpr: 1, rpt }
                } else {
                    Tiles { br: rows, bc: streamed, tpr: 1, rpt }
                }
            })
            .collect()
    } else {
        let tpr = threads_per_row(head_dim);
        LANES.iter().map(|&(br, bc)| Tiles { br, bc, tpr, rpt: 1 }).collect()
    };
    let budget = caps.max_workgroup_storage_bytes / 4;
    let mut smallest_need = u32::MAX;
    for t in candidates {
        let words = workgroup_words(kernel, head_dim, t);
        smallest_need = smallest_need.min(words);
        if words <= budget && t.threads(kernel) <= caps.max_invocations_per_workgroup {
            return Ok(t);
        }
    }
    Err(Error::DeviceLimit {
        what: format!("{} with head_dim {head_dim}: workgroup memory", kernel.name()),
        needed: smallest_need as u64 * 4,
        limit: caps.max_workgroup_storage_bytes as u64,
        hint: "use a smaller head_dim or an adapter with more workgroup storage".into(),
    })
}

/// A pipeline's identity: kernel, shape constants and boolean features.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelKey {
    pub kernel: Kernel,
    pub head_dim: u32,
    pub tiles: Tiles,
    pub causal: bool,
    /// Rows kernels: the fixed subgroup size they share tile reads across, or 0 for none.
    pub subgroup: u32,
}

impl KernelKey {
    pub fn label(&self) -> String {
        format!(
            "{} d={} br={} bc={} tpr={} rpt={} causal={} sg={}",
            self.kernel.name(),
            self.head_dim,
            self.tiles.br,
            self.tiles.bc,
            self.tiles.tpr,
            self.tiles.rpt,
            self.causal,
            self.subgroup
        )
    }

    /// Full WGSL source: generated constants, common code, kernel body.
    pub fn wgsl(&self) -> String {
        let t = self.tiles;
        let d = self.head_dim;
        let mut s = String::with_capacity(16 * 1024);
        s.push_str(&format!("// generated: {}\n", self.label()));
        s.push_str(&format!("const HEAD_DIM: u32 = {d}u;\n"));
        s.push_str(&format!("const HEAD_DIM4: u32 = {}u;\n", d.div_ceil(4)));
        if self.kernel.is_tiled() {
            let cols = if self.kernel.rows_are_keys() { t.br } else { t.bc };
            s.push_str(&format!("const BR: u32 = {}u;\n", t.br));
            s.push_str(&format!("const BC: u32 = {}u;\n", t.bc));
            s.push_str(&format!("const TPR: u32 = {}u;\n", t.tpr));
            s.push_str(&format!("const NT: u32 = {}u;\n", t.threads(self.kernel)));
            s.push_str(&format!("const RPT: u32 = {}u;\n", t.rpt.max(1)));
            // output dims per lane, score columns per lane
            s.push_str(&format!("const DPT: u32 = {}u;\n", d.div_ceil(t.tpr)));
            s.push_str(&format!("const CPT: u32 = {}u;\n", cols.div_ceil(t.tpr)));
        }
        if self.kernel.is_rows_variant() {
            s.push_str(&lane_prelude(self.subgroup, d));
        }
        s.push_str(COMMON);
        s.push('\n');
        s.push_str(self.kernel.source());
        s
    }

    /// Pipeline-overridable constants for this key.
    pub fn constants(&self) -> Vec<(&'static str, f64)> {
        vec![("CAUSAL", if self.causal { 1.0 } else { 0.0 })]
    }
}

/// Rows kernels read streamed tiles in chunks of SG elements, one per subgroup lane, and share
/// them with `lane_values`. With no subgroup size to rely on, SG = 1 and `lane_values` is the
/// identity. DPAD is head_dim rounded up to a multiple of SG (the padding holds zeros).
fn lane_prelude(subgroup: u32, head_dim: u32) -> String {
    let sg = subgroup.max(1);
    // subgroupBroadcast needs a literal lane, so the SG calls are written out here.
    let lanes: Vec<String> = if sg > 1 {
        (0..sg).map(|l| format!("subgroupBroadcast(x, {l}u)")).collect()
    } else {
        vec!["x".to_string()]
    };
    format!(
        "const SG: u32 = {sg}u;\nconst DPAD: u32 = {}u;\n\
         // lane l's x, for every l < SG\n\
         fn lane_values(x: f32) -> array<f32, SG> {{\n    return array<f32, SG>({});\n}}\n",
        head_dim.next_multiple_of(sg),
        lanes.join(", ")
    )
}

/// Runtime parameters, bound at slot 0 of every kernel. Mirrors `Params` in common.wgsl.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub batch: u32,
    pub seq_q: u32,
    pub seq_kv: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    pub head_dim: u32,
    pub group: u32,
    pub causal_offset: i32,
    pub scale: f32,
    pub scale_log2: f32,
    pub n_q_tiles: u32,
    pub n_kv_tiles: u32,
    pub total_wg: u32,
    pub slice_base: u32,
    pub slice_count: u32,
    pub total_items: u32,
}

impl Params {
    pub fn from_config(cfg: &crate::AttentionConfig) -> Params {
        let scale = cfg.scale();
        Params {
            batch: cfg.batch as u32,
            seq_q: cfg.seq_q as u32,
            seq_kv: cfg.seq_kv as u32,
            heads_q: cfg.heads_q as u32,
            heads_kv: cfg.heads_kv as u32,
            head_dim: cfg.head_dim as u32,
            group: cfg.group() as u32,
            causal_offset: cfg.causal_offset().clamp(i32::MIN as i64, i32::MAX as i64) as i32,
            scale,
            scale_log2: scale * std::f32::consts::LOG2_E,
            ..Default::default()
        }
    }
}

/// Splits `total` workgroups into an (x, y) grid under the per-dimension limit.
pub fn fold_grid(total: u32, max_dim: u32) -> (u32, u32) {
    if total == 0 {
        return (0, 0);
    }
    let x = total.min(max_dim.max(1));
    (x, total.div_ceil(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_forward_takes_two_rows_per_thread_up_to_head_dim_128() {
        let caps = DeviceCaps::WEBGPU_DEFAULT;
        assert_eq!(choose_tiles(Kernel::FlashFwdRows, 64, caps).unwrap().rpt, 2);
        assert_eq!(choose_tiles(Kernel::FlashFwdRows, 128, caps).unwrap().rpt, 2);
        assert_eq!(choose_tiles(Kernel::FlashFwdRows, 256, caps).unwrap().rpt, 1);
        assert_eq!(choose_tiles(Kernel::FlashBwdDqRows, 64, caps).unwrap().rpt, 2);
        assert_eq!(choose_tiles(Kernel::FlashBwdDkDvRows, 64, caps).unwrap().rpt, 1);
    }

    #[test]
    fn tiles_fit_webgpu_defaults_for_every_head_dim() {
        for kernel in [
            Kernel::FlashFwd,
            Kernel::FlashBwdDkDv,
            Kernel::FlashBwdDq,
            Kernel::FlashFwdRows,
            Kernel::FlashBwdDkDvRows,
            Kernel::FlashBwdDqRows,
        ] {
            for d in 1..=256u32 {
                let t = choose_tiles(kernel, d, DeviceCaps::WEBGPU_DEFAULT).unwrap();
                assert!(workgroup_words(kernel, d, t) * 4 <= 16384, "{kernel:?} d={d} {t:?}");
                assert!(t.threads(kernel) <= 256);
            }
        }
    }

    #[test]
    fn more_workgroup_memory_gives_larger_forward_tiles() {
        let small = choose_tiles(Kernel::FlashFwd, 128, DeviceCaps::WEBGPU_DEFAULT).unwrap();
        let big = choose_tiles(
            Kernel::FlashFwd,
            128,
            DeviceCaps {
                max_workgroup_storage_bytes: 32768,
                max_invocations_per_workgroup: 256,
            },
        )
        .unwrap();
        assert!(big.br * big.bc > small.br * small.bc, "{small:?} vs {big:?}");
    }

    #[test]
    fn head_dim_64_at_16k_gets_16x16_tiles() {
        let t = choose_tiles(Kernel::FlashFwd, 64, DeviceCaps::WEBGPU_DEFAULT).unwrap();
        assert_eq!((t.br, t.bc, t.tpr), (16, 16, 8));
    }

    #[test]
    fn too_little_workgroup_memory_is_a_device_limit_error() {
        let caps = DeviceCaps {
            max_workgroup_storage_bytes: 1024,
            max_invocations_per_workgroup: 256,
        };
        match choose_tiles(Kernel::FlashFwd, 256, caps) {
            Err(Error::DeviceLimit { needed, limit, .. }) => {
                assert_eq!(limit, 1024);
                assert!(needed > limit);
            }
            other => panic!("expected DeviceLimit, got {other:?}"),
        }
    }

    #[test]
    fn invocation_limit_is_respected() {
        let caps = DeviceCaps {
            max_workgroup_storage_bytes: 65536,
            max_invocations_per_workgroup: 64,
        };
        let t = choose_tiles(Kernel::FlashFwd, 64, caps).unwrap();
        assert!(t.threads(Kernel::FlashFwd) <= 64);
    }

    #[test]
    fn threads_per_row_is_a_power_of_two_up_to_16() {
        assert_eq!(threads_per_row(1), 1);
        assert_eq!(threads_per_row(8), 1);
        assert_eq!(threads_per_row(9), 2);
        assert_eq!(threads_per_row(64), 8);
        assert_eq!(threads_per_row(80), 16);
        assert_eq!(threads_per_row(256), 16);
    }

    #[test]
    fn grid_folding_covers_every_workgroup() {
        for total in [1u32, 5, 65535, 65536, 200_000, 4_000_000] {
            let (x, y) = fold_grid(total, 65535);
            assert!(x <= 65535 && y <= 65535);
            assert!(x as u64 * y as u64 >= total as u64);
            assert!((x as u64) * (y as u64 - 1) < total as u64);
        }
    }
}
