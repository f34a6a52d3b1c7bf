//! The adapter's own ceilings, measured with probe shaders: f32 and f16 FMA throughput and
//! global-memory copy bandwidth. Speed claims are held against these, not against a data sheet.

use crate::device::Context;
use crate::error::Result;
use crate::kernels::{choose_tiles, Kernel, KernelKey, Params};
use crate::record::Dispatch;

/// Measured ceilings of one adapter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Roofline {
    /// f32 FMA throughput, GFLOP/s (an FMA counts as 2 FLOPs).
    pub fma_gflops: f64,
    /// f16 FMA throughput, GFLOP/s, where the adapter has SHADER_F16.
    pub fma_f16_gflops: Option<f64>,
    /// Cooperative-matrix multiply-add throughput (16x16x16, f16 x f16 + f32), GFLOP/s, where
    /// the coop variant is available (`AdapterSummary::cooperative_matrices`).
    pub coop_f16_gflops: Option<f64>,
    /// Global-memory copy bandwidth, GB/s (read + write bytes).
    pub copy_gbps: f64,
}

impl Roofline {
    /// The time floor of a kernel that does `flops` and moves `bytes`: the larger of
    /// FLOPs over peak and bytes over bandwidth, in seconds.
    pub fn floor_seconds(&self, flops: f64, bytes: f64) -> f64 {
        (flops / (self.fma_gflops * 1e9)).max(bytes / (self.copy_gbps * 1e9))
    }
}

impl Context {
    /// Measures the FMA and copy ceilings. `scale` sizes the probes (1.0 runs a few hundred
    /// milliseconds on a software driver; use more on a fast GPU). Reports the best of 3.
    pub fn measure_roofline(&self, scale: f64) -> Result<Roofline> {
        let workgroups = 64u32;
        let iterations = ((2000.0 * scale) as u32).max(16);
        let sink = self.create_storage(workgroups as u64 * 256 * 4, "roofline sink")?;
        let flops = workgroups as f64 * 256.0 * iterations as f64 * 64.0;
        let fma_probe = |kernel| -> Result<f64> {
            let mut best = f64::INFINITY;
            for _ in 0..4 {
                self.run_timed(
                    &[Dispatch {
                        windows: Vec::new(),
                        key: KernelKey::plain(kernel),
                        params: Params {
                            total_items: iterations,
                            ..Default::default()
                        },
                        buffers: vec![&sink.buffer],
                        workgroups,
                    }],
                    true,
                )?;
                best = best.min(self.last_gpu_timing().map_or(f64::INFINITY, |t| t.seconds));
            }
            Ok(flops / best / 1e9)
        };
        let fma_gflops = fma_probe(Kernel::RooflineFma)?;
        let fma_f16_gflops = if self.info.shader_f16 {
            Some(fma_probe(Kernel::RooflineFmaF16)?)
        } else {
            None
        };

        let coop_f16_gflops = if self.caps.coop != 0 {
            Some(self.coop_probe(scale)?)
        } else {
            None
        };

        let vec4s = ((4u64 << 20) as f64 * scale).max(4096.0) as u64;
        let bytes = (vec4s * 16).min(self.limits.max_storage_buffer_binding_size / 2 / 16 * 16);
        let vec4s = bytes / 16;
        let src = self.create_storage(bytes, "roofline src")?;
        let dst = self.create_storage(bytes, "roofline dst")?;
        let mut copy_best = f64::INFINITY;
        for _ in 0..4 {
            self.run_timed(
                &[Dispatch {
                    windows: Vec::new(),
                    key: KernelKey::plain(Kernel::RooflineCopy),
                    params: Params {
                        total_items: vec4s as u32,
                        ..Default::default()
                    },
                    buffers: vec![&src.buffer, &dst.buffer],
                    workgroups: 256,
                }],
                true,
            )?;
            copy_best = copy_best.min(self.last_gpu_timing().map_or(f64::INFINITY, |t| t.seconds));
        }
        Ok(Roofline {
            fma_gflops,
            fma_f16_gflops,
            coop_f16_gflops,
            copy_gbps: 2.0 * bytes as f64 / copy_best / 1e9,
        })
    }

    /// The cooperative-matrix probe (shaders/roofline_coop.wgsl): best of 4, FLOPs counted
    /// from the subgroups per workgroup the shader reports.
    fn coop_probe(&self, scale: f64) -> Result<f64> {
        let workgroups = 256u32;
        let iterations = ((4000.0 * scale) as u32).max(16);
        let sink = self.create_storage((1 + workgroups as u64 * 128) * 4, "coop probe sink")?;
        // the adapter's fragment size (8 or 16): a coop kernel's tiles carry it
        let frag = self.caps.coop;
        let key = KernelKey {
            tiles: choose_tiles(Kernel::RooflineCoop, 1, self.caps)?,
            ..KernelKey::plain(Kernel::RooflineCoop)
        };
        let mut best = f64::INFINITY;
        for _ in 0..4 {
            self.run_timed(
                &[Dispatch {
                    windows: Vec::new(),
                    key,
                    params: Params {
                        total_items: iterations,
                        ..Default::default()
                    },
                    buffers: vec![&sink.buffer],
                    workgroups,
                }],
                true,
            )?;
            best = best.min(self.last_gpu_timing().map_or(f64::INFINITY, |t| t.seconds));
        }
        let subgroups: Vec<f32> = self.read_buffer(&sink.buffer, 1)?;
        let flops = workgroups as f64
            * subgroups[0] as f64
            * iterations as f64
            * 4.0
            * 2.0
            * (frag as f64).powi(3);
        Ok(flops / best / 1e9)
    }
}
