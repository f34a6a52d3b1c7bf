#!/usr/bin/env bash
# The full tier: the CI tier (scripts/run-tests.sh, the README's test command) plus the tests
# marked `#[ignore = "full tier ..."]`, with every sampled product whole (FLASH_ATTN_TEST_FULL=1:
# every Dawn format on every algorithm, every CUDA key for both architectures, the property
# tests' longer runs, every module on SwiftShader, the burn integration on both its backends). On lavapipe well over an hour on 2 cores from a
# cold shader cache (not timed since the lean pipeline; docs/TESTING.md, "Tiers"); a GPU
# compiles the same pipelines in a fraction of that.
# Arguments go to cargo (e.g. --features cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
export FLASH_ATTN_TEST_FULL=1
export GALLIVM_PERF=${GALLIVM_PERF-nopt}
. scripts/mesa26-env.sh
if cargo nextest --version >/dev/null 2>&1; then
    env "${MESA26_ENV[@]}" cargo nextest run --no-fail-fast --run-ignored all "$@"
else
    env "${MESA26_ENV[@]}" cargo test --tests "$@" -- --include-ignored
fi
cargo test --doc "$@"
# Every module of tests/gpu on SwiftShader (the CI tier takes those where the driver differs).
bash scripts/swiftshader-tier.sh "$@"
# The burn integration on both of burn's wgpu backends, fused and unfused (FLASH_ATTN_TEST_FULL
# asks burn-check.sh for the second build); the CI tier has neither (its time budget).
bash scripts/burn-check.sh
# The release wheel a user's `pip install ./python` builds, and pytest over it (the CI tier
# builds the same source with the development profile: FLASH_ATTN_TEST_FULL, python-check.sh).
bash scripts/python-check.sh
