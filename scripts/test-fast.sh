#!/usr/bin/env bash
# The fast tier, for a contributor between commits: the unit tests, the shader and layer
# checks (no GPU), and on the adapter the backends suite (every modifier on and off, alone and
# together, each case forward and backward against the f64 reference, the dtypes f32, f16 and
# bf16 in rotation, on the adapter's default kernel family) and the property test that draws
# every score modifier on or off in random combinations. About 5 minutes after the build from
# a cold shader cache on 2 cores (docs/TESTING.md); the full tier is scripts/run-tests.sh.
# Fails past its pipeline budget (FAST_BUDGET distinct pipelines: scripts/pipeline-count.sh).
# Arguments go to cargo (e.g. --features cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
export GALLIVM_PERF=${GALLIVM_PERF-nopt}
# the wgpu halves of tests/gpu/backends.rs must run here (tests/common/mod.rs: they skip only
# where wgpu has no adapter and this is unset, so that an NVIDIA machine runs the CUDA half)
export FLASH_ATTN_REQUIRE_WGPU=1
FAST_BUDGET=${FAST_BUDGET:-120}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
export FLASH_ATTN_PIPELINE_LOG=$log
. scripts/mesa26-env.sh
if cargo nextest --version >/dev/null 2>&1; then
    env "${MESA26_ENV[@]}" cargo nextest run --no-fail-fast "$@" -E \
        'kind(lib) | binary(layers) | binary(shaders) | (binary(gpu) & test(/^(backends|combinations)::/))'
else
    env "${MESA26_ENV[@]}" cargo test "$@" --lib
    env "${MESA26_ENV[@]}" cargo test "$@" --test layers --test shaders
    env "${MESA26_ENV[@]}" cargo test "$@" --test gpu -- backends:: combinations::
fi
bash scripts/pipeline-count.sh "$log" "$FAST_BUDGET"
