//! The pipelines the library plans, enumerated: the list the shader-compiler checks walk
//! (naga to SPIR-V, MSL and HLSL, spirv-val, Tint on Dawn), each distinct source once, and a
//! count a budget bounds, so that a change that multiplies pipelines shows up in a unit test
//! rather than as CI time.
//!
//! The space is the product of kernel, element format, head dim, tile shape (per device),
//! compiled modifier bits, subgroup size, wide K/V reads and accumulate mode. Head dims are
//! any of 1..=256, so the list samples them ([`HEAD_DIMS`]: the tile chooser's and the
//! kernels' boundary cases) and takes the compiled bits all off, and all on at a few head
//! dims (each bit's code is independent of the others'; `tests/gpu` runs them in
//! combination); likewise the accumulate mode of split calls. Element formats and tile shapes
//! are covered whole, subgroup sizes where the kernel reads one.

use super::{
    choose_tiles, flags, DeviceCaps, GpuClass, Kernel, KernelKey, Pass, Tiles, Variant,
    WgslConsumer,
};
use crate::dtype::ElemFormat;
use crate::kv_format::CacheFormat;

/// The head dims the list samples: the smallest, an odd one (partial vec4s), the powers of two
/// the tiles change at, 80 (partial blocks), and the largest.
pub const HEAD_DIMS: [u32; 7] = [1, 3, 32, 64, 80, 128, 256];

/// The samples of the kernels with no tiles (the naive algorithm's and the elementwise ones),
/// whose head dim only bounds a loop or an index: the boundary cases.
pub const ELEMENTWISE_HEAD_DIMS: [u32; 4] = [1, 3, 64, 256];

/// A device the list plans for: its limits, and the fixed subgroup size its adapter reports
/// (0: none), which the rows family and decode read.
#[derive(Debug, Clone, Copy)]
pub struct Device {
    pub caps: DeviceCaps,
    pub subgroup: u32,
}

/// The devices the list plans for: WebGPU's defaults (no fixed subgroup), lavapipe (32 KiB, a
/// CPU driver, subgroup 8; 8x8x8 cooperative matrices since Mesa 26, as Apple GPUs through
/// Metal), and a desktop GPU with 48 KiB, subgroup 32 and 16x16x16 cooperative matrices.
pub fn devices() -> [Device; 3] {
    [
        Device {
            caps: DeviceCaps::WEBGPU_DEFAULT,
            subgroup: 0,
        },
        Device {
            caps: DeviceCaps {
                max_workgroup_storage_bytes: 32768,
                max_invocations_per_workgroup: 256,
                coop: 8,
                private_floats: super::CPU_PRIVATE_FLOATS,
                gpu: GpuClass::Other,
            },
            subgroup: 8,
        },
        Device {
            caps: DeviceCaps {
                max_workgroup_storage_bytes: 49152,
                max_invocations_per_workgroup: 1024,
                coop: 16,
                private_floats: super::GPU_PRIVATE_FLOATS,
                gpu: GpuClass::Other,
            },
            subgroup: 32,
        },
    ]
}

/// At most this many distinct pipelines in [`pipeline_keys`] over [`devices`]: the compiler
/// checks' cost is this count (about 0.1 s each through naga, seconds through Tint on
/// lavapipe). Raise it only with a reason written here. 1,010: the trainable tensor's gradient
/// (issue 52) added two kernels, three pipelines here; the dQ kernels' form that sums a small
/// trainable tensor's gradient itself (`KernelKey::sums_table`) six more (1,009). 1,015: the
/// blocks kernels' tiles on wave64 GPUs (issue 62, `tiles::WAVE64_CU_TILES`), four more.
/// 1,035: the coop family at 8x8x8 (issue 66: lavapipe 26's cooperative matrices, as Apple
/// GPUs' through Metal), 16 more (1,031). 1,040: the decode kernels reading an 8-bit cache in
/// narrow columns (`narrow_cache_decodes`: NVIDIA, Apple and wave64 GCN), 7 more (1,038).
/// 1,045: NVIDIA's blocks tiles (`tiles::NVIDIA_TILES`), 4 more (1,042).
pub const PIPELINE_BUDGET: usize = 1045;

/// Every pipeline the plans can ask for on `devices`, over [`HEAD_DIMS`] and the samples
/// `variants_of` takes, one key per distinct source.
pub fn pipeline_keys(devices: &[Device]) -> Vec<KernelKey> {
    let mut keys: Vec<KernelKey> = Vec::new();
    let mut sources = std::collections::HashSet::new();
    for kernel in Kernel::ALL {
        let head_dims: &[u32] = if !kernel.reads_head_dim() {
            &[1]
        } else if kernel == Kernel::KvQuantize {
            &CACHE_DIMS
        } else if kernel.is_elementwise() || kernel.is_naive() {
            &ELEMENTWISE_HEAD_DIMS
        } else {
            &HEAD_DIMS
        };
        for &head_dim in head_dims {
            for (n, device) in devices.iter().enumerate() {
                // cooperative matrices exist only where the device offers them (the coop
                // roofline probe too: no SPIR-V without the capability)
                if kernel.is_coop() && device.caps.coop == 0 {
                    continue;
                }
                let tiles = match choose_tiles(kernel, head_dim, device.caps) {
                    // coop kernels exist where the device has cooperative matrices and their
                    // tiles fit (the blocks kernels run otherwise: Variant::kernel_for)
                    Err(_) if kernel.is_coop() => continue,
                    Err(e) => panic!("{kernel:?} at head_dim {head_dim}: {e}"),
                    Ok(t) => t,
                };
                let subgroup = if kernel.is_rows_variant() || kernel.is_decode() {
                    device.subgroup
                } else {
                    0
                };
                // the compiled bits and accumulate mode on the last device only: their code
                // does not depend on the tiles
                let extras = n + 1 == devices.len();
                for key in variants_of(kernel, head_dim, tiles, subgroup, extras) {
                    if sources.insert(key.wgsl_for(WgslConsumer::Naga)) {
                        keys.push(key);
                    }
                }
            }
        }
    }
    let extra = value_dim_keys(devices).into_iter().chain(class_keys());
    for key in extra.chain(narrow_cache_decodes(devices)) {
        if sources.insert(key.wgsl_for(WgslConsumer::Naga)) {
            keys.push(key);
        }
    }
    keys
}

/// The blocks kernels' tiles of each GPU class with tiles of its own ([`GpuClass::blocks_tiles`]:
/// AMD's GCN, Vega, CDNA; Apple; Adreno), in f32 with the run-time bits read: the shapes no
/// device above plans, so that the compiler checks see them.
fn class_keys() -> Vec<KernelKey> {
    GpuClass::TABLED
        .iter()
        .flat_map(|&gpu| {
            gpu.blocks_tiles()
                .iter()
                .map(move |&(pass, d, _)| (gpu, pass, d))
        })
        .flat_map(|(gpu, pass, head_dim)| {
            let kernel = Kernel::Flash(Variant::Blocks, pass);
            let caps = DeviceCaps {
                max_workgroup_storage_bytes: 65536,
                max_invocations_per_workgroup: 1024,
                coop: 0,
                private_floats: super::GPU_PRIVATE_FLOATS,
                gpu,
            };
            let tiles = choose_tiles(kernel, head_dim, caps)
                .unwrap_or_else(|e| panic!("{kernel:?} at head_dim {head_dim}: {e}"));
            variants_of(kernel, head_dim, tiles, 0, false)
                .into_iter()
                .filter(|k| k.elem == ElemFormat::F32)
                .take(1)
        })
        .collect()
}

/// The kernels that read values of their own head dim (`AttentionConfig::head_dim_v`: the
/// naive path's, the blocks kernels and the decode kernel, `plan::head_dims`) at
/// [`VALUE_DIMS`] in f32 element reads, on the last device (their code does not depend on
/// the tiles past what the other keys cover); the blocks kernels at DeepSeek's 192/128 in f16
/// on the first (WebGPU's 16 KiB: the tightest tiles); and the decode kernel at MLA's 576/512
/// in f16 with wide reads (no subgroup: 576 dims in columns of 4 vec4s are no multiple of one)
/// on the last: the paths whose code differs in shape where the dims do. (The naive P V and
/// dP kernels and the preprocess differ in a loop bound only, HEAD_DIM_V for HEAD_DIM.)
fn value_dim_keys(devices: &[Device]) -> Vec<KernelKey> {
    let key = |kernel: Kernel, (d, dv): (u32, u32), elem, wide, device: &Device| {
        let tiles = choose_tiles(kernel, d.max(dv), device.caps)
            .unwrap_or_else(|e| panic!("{kernel:?} at head dims {d}/{dv}: {e}"));
        KernelKey {
            elem,
            head_dim_v: dv,
            wide,
            ..variants_of(kernel, d, tiles, 0, false)[0]
        }
    };
    let mut out = Vec::new();
    let (Some(first), Some(last)) = (devices.first(), devices.last()) else {
        return out;
    };
    let blocks = [Pass::Forward, Pass::Dq, Pass::DkDv].map(|p| Kernel::Flash(Variant::Blocks, p));
    let elementwise = [Kernel::NaiveBwdDkDv, Kernel::FlashDecode];
    for kernel in elementwise.into_iter().chain(blocks) {
        out.push(key(kernel, VALUE_DIMS, ElemFormat::F32, 0, last));
    }
    for kernel in blocks {
        out.push(key(kernel, (192, 128), ElemFormat::F16Native, 0, first));
    }
    let mla = (576, 512);
    out.push(key(
        Kernel::FlashDecode,
        mla,
        ElemFormat::F16Native,
        2,
        last,
    ));
    out
}

/// The decode kernels reading an 8-bit cache in narrow columns (half a 16-byte word: the GPUs
/// whose decode takes one-word columns, `GpuClass::decode_max_words`) at [`CACHE_DIMS`], on the
/// last device, in the first element format their cache keys above take: the loads' code
/// differs from the 16-byte columns' in the column's width only.
fn narrow_cache_decodes(devices: &[Device]) -> Vec<KernelKey> {
    let Some(device) = devices.last() else {
        return Vec::new();
    };
    let cw = super::wgsl::cache_column_vec4s(1);
    let mut out = Vec::new();
    for kernel in Kernel::ALL
        .into_iter()
        .filter(|k| k.is_decode() && k.reads_kv_cache())
    {
        for head_dim in CACHE_DIMS {
            let tiles = choose_tiles(kernel, head_dim, device.caps)
                .unwrap_or_else(|e| panic!("{kernel:?} at head_dim {head_dim}: {e}"));
            let sg = cache_decode_subgroup(head_dim, device.subgroup, cw);
            let Some(&key) = variants_of(kernel, head_dim, tiles, sg, false).first() else {
                continue;
            };
            for f in CacheFormat::ALL {
                out.push(KernelKey {
                    kv: Some(f),
                    wide: 1,
                    ..key
                });
            }
        }
    }
    out
}

/// The subgroup a decode kernel reading an 8-bit cache in columns of `cw` vec4s keeps at
/// `head_dim` on an adapter of `subgroup` (`plan::decode::decode_subgroup`'s conditions on
/// the column: every lane a whole number of columns), else 0.
fn cache_decode_subgroup(head_dim: u32, subgroup: u32, cw: u32) -> u32 {
    let fits = subgroup > 1
        && (head_dim.div_ceil(4) / cw).is_multiple_of(subgroup)
        && subgroup.is_multiple_of(cw);
    if fits {
        subgroup
    } else {
        0
    }
}

/// Head dims of q/k and of v at which the list takes the kernels that read values apart.
const VALUE_DIMS: (u32, u32) = (40, 24);

/// Head dims at which the list also takes the compiled bits on (a boundary case and a common
/// size), and the accumulate mode of split calls (which changes only the output
/// declarations: an odd and the largest).
const COMPILED_DIMS: [u32; 2] = [1, 64];
const ACCUMULATE_DIMS: [u32; 2] = [3, 256];
/// Head dims at which the list also takes the lean pipelines of plain and causal calls.
const SPECIALIZED_DIMS: [u32; 2] = [3, 64];
/// The one-split decode kernel is the split one's source with other result stores: a partial
/// and a whole head dim cover it.
const DECODE_ONE_DIMS: [u32; 2] = [3, 128];
/// The head dim at which the list also takes the kernels that read an 8-bit KV cache and the
/// quantizing append (whose head dim bounds loops only).
const CACHE_DIMS: [u32; 1] = [128];

/// The keys of one (kernel, head dim, tiles, subgroup): every element format it reads; the
/// compiled bits on (with the bias gradient's scratch where
/// the kernel keeps it, and the decode kernel's wide reads) at [`COMPILED_DIMS`]; the
/// accumulate mode at [`ACCUMULATE_DIMS`].
fn variants_of(
    kernel: Kernel,
    head_dim: u32,
    tiles: Tiles,
    subgroup: u32,
    extras: bool,
) -> Vec<KernelKey> {
    if kernel == Kernel::FlashDecodeOne && !DECODE_ONE_DIMS.contains(&head_dim) {
        return Vec::new();
    }
    let compiled = kernel.reads_flags() & flags::COMPILED;
    let formats: Vec<ElemFormat> = if kernel.is_coop() && kernel.has_elem_bindings() {
        // coop kernels take f16 tensors in native storage only
        vec![ElemFormat::F16Native]
    } else if kernel.has_elem_bindings() || compiled & flags::BIAS != 0 {
        ElemFormat::ALL.to_vec()
    } else {
        vec![ElemFormat::F32]
    };
    // the pipeline that reads the run-time bits: all of the kernel's code
    let base = |elem, subgroup| KernelKey {
        kernel,
        elem,
        head_dim,
        head_dim_v: 0,
        tiles,
        runtime: kernel.reads_flags() & !flags::COMPILED,
        flags: 0,
        wide: 0,
        keeps_grads: false,
        keeps_scores: false,
        sums_table: false,
        subgroup,
        accumulate: false,
        user_code: None,
        kv: None,
    };
    if kernel == Kernel::KvQuantize {
        // the append exists for each cache format, at head dims of whole blocks
        if !CACHE_DIMS.contains(&head_dim) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for elem in formats {
            for f in CacheFormat::ALL {
                out.push(KernelKey {
                    kv: Some(f),
                    ..base(elem, subgroup)
                });
            }
        }
        return out;
    }
    let mut out = Vec::new();
    let formats_first = formats[0];
    for elem in formats {
        {
            let key = base(elem, subgroup);
            out.push(key);
            // the lean one (plain and causal calls: only the specialized bits read at run
            // time), whose code is the same with constants folded: one format at a few head
            // dims
            if extras && SPECIALIZED_DIMS.contains(&head_dim) && elem == formats_first {
                out.push(KernelKey {
                    runtime: kernel.reads_flags() & flags::SPECIALIZED,
                    ..key
                });
            }
            // summing a trainable tensor's gradient (the stub's `score_mod_dt`)
            if extras
                && SPECIALIZED_DIMS.contains(&head_dim)
                && elem == formats_first
                && kernel.sums_table()
            {
                out.push(KernelKey {
                    sums_table: true,
                    ..key
                });
            }
            if extras && COMPILED_DIMS.contains(&head_dim) && compiled != 0 {
                // rows that start on whole 16-byte words: 8 halves or 4 floats a word
                let per_word = if elem == ElemFormat::F32 { 4 } else { 8 };
                out.push(KernelKey {
                    flags: compiled,
                    keeps_grads: compiled & flags::BIAS != 0 && kernel.keeps_grads(),
                    wide: match kernel.is_decode() {
                        true if head_dim.is_multiple_of(2 * per_word) => 2,
                        true if head_dim.is_multiple_of(per_word) => 1,
                        _ => 0,
                    },
                    ..key
                });
            }
            // reading an 8-bit cache: one element format, a common and the largest head dim
            if extras
                && CACHE_DIMS.contains(&head_dim)
                && elem == formats_first
                && kernel.reads_kv_cache()
            {
                for f in CacheFormat::ALL {
                    // the decode kernel's columns are 16-byte words of 16 bytes (the narrow
                    // columns of some GPUs: `narrow_cache_decodes` below)
                    let cw = super::wgsl::cache_column_vec4s(0);
                    out.push(KernelKey {
                        kv: Some(f),
                        subgroup: if kernel.is_decode() {
                            cache_decode_subgroup(head_dim, subgroup, cw)
                        } else {
                            subgroup
                        },
                        ..key
                    });
                }
            }
            if extras && ACCUMULATE_DIMS.contains(&head_dim) && kernel.can_accumulate() {
                out.push(KernelKey {
                    accumulate: true,
                    ..key
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_enumerated_pipelines_stay_within_the_budget() {
        let keys = pipeline_keys(&devices());
        assert!(
            keys.len() <= PIPELINE_BUDGET,
            "{} distinct pipelines, the budget is {PIPELINE_BUDGET}",
            keys.len()
        );
        // and the list is not trivially small: every kernel is in it
        for kernel in Kernel::ALL {
            assert!(keys.iter().any(|k| k.kernel == kernel), "{kernel:?}");
        }
    }
}
