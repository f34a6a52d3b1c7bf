#!/usr/bin/env bash
# Builds what scripts/gpu-run.sh runs on a GPU machine that has no Rust, and the Vulkan/EGL
# loader packages that machine lacks:
#
#   $GPU_BIN/bench.xz        the bench example (--info prints the adapter; --decode)
#   $GPU_BIN/cuda_bench.xz   the CUDA path's bench (--features cuda)
#   $GPU_BIN/compiler_stats.xz  what the driver's compiler makes of the planned pipelines
#                            (examples/compiler_stats.rs: registers, spills, occupancy)
#   $GPU_BIN/gpu-tests.xz    the suite that runs on an adapter (tests/gpu, --features cuda;
#                            the CUDA driver and NVRTC are loaded at run time where present)
#   $GPU_BIN/nvrtc.tar.xz    the pinned NVRTC (scripts/ensure-cuda.sh: libnvrtc and its
#                            builtins, 109 MiB) xz'd with the x86 filter (about 33 MiB), for a
#                            device with no NVRTC of its own (gpu-run.sh uses it only then);
#                            made again only when the pin or the options change
#   $GL_DIR/*.deb            libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2
#                            (amd64, fetched with a private package list; kept once fetched)
#
# Release builds (PROFILE=dev: the test suite's debug builds, which the rehearsal in CI uses
# so as not to build everything twice), stripped and xz-compressed (gpu-run.sh unpacks them).
# Fails if the two folders together pass MAX_MIB (48): they travel with the working tree,
# 64 MiB in all. Defaults: GPU_BIN=gpu-bin, GL_DIR=.gl (both ignored by git).
# NVRTC_XZ: the xz options for NVRTC (default "--x86 --lzma2=preset=1": 9 s on two cores for
# 33 MiB; preset 6 took 46 s for 28.6, 2 15 s for 32.0: CI builds it in every fresh clone).
set -euo pipefail
cd "$(dirname "$0")/.."

GPU_BIN=${GPU_BIN:-gpu-bin}
GL_DIR=${GL_DIR:-.gl}
MAX_MIB=${MAX_MIB:-48}
NVRTC_XZ=${NVRTC_XZ:---x86 --lzma2=preset=1}
NVRTC_SRC=.tools/cuda-13.0 # scripts/ensure-cuda.sh's folder
PROFILE=${PROFILE:-release}
case "$PROFILE" in
    release) profile=(--release) ;;
    dev) profile=() ;;
    *) echo "gpu-bundle: PROFILE must be release or dev, got '$PROFILE'" >&2; exit 2 ;;
esac
LOADER_PACKAGES=(libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
log() { echo "gpu-bundle: $*" >&2; }

messages=$(mktemp)
trap 'rm -f "$messages"' EXIT
log "cargo build ($PROFILE): bench, cuda_bench and the gpu test binary (--features cuda)"
cargo build "${profile[@]}" --features cuda --example bench --example cuda_bench \
    --example compiler_stats \
    --message-format=json-render-diagnostics >"$messages"
cargo test "${profile[@]}" --no-run --features cuda --test gpu \
    --message-format=json-render-diagnostics >>"$messages"

# "target":{...,"name":"gpu",...} ... "executable":"/path/gpu-0123456789abcdef"
# (the target object holds no nested braces, so [^}]* stays inside it)
artifacts=$(grep '"reason":"compiler-artifact"' "$messages" |
    sed -n 's/.*"target":{[^}]*"name":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1 \2/p')
mkdir -p "$GPU_BIN"
rm -f "$GPU_BIN"/bench.xz "$GPU_BIN"/cuda_bench.xz "$GPU_BIN"/gpu-tests.xz \
    "$GPU_BIN"/compiler_stats.xz
while read -r name exe; do
    case "$name" in
        bench | cuda_bench | compiler_stats) dest=$name ;;
        gpu) dest=gpu-tests ;;
        *) continue ;;
    esac
    strip -o "$GPU_BIN/$dest" "$exe"
    xz -6 -T2 -f "$GPU_BIN/$dest"
    log "$(printf '%-10s %s' "$dest" "$(du -h "$GPU_BIN/$dest.xz" | cut -f1)")"
done <<<"$artifacts"
for b in bench cuda_bench gpu-tests compiler_stats; do
    [ -f "$GPU_BIN/$b.xz" ] || { log "no $b among cargo's artifacts"; exit 1; }
done

# NVRTC, the fallback for a device without its own: compressed once per pin and options
[ -f "$NVRTC_SRC/.wheels" ] || bash scripts/ensure-cuda.sh
nvrtc_stamp="$(cat "$NVRTC_SRC/.wheels"), xz $NVRTC_XZ"
if [ ! -f "$GPU_BIN/nvrtc.tar.xz" ] || [ "$(cat "$GPU_BIN/nvrtc.stamp" 2>/dev/null)" != "$nvrtc_stamp" ]; then
    log "NVRTC: $NVRTC_SRC/lib -> $GPU_BIN/nvrtc.tar.xz (xz $NVRTC_XZ)"
    rm -f "$GPU_BIN/nvrtc.tar.xz" "$GPU_BIN/nvrtc.stamp"
    # shellcheck disable=SC2086 # the options are words
    tar -C "$NVRTC_SRC/lib" -cf - . | xz -T2 $NVRTC_XZ >"$GPU_BIN/nvrtc.tar.xz.tmp"
    mv "$GPU_BIN/nvrtc.tar.xz.tmp" "$GPU_BIN/nvrtc.tar.xz"
    echo "$nvrtc_stamp" >"$GPU_BIN/nvrtc.stamp"
fi
log "$(printf '%-10s %s' nvrtc "$(du -h "$GPU_BIN/nvrtc.tar.xz" | cut -f1)")"

# the loader packages, for amd64 whatever this machine is, from a private package list
mkdir -p "$GL_DIR"
missing=()
for p in "${LOADER_PACKAGES[@]}"; do
    ls "$GL_DIR/${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get download ${missing[*]} (amd64) into $GL_DIR"
    lists=$(mktemp -d)
    mkdir -p "$lists/partial"
    opts=(-o APT::Architecture=amd64 -o APT::Architectures=amd64 -o "Dir::State::Lists=$lists"
        -o APT::Sandbox::User=root)
    apt-get "${opts[@]}" -qq update >&2
    (cd "$GL_DIR" && apt-get "${opts[@]}" -qq download "${missing[@]}" >&2)
    rm -rf "$lists"
fi

kib=$(du -skc "$GPU_BIN" "$GL_DIR" | tail -n 1 | cut -f1)
log "bundle: $GPU_BIN and $GL_DIR, $((kib / 1024)) MiB ($kib KiB)"
if [ "$kib" -gt $((MAX_MIB * 1024)) ]; then
    log "larger than $MAX_MIB MiB"
    exit 1
fi
