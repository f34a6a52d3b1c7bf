#!/usr/bin/env bash
# The public API against its snapshot, docs/public-api.txt (issue 61): a change to what users
# can name (a field, a variant, a signature, an auto trait) fails here until it is made on
# purpose: run `bash scripts/public-api.sh --bless` and say what changed in CHANGELOG.md.
# rustdoc's JSON (RUSTC_BOOTSTRAP: the stable toolchain's rustdoc, which writes it behind an
# unstable flag) of the library with the features docs.rs builds (`cuda`), listed by
# scripts/public-api (the public-api crate). In the suite's target folder, after its `cargo
# doc`, whose checked dependencies it reads: RUSTC_BOOTSTRAP reaches rustdoc alone
# (scripts/rustdoc-unstable.sh as RUSTDOC), so no build script reruns and no build's
# fingerprints move (83 s in a target folder of its own, cold). `cargo doc` over the
# workspace's default members, as the suite's: `cargo rustdoc -p flash-attn-wgpu` would leave
# out the harness's features (harness/Cargo.toml: those of the MPI build) and check every
# dependency again (45 s).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "public-api: $*" >&2; }
out=${CARGO_TARGET_DIR:-target}
RUSTDOC="$PWD/scripts/rustdoc-unstable.sh" RUSTDOCFLAGS="-Z unstable-options --output-format json" \
    cargo doc --quiet --no-deps --features cuda
json="$out/doc/flash_attn_wgpu.json"
format=$(grep -o '"format_version":[0-9]*' "$json" | cut -d: -f2)
if [ "$format" != 57 ]; then
    log "rustdoc wrote JSON format $format; scripts/public-api reads 57 (rustc 1.90-1.95):"
    log "move its public-api pin to the version that reads $format"
    exit 1
fi
cargo build --quiet --release --manifest-path scripts/public-api/Cargo.toml \
    --target-dir "$out/public-api/tool"
now=$(mktemp)
trap 'rm -f "$now"' EXIT
"$out/public-api/tool/release/flash-attn-wgpu-public-api" "$json" >"$now"
if [ "${1:-}" = --bless ]; then
    cp "$now" docs/public-api.txt
    log "docs/public-api.txt written ($(wc -l <"$now") items); say what changed in CHANGELOG.md"
    exit 0
fi
if ! diff -u docs/public-api.txt "$now" >&2; then
    log "the public API differs from docs/public-api.txt (above: - the snapshot, + now)."
    log "If the change is meant, run 'bash scripts/public-api.sh --bless', commit the snapshot"
    log "and say what changed in CHANGELOG.md (a breaking change under Changed)."
    exit 1
fi
log "the public API matches docs/public-api.txt ($(wc -l <"$now") items)"
