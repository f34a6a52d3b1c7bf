#!/usr/bin/env bash
# The burn integration (burn/, its own workspace): builds its tests and the training example
# into target/burn, then runs the tests (forward and gradients against the f64 reference and
# burn's own attention under autodiff, typed errors) on the default adapter, twice: on burn's
# fused backend (feature `fusion`, the default, as burn's) and on its unfused cubecl backend
# (a second build of burn). Arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/../burn"
export GALLIVM_PERF=${GALLIVM_PERF-nopt} # as run-tests.sh
export CARGO_TARGET_DIR="$PWD/../target/burn"
cargo build --examples --tests
# on lavapipe 26.1 where its root exists, as the suite (scripts/mesa26-env.sh)
. ../scripts/mesa26-env.sh
env "${MESA26_ENV[@]}" cargo test "$@"
env "${MESA26_ENV[@]}" cargo test --no-default-features "$@"
