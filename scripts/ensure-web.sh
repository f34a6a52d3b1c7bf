#!/usr/bin/env bash
# Tools of the wasm check (scripts/web-check.sh): the wasm32-unknown-unknown target (rustup)
# and the wasm-bindgen CLI at exactly the version of the wasm-bindgen crate that
# examples/web pins (the CLI writes the JS glue and refuses another version's modules),
# built from crates.io into .tools/. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "ensure-web: $*" >&2; }
VERSION=$(sed -n 's/^wasm-bindgen = "=\(.*\)"/\1/p' examples/web/Cargo.toml)
dir=".tools/wasm-bindgen-$VERSION"
if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    log "adding the wasm32-unknown-unknown target"
    rustup target add wasm32-unknown-unknown >&2
fi
if [ -x "$dir/bin/wasm-bindgen" ]; then
    log "wasm-bindgen $VERSION present in $dir"
else
    log "building wasm-bindgen-cli $VERSION into $dir (a few minutes)"
    # not --locked: its lockfile names a webpki-roots the registry here does not offer
    # only the wasm-bindgen binary, without TLS (its test runner downloads browsers; not here).
    # Unoptimized and without debug info: 52 s to build against 165 s optimized on 2 cores, and
    # it writes the same glue and module, in 0.6 s a run against 0.1 s (docs/PERFORMANCE.md,
    # "CI time: the README command at 22, then 20 minutes").
    CARGO_PROFILE_DEV_DEBUG=0 cargo install --quiet wasm-bindgen-cli --version "$VERSION" \
        --root "$dir" --no-default-features --bin wasm-bindgen --debug >&2
fi
# Chromium for the page (headless, WebGPU on SwiftShader or Vulkan), from the distribution
command -v chromium >/dev/null || bash scripts/apt-install.sh ensure-web chromium
