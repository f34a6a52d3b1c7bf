#!/usr/bin/env bash
# Mesa 26 beside the machine's own Mesa (issue 66): a minimal Debian trixie root with Mesa 26.1
# from trixie-backports, kept on the machine for reuse, in which `scripts/mesa26.sh` runs the
# project's binaries. What 26.1 has that the machine's 25.0.7 has not: lavapipe with
# cooperative matrices (8x8x8, f16 operands, f16/f32 accumulators: the coop kernels' only CPU
# driver) and LLVM 19 (pipelines compile about 3x faster than 25.0.7's LLVM 15), and no-op DRM
# shims for NVIDIA (NVK/NAK), Apple (Honeykrisp/AGX), Qualcomm (Turnip/ir3) and AMD (RADV/ACO
# 26.1), whose compilers report on our kernels with no such GPU here (docs/log/compilers.md).
#
# The root: `debootstrap --variant=minbase trixie` from the Debian archive this machine's apt
# sources use (scripts/debian-archive.sh; no host name is written here), then
# `apt-get install -t trixie-backports mesa-vulkan-drivers mesa-drm-shim` inside it. About
# 40 s and 12 s on a new machine, 700 MB. Where: $FLASH_ATTN_MESA26_ROOT, default
# /var/lib/flash-attn-wgpu/mesa26.
#
# Idempotent: a complete root (its stamp names the Mesa it holds) is left as it is. Needs root
# (or sudo) for debootstrap and chroot; where that, debootstrap or the archive is missing it
# says what is missing and how to get it, and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${FLASH_ATTN_MESA26_ROOT:-/var/lib/flash-attn-wgpu/mesa26}
STAMP=$ROOT/.flash-attn-wgpu-mesa26
MIN_MESA_MAJOR=26

log() { echo "ensure-mesa26: $*" >&2; }

if [ -e "$STAMP" ] && [ -e "$ROOT/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so" ]; then
    log "Mesa $(cat "$STAMP") in $ROOT: nothing to do"
    exit 0
fi
if [ "$(uname -s)" != Linux ] || [ "$(uname -m)" != x86_64 ]; then
    log "the Mesa 26 root is made for x86_64 Linux only (this is $(uname -s) $(uname -m))"
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { log "debootstrap and chroot need root: run as root or install sudo"; exit 1; }
    SUDO=sudo
fi
if ! command -v debootstrap >/dev/null && ! [ -x /usr/sbin/debootstrap ]; then
    bash scripts/apt-install.sh ensure-mesa26 debootstrap
fi
export PATH=$PATH:/usr/sbin:/sbin
uri=$(bash scripts/debian-archive.sh) || {
    log "no Debian archive in this machine's apt sources: add one (the root is made from it)"
    exit 1
}
start=$SECONDS
tmp=$ROOT.partial
$SUDO rm -rf "$tmp"
$SUDO mkdir -p "$(dirname "$ROOT")"
log "making a trixie root at $ROOT from the configured archive"
$SUDO debootstrap --variant=minbase trixie "$tmp" "$uri" >"$tmp.log" 2>&1 || {
    log "debootstrap failed (last lines of $tmp.log below)"
    tail -n 20 "$tmp.log" >&2
    exit 1
}
# the host's apt options (proxies, validity checks of snapshot archives) hold in the root too
for f in /etc/apt/apt.conf.d/*; do
    [ -f "$f" ] && grep -q '^Acquire::' "$f" && $SUDO cp "$f" "$tmp/etc/apt/apt.conf.d/"
done
echo "deb $uri trixie-backports main" | $SUDO tee "$tmp/etc/apt/sources.list.d/backports.list" >/dev/null
export DEBIAN_FRONTEND=noninteractive
$SUDO chroot "$tmp" apt-get update -qq >>"$tmp.log" 2>&1
$SUDO chroot "$tmp" apt-get install -y -qq --no-install-recommends -t trixie-backports \
    libvulkan1 mesa-vulkan-drivers mesa-drm-shim >>"$tmp.log" 2>&1 || {
    log "installing Mesa in the root failed (last lines of $tmp.log below)"
    tail -n 20 "$tmp.log" >&2
    exit 1
}
version=$($SUDO chroot "$tmp" dpkg-query -W -f='${Version}' mesa-vulkan-drivers)
if [ "${version%%.*}" -lt "$MIN_MESA_MAJOR" ]; then
    log "trixie-backports gave Mesa $version, older than $MIN_MESA_MAJOR"
    exit 1
fi
# the package cache is not needed again (about 100 MB)
$SUDO chroot "$tmp" apt-get clean
echo "$version" | $SUDO tee "$tmp/.flash-attn-wgpu-mesa26" >/dev/null
$SUDO rm -rf "$ROOT"
$SUDO mv "$tmp" "$ROOT"
$SUDO rm -f "$tmp.log"
log "Mesa $version in $ROOT ($((SECONDS - start)) s)"
