#!/usr/bin/env bash
# Runs a program built on this machine against the Mesa 26 root of scripts/ensure-mesa26.sh:
# the program is started by the root's own dynamic loader with the root's libraries first
# (glibc 2.41, libvulkan, Mesa 26.1, LLVM 19), and Vulkan sees one driver of the root.
#
#   bash scripts/mesa26.sh PROGRAM [ARGS...]
#   MESA26_DRIVER=lvp|nvidia[:CHIPSET]|apple|qualcomm[:GPU_ID]|amd[:CHIP] (default lvp)
#
# lvp is lavapipe (runs kernels; cooperative matrices 8x8x8). The others are real drivers
# over Mesa's no-op DRM shims: their compilers build pipelines and report statistics, their
# submissions do nothing (compiler statistics only): nvidia NVK, CHIPSET default 0x170
# (GA100; 0x172-0x177 GA10x, 0x164 TU104); apple Honeykrisp (M1); qualcomm Turnip, GPU_ID
# default 730 (630, 660, 740, 750); amd RADV, CHIP default navi31.
#
# Why the root's loader rather than a chroot: no mounts (/proc, /dev, /sys, the checkout and
# target/ bound into the root) and no root rights at run time, and a test runner (nextest, as
# cargo's target runner: scripts/run-tests.sh) on the host starts each test binary through
# this. A program built here runs there unchanged: it needs glibc 2.36 and gets 2.41. The
# program's PROGRAM must be an ELF executable (a script would run under the host's loader).
set -euo pipefail
ROOT=${FLASH_ATTN_MESA26_ROOT:-/var/lib/flash-attn-wgpu/mesa26}
if ! [ -e "$ROOT/.flash-attn-wgpu-mesa26" ]; then
    echo "mesa26: no Mesa 26 root at $ROOT (bash scripts/ensure-mesa26.sh makes it)" >&2
    exit 1
fi
[ $# -ge 1 ] || { echo "usage: bash scripts/mesa26.sh PROGRAM [ARGS...]" >&2; exit 2; }
lib=$ROOT/usr/lib/x86_64-linux-gnu
icds=$ROOT/usr/share/vulkan/icd.d
driver=${MESA26_DRIVER:-lvp}
preload=""
case "$driver" in
    lvp) icd=lvp_icd.json ;;
    nvidia|nvidia:*)
        icd=nouveau_icd.json preload=libnouveau_noop_drm_shim.so
        export NOUVEAU_CHIPSET=${driver#nvidia}; NOUVEAU_CHIPSET=${NOUVEAU_CHIPSET#:}
        NOUVEAU_CHIPSET=${NOUVEAU_CHIPSET:-0x170} ;;
    apple) icd=asahi_icd.json preload=libasahi_noop_drm_shim.so ;;
    qualcomm|qualcomm:*)
        icd=freedreno_icd.json preload=libfreedreno_noop_drm_shim.so
        export FD_GPU_ID=${driver#qualcomm}; FD_GPU_ID=${FD_GPU_ID#:}; FD_GPU_ID=${FD_GPU_ID:-730} ;;
    amd|amd:*)
        icd=radeon_icd.json preload=libamdgpu_noop_drm_shim.so
        export AMDGPU_GPU_ID=${driver#amd}; AMDGPU_GPU_ID=${AMDGPU_GPU_ID#:}
        AMDGPU_GPU_ID=${AMDGPU_GPU_ID:-navi31} ;;
    *) echo "mesa26: MESA26_DRIVER=$driver, expected lvp, nvidia[:CHIPSET], apple, qualcomm[:GPU_ID] or amd[:CHIP]" >&2; exit 2 ;;
esac
# the one driver (an ICD's library_path is a bare name, found on the root's library path)
export VK_DRIVER_FILES=$icds/$icd
# for a program that starts another of ours the same way (tests/dawn.rs: node and Dawn)
export FLASH_ATTN_MESA26_LIB=$lib
unset VK_ICD_FILENAMES VK_ADD_DRIVER_FILES
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" ${preload:+--preload "$lib/$preload"} "$@"
