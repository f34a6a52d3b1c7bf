#!/usr/bin/env bash
# The crate on the web, in CI: builds examples/web for wasm32-unknown-unknown once, then
#  1. wasm-bindgen's nodejs glue, run under Node.js on Dawn (dawn/wasm-check.mjs): Dawn's
#     `webgpu` package is navigator.gpu, on this machine's Vulkan;
#  2. wasm-bindgen's web glue, the page examples/web/index.html served on localhost and opened
#     in headless Chromium with WebGPU (dawn/browser-check.mjs), screenshot in target/web.
# Each runs forward and backward in f32 and f16 (causal GQA, odd sizes) against the f64
# reference inside the wasm module and fails on a mismatch. Needs ensure-vulkan.sh,
# ensure-portability.sh (Node.js, Dawn, playwright-core) and ensure-web.sh (target, CLI,
# Chromium). Arguments: an optional seed (default: random, printed).
set -euo pipefail
cd "$(dirname "$0")/.."
# as in run-tests.sh: lavapipe compiles pipelines without LLVM's optimization passes
export GALLIVM_PERF=${GALLIVM_PERF-nopt}
VERSION=$(sed -n 's/^wasm-bindgen = "=\(.*\)"/\1/p' examples/web/Cargo.toml)
bindgen=".tools/wasm-bindgen-$VERSION/bin/wasm-bindgen"
target="$PWD/target/web"
cargo build --quiet --release --target wasm32-unknown-unknown \
    --manifest-path examples/web/Cargo.toml --target-dir "$target"
wasm="$target/wasm32-unknown-unknown/release/flash_attn_web_check.wasm"
seed=${1-$RANDOM$RANDOM}

echo "web-check: Node.js + Dawn" >&2
"$bindgen" --target nodejs --out-dir "$target/pkg-node" "$wasm"
node dawn/wasm-check.mjs "$target/pkg-node" "$seed"

echo "web-check: the page in headless Chromium" >&2
"$bindgen" --target web --out-dir examples/web/pkg "$wasm"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server "$port" --bind 127.0.0.1 --directory examples/web >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/')" 2>/dev/null && break
    sleep 0.2
done
node dawn/browser-check.mjs "http://localhost:$port/?seed=$seed" "$target/page.png"
