#!/usr/bin/env bash
# AMD's shader compiler without an AMD GPU (issue 62): Mesa's no-op DRM shim (Debian's
# mesa-drm-shim, from the backports suite beside mesa-vulkan-drivers) makes RADV open a real
# device of chip CHIP (navi31, gfx1150, renoir, ...) on which submissions do nothing and every
# pipeline is compiled by ACO to real ISA; examples/compiler_stats.rs reads what ACO reports.
#   bash scripts/compiler-stats.sh CHIP [compiler_stats arguments: --check, --all, --json F]
set -euo pipefail
cd "$(dirname "$0")/.."
chip=${1:?usage: compiler-stats.sh CHIP [arguments]}
shift
shim=/usr/lib/x86_64-linux-gnu/libamdgpu_noop_drm_shim.so
icd=/usr/share/vulkan/icd.d/radeon_icd.json
if [ ! -e "$shim" ] || [ ! -e "$icd" ]; then
    echo "compiler-stats: no $shim or $icd: bash scripts/ensure-vulkan.sh installs them" >&2
    exit 1
fi
# the tool as built (COMPILER_STATS_BIN: run-tests.sh builds it with the suite's features),
# else built here
bin=${COMPILER_STATS_BIN:-}
if [ -z "$bin" ]; then
    cargo build --quiet --example compiler_stats
    bin=target/debug/examples/compiler_stats
fi
# the shim answers ioctls it does not model with a line on stderr: filtered out
LD_PRELOAD=$shim AMDGPU_GPU_ID=$chip VK_DRIVER_FILES=$icd RADV_DEBUG=nocache \
    "$bin" --chip "$chip" "$@" 2> >(grep -v -e '^DRM_IOCTL_GET_CAP: unhandled' -e 'is not a recognized processor for this target' >&2)
