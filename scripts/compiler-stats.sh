#!/usr/bin/env bash
# A GPU vendor's shader compiler without its GPU (issues 62 and 66): Mesa's no-op DRM shims make
# a real Vulkan driver open a device of the chip we name, on which submissions do nothing and
# every pipeline is compiled by the vendor's production compiler to real ISA;
# examples/compiler_stats.rs reads what that compiler reports (docs/log/compilers.md).
#
#   bash scripts/compiler-stats.sh CHIP [compiler_stats arguments: --check, --all, --json F]
#
# CHIP is
#   navi31, gfx1150, renoir, ...   AMD (RADV/ACO) on this machine's Mesa 25.0.7 (Debian's
#                                  mesa-drm-shim, bash scripts/ensure-vulkan.sh)
#   amd26:CHIP                     AMD (RADV/ACO) on Mesa 26.1 (amd26:navi31, amd26:gfx1201,
#                                  amd26:vega20, ...)
#   ga100, ga102, ..., tu104       NVIDIA (NVK/NAK) on Mesa 26.1: ga100 is 0x170, ga102-ga107
#   nvidia:0xNNN                   0x172-0x177, tu104 0x164; or a chipset by number
#   m1, apple                      Apple M1 (Honeykrisp/AGX) on Mesa 26.1
#   a630, a660, a730, a740, a750   Qualcomm Adreno (Turnip/ir3) on Mesa 26.1
#   qualcomm:GPU_ID                (or by GPU id)
# The Mesa 26.1 chips run in the root of scripts/ensure-mesa26.sh, through scripts/mesa26.sh
# (MESA26_DRIVER picks the driver and its shim).
set -euo pipefail
cd "$(dirname "$0")/.."
chip=${1:?usage: compiler-stats.sh CHIP [arguments] (the chips: the header of this script)}
shift
# the Mesa 26.1 driver for CHIP (MESA26_DRIVER of scripts/mesa26.sh), empty for Mesa 25.0.7
driver=
case "$chip" in
    amd26:*) driver=amd:${chip#amd26:} ;;
    ga100) driver=nvidia:0x170 ;;
    ga102) driver=nvidia:0x172 ;;
    ga103) driver=nvidia:0x173 ;;
    ga104) driver=nvidia:0x174 ;;
    ga106) driver=nvidia:0x176 ;;
    ga107) driver=nvidia:0x177 ;;
    tu104) driver=nvidia:0x164 ;;
    nvidia:*) driver=$chip ;;
    m1 | apple) driver=apple ;;
    a[0-9][0-9][0-9]) driver=qualcomm:${chip#a} ;;
    qualcomm:*) driver=$chip ;;
esac
# the tool as built (COMPILER_STATS_BIN: run-tests.sh builds it with the suite's features),
# else built here
bin=${COMPILER_STATS_BIN:-}
build() {
    if [ -z "$bin" ]; then
        cargo build --quiet --example compiler_stats
        bin=${CARGO_TARGET_DIR:-target}/debug/examples/compiler_stats
    fi
}
# (no shader cache: a cached pipeline may come back without its statistics)
# the shims answer ioctls they do not model with a line on stderr: filtered out
noise=(-e '^DRM_IOCTL_GET_CAP: unhandled' -e 'is not a recognized processor for this target'
    -e '^Unknown DRM_IOCTL_MSM_GET_PARAM' -e '^WARNING: radv is not a conformant Vulkan')
if [ -n "$driver" ]; then
    root=${FLASH_ATTN_MESA26_ROOT:-/var/lib/flash-attn-wgpu/mesa26}
    if ! [ -e "$root/.flash-attn-wgpu-mesa26" ]; then
        echo "compiler-stats: $chip is compiled by Mesa 26.1, and there is no Mesa 26 root at" \
            "$root: bash scripts/ensure-mesa26.sh makes it" >&2
        exit 1
    fi
    build
    MESA26_DRIVER=$driver RADV_DEBUG=nocache MESA_SHADER_CACHE_DISABLE=true bash scripts/mesa26.sh "$bin" --chip "$chip" "$@" \
        2> >(grep -v "${noise[@]}" >&2)
else
    shim=/usr/lib/x86_64-linux-gnu/libamdgpu_noop_drm_shim.so
    icd=/usr/share/vulkan/icd.d/radeon_icd.json
    if [ ! -e "$shim" ] || [ ! -e "$icd" ]; then
        echo "compiler-stats: no $shim or $icd: bash scripts/ensure-vulkan.sh installs them" >&2
        exit 1
    fi
    build
    LD_PRELOAD=$shim AMDGPU_GPU_ID=$chip VK_DRIVER_FILES=$icd RADV_DEBUG=nocache \
        "$bin" --chip "$chip" "$@" 2> >(grep -v "${noise[@]}" >&2)
fi
