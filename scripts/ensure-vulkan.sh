#!/usr/bin/env bash
# Make sure a Vulkan device that runs our shaders correctly is available.
#
# - If a Vulkan driver other than Mesa's lavapipe is present (a real GPU), do nothing.
# - If lavapipe from Mesa >= 25 is present, do nothing.
# - Otherwise (no driver, or Mesa older than 25, whose lavapipe silently stops every
#   shader loop after ~65,535 iterations) install libvulkan1 and mesa-vulkan-drivers
#   from Debian's bookworm-backports suite. The archive URI is taken from the apt
#   sources already configured on this machine; no host name is written here.
#
# Idempotent: running it twice installs nothing the second time.
set -euo pipefail

MIN_MESA_MAJOR=25

log() { echo "ensure-vulkan: $*" >&2; }

mesa_major() {
    local v
    v=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
    [ -n "$v" ] || { echo 0; return; }
    v=${v#*:}          # drop an epoch
    echo "${v%%.*}"
}

have_loader() { ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; }

# Mesa's no-op DRM shim (mesa-drm-shim): RADV on it opens a real AMD device whose pipelines ACO
# compiles to real ISA while submissions do nothing, so AMD's compiler reports on our kernels
# without an AMD GPU (scripts/compiler-stats.sh, issue 62). Installed beside Mesa's drivers.
have_shim() { dpkg-query -W -f='${Status}' mesa-drm-shim 2>/dev/null | grep -q 'ok installed'; }

# A non-Mesa ICD (NVIDIA, AMD pro, ...) means a real GPU driver: leave the machine alone.
have_vendor_icd() {
    local f
    for f in /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json; do
        [ -e "$f" ] || continue
        case "$(basename "$f")" in
            lvp_icd*|radeon_icd*|intel_icd*|intel_hasvk_icd*|nouveau_icd*|virtio_icd*|broadcom_icd*|freedreno_icd*|panfrost_icd*|powervr_mesa_icd*|asahi_icd*|gfxstream_vk_icd*|dzn_icd*) ;;
            *) return 0 ;;
        esac
    done
    return 1
}

if [ "$(uname -s)" != Linux ]; then
    log "not Linux: nothing to do (use your platform's GPU driver)"
    exit 0
fi

if have_loader && have_vendor_icd; then
    log "vendor Vulkan driver present: nothing to do"
    exit 0
fi

if have_loader && [ "$(mesa_major)" -ge "$MIN_MESA_MAJOR" ] && have_shim; then
    log "Mesa $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers) present: nothing to do"
    exit 0
fi

command -v apt-get >/dev/null || { log "no apt-get: install libvulkan1 and Mesa >= $MIN_MESA_MAJOR lavapipe by hand"; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$codename" ] || { log "cannot tell the Debian release"; exit 1; }
backports="${codename}-backports"

# Is the backports suite already configured?
if ! grep -rqsE "^[^#]*\b${backports}\b" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    uri=$(bash "$(dirname "$0")/debian-archive.sh" "$codename")
    log "enabling ${backports} from the configured archive"
    echo "deb ${uri} ${backports} main" | $SUDO tee /etc/apt/sources.list.d/flash-attn-wgpu-backports.list >/dev/null
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq -t "$backports" libvulkan1 mesa-vulkan-drivers mesa-drm-shim >/dev/null
log "installed mesa-vulkan-drivers and mesa-drm-shim $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers)"

if [ "$(mesa_major)" -lt "$MIN_MESA_MAJOR" ]; then
    log "Mesa is still older than ${MIN_MESA_MAJOR}; lavapipe would corrupt long loops"
    exit 1
fi
