#!/usr/bin/env bash
# NVRTC for the CUDA path's compile test (tests/cuda_compile.rs), with no CUDA toolkit and no
# GPU: the pinned PyPI wheel of NVRTC (libnvrtc and its builtins library), unpacked into
# .tools/cuda-$CUDA_VERSION/lib. The kernels include no CUDA header (cuda/flash_fwd.cu), so no
# other wheel is needed. The library itself never reads this folder: src/cuda/nvrtc.rs takes
# NVRTC from the loader's path, or from the folder named by FLASH_ATTN_NVRTC_DIR; the tests
# point it here.
#
# Idempotent: fetches nothing that is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "ensure-cuda: $*" >&2; }

CUDA_VERSION=13.0
NVRTC_WHEEL_VERSION=13.0.88
dest=".tools/cuda-$CUDA_VERSION"
stamp="$dest/.wheels"
want="nvrtc $NVRTC_WHEEL_VERSION"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    log "NVRTC $NVRTC_WHEEL_VERSION present in $dest"
    exit 0
fi
log "fetching NVRTC $NVRTC_WHEEL_VERSION (nvidia-cuda-nvrtc wheel) into $dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" \
    "nvidia-cuda-nvrtc==$NVRTC_WHEEL_VERSION"
rm -rf "$dest"
python3 - "$tmp" "$dest" <<'PY'
import glob, os, sys, zipfile
src, dest = sys.argv[1], sys.argv[2]
for wheel in glob.glob(os.path.join(src, "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            # nvidia/cu13/lib/libnvrtc.so.13 -> lib/libnvrtc.so.13
            parts = name.split("/")
            if len(parts) != 4 or parts[0] != "nvidia" or parts[2] != "lib":
                continue
            if ".alt." in parts[-1]:
                continue  # the alternative builds are not needed
            out = os.path.join(dest, *parts[2:])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(z.read(name))
PY
echo "$want" > "$stamp"
ls "$dest/lib" >&2
