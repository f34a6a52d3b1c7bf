#!/usr/bin/env bash
# Builds (release) everything scripts/gpu-check.sh runs and copies it, stripped, into one
# folder that can be carried to a GPU machine that has no Rust:
#
#   $GPU_BIN/examples/bench          the bench example (also prints the adapter: --info)
#   $GPU_BIN/examples/cuda_bench     the CUDA path's bench (built with --features cuda)
#   $GPU_BIN/deps/<test>-<hash>      the test executables of tests/{dtypes,variants,forward,backward,nonfinite,split,errors,backends}.rs
#                                    (whichever exist in this checkout), built with --features cuda
#                                    (the CUDA driver and NVRTC are loaded at run time, if present)
#
# GPU_BIN defaults to gpu-bin (in the repository root). Uses cargo's usual CARGO_TARGET_DIR.
# Fails if the folder ends up larger than 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."

GPU_BIN=${GPU_BIN:-gpu-bin}
MAX_MIB=60
TESTS=(dtypes variants forward backward nonfinite split errors backends)

log() { echo "gpu-check-build: $*" >&2; }

test_args=()
for t in "${TESTS[@]}"; do
    if [ -f "tests/$t.rs" ]; then
        test_args+=(--test "$t")
    else
        log "tests/$t.rs not in this checkout: skipped"
    fi
done

messages=$(mktemp)
trap 'rm -f "$messages"' EXIT

log "cargo build --release --example bench; --features cuda --example cuda_bench"
cargo build --release --example bench --message-format=json-render-diagnostics >"$messages"
cargo build --release --features cuda --example cuda_bench --message-format=json-render-diagnostics >>"$messages"
if [ ${#test_args[@]} -gt 0 ]; then
    log "cargo test --release --no-run --features cuda ${test_args[*]}"
    cargo test --release --no-run --features cuda "${test_args[@]}" --message-format=json-render-diagnostics >>"$messages"
fi

# "target":{...,"name":"forward",...} ... "executable":"/path/forward-0123456789abcdef"
# (the target object holds no nested braces, so [^}]* stays inside it)
artifacts=$(grep '"reason":"compiler-artifact"' "$messages" |
    sed -n 's/.*"target":{[^}]*"kind":\["\([a-z]*\)"\][^}]*"name":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1 \2 \3/p')

rm -rf "$GPU_BIN/deps" "$GPU_BIN/examples"
mkdir -p "$GPU_BIN/deps" "$GPU_BIN/examples"
copied=0
while read -r kind name exe; do
    [ -n "$exe" ] || continue
    case "$kind" in
        example) dest="$GPU_BIN/examples/$name" ;;
        test) dest="$GPU_BIN/deps/$(basename "$exe")" ;;
        *) continue ;;
    esac
    cp "$exe" "$dest"
    strip "$dest"
    copied=$((copied + 1))
    log "$(printf '%-9s %-10s %s' "$kind" "$name" "$(du -h "$dest" | cut -f1)")"
done <<<"$artifacts"

[ -x "$GPU_BIN/examples/bench" ] || { log "no bench executable among cargo's artifacts"; exit 1; }
[ "$copied" -ge 2 ] || { log "no test executables among cargo's artifacts"; exit 1; }

kib=$(du -sk "$GPU_BIN" | cut -f1)
log "$copied binaries in $GPU_BIN: $((kib / 1024)) MiB ($kib KiB) in total"
if [ "$kib" -gt $((MAX_MIB * 1024)) ]; then
    log "larger than $MAX_MIB MiB"
    exit 1
fi
