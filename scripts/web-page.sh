#!/usr/bin/env bash
# Builds the browser page (examples/web: the wasm module and its JS glue for the web target,
# into examples/web/pkg) and, with --serve, serves it on http://localhost:8000/ (WebGPU needs
# a secure context: localhost is one). Needs scripts/ensure-web.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(sed -n 's/^wasm-bindgen = "=\(.*\)"/\1/p' examples/web/Cargo.toml)
target="$PWD/target/web"
cargo build --quiet --release --target wasm32-unknown-unknown \
    --manifest-path examples/web/Cargo.toml --target-dir "$target"
".tools/wasm-bindgen-$VERSION/bin/wasm-bindgen" --target web --out-dir examples/web/pkg \
    "$target/wasm32-unknown-unknown/release/flash_attn_web_check.wasm"
if [ "${1-}" = --serve ]; then
    echo "serving examples/web on http://localhost:8000/" >&2
    exec python3 -m http.server 8000 --bind 127.0.0.1 --directory examples/web
fi
