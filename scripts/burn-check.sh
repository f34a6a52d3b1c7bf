#!/usr/bin/env bash
# The burn integration (burn/, its own workspace): builds its tests and the training example
# into target/burn, then runs the tests (forward and gradients against the f64 reference and
# burn's own attention under autodiff, typed errors) on the default adapter, on burn's fused
# backend (feature `fusion`, the default, as burn's; the fused operation runs our cubecl
# implementation inside burn's streams). The full tier (scripts/test-full.sh) runs this script
# with FLASH_ATTN_TEST_FULL=1, which runs them again on the unfused cubecl backend (a second
# build of burn's ~670 crates, 2.5 minutes on 2 cores). Not in the README's test command: the
# first build alone is about 6 of its 30 minutes on 2 cores (docs/log/ci-time.md, "CI time:
# burn to the full tier"). Arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/../burn"
export GALLIVM_PERF=${GALLIVM_PERF-nopt} # as run-tests.sh
export CARGO_TARGET_DIR="$PWD/../target/burn"
cargo build --examples --tests
# on lavapipe 26.1 where its root exists, as the suite (scripts/mesa26-env.sh)
. ../scripts/mesa26-env.sh
env "${MESA26_ENV[@]}" cargo test "$@"
if [ -n "${FLASH_ATTN_TEST_FULL:-}" ]; then
    env "${MESA26_ENV[@]}" cargo test --no-default-features "$@"
fi
