//! Every kernel variant the tile chooser can produce: the set the shader-compiler tests
//! (naga here, Tint on Dawn) go through.

use flash_attn_wgpu::dtype::ElemFormat;
use flash_attn_wgpu::kernels::{choose_tiles, flags, DeviceCaps, Kernel, KernelKey, Tiles};

/// Workgroup-memory and invocation limits the chooser is asked about: WebGPU defaults,
/// lavapipe, and a large desktop GPU with cooperative matrices.
pub fn caps_list() -> [DeviceCaps; 3] {
    [
        DeviceCaps::WEBGPU_DEFAULT,
        DeviceCaps {
            max_workgroup_storage_bytes: 32768,
            max_invocations_per_workgroup: 256,
            coop_f16: false,
            private_floats: flash_attn_wgpu::kernels::CPU_PRIVATE_FLOATS,
        },
        DeviceCaps {
            max_workgroup_storage_bytes: 49152,
            max_invocations_per_workgroup: 1024,
            coop_f16: true,
            ..DeviceCaps::WEBGPU_DEFAULT
        },
    ]
}

/// Every (kernel, element format, head_dim, tiles, causal, subgroup) the chooser can pick
/// for the limits above, with a window and as a split call's pass at a few head dims.
pub fn variants() -> Vec<KernelKey> {
    let mut keys = Vec::new();
    for kernel in Kernel::ALL {
        for head_dim in [1u32, 3, 16, 32, 64, 80, 96, 128, 255, 256] {
            // the one-split decode kernel is the split one's source with other result stores
            // (out in the call's format, lse): a partial and a whole head dim cover them
            if kernel == Kernel::FlashDecodeOne && ![3, 128].contains(&head_dim) {
                continue;
            }
            {
                let mut tiles_seen: Vec<Tiles> = Vec::new();
                for caps in caps_list() {
                    // coop kernels exist only where the caps offer cooperative matrices and
                    // their tiles fit (the blocks kernels run otherwise: Variant::kernel_for)
                    let tiles = match choose_tiles(kernel, head_dim, caps) {
                        Err(_) if kernel.is_coop() => continue,
                        t => t.unwrap(),
                    };
                    if !tiles_seen.contains(&tiles) {
                        tiles_seen.push(tiles);
                        for subgroup in [0, 8] {
                            for elem in ElemFormat::ALL {
                                if elem != ElemFormat::F32 && !kernel.has_elem_bindings() {
                                    continue;
                                }
                                // coop kernels take f16 tensors in native storage only
                                if kernel.is_coop()
                                    && kernel.has_elem_bindings()
                                    && elem != ElemFormat::F16Native
                                {
                                    continue;
                                }
                                // a split call's passes: f32 outputs whatever the dtype
                                // (only its output declarations differ, so a few head_dims
                                // cover it)
                                let accumulate_too =
                                    kernel.can_accumulate() && [1, 64, 256].contains(&head_dim);
                                // the compiled modifier bits: the same source, other code
                                // after specialization; a few head_dims cover them
                                let window_too = [1, 64].contains(&head_dim);
                                for accumulate in [false, true] {
                                    if accumulate && !accumulate_too {
                                        continue;
                                    }
                                    for window in [false, true] {
                                        if window && !window_too {
                                            continue;
                                        }
                                        keys.push(KernelKey {
                                            kernel,
                                            elem,
                                            head_dim,
                                            tiles,
                                            // the run-time modifier bits; the compiled ones
                                            // (softcap, dropout, bias) ride with the window's
                                            runtime: kernel.reads_flags() & !flags::COMPILED,
                                            flags: if window {
                                                kernel.reads_flags() & flags::COMPILED
                                            } else {
                                                0
                                            },
                                            // wide K/V reads (the decode kernel) where rows
                                            // start on whole words
                                            wide: match head_dim {
                                                d if window && d % 16 == 0 => 2,
                                                d if window && d % 8 == 0 => 1,
                                                _ => 0,
                                            },
                                            bias_grad: window && kernel.keeps_bias_grads(),
                                            subgroup,
                                            accumulate,
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    keys
}
