#!/usr/bin/env bash
# The Python package in CI: builds the native module with maturin into the virtualenv that
# ensure-python.sh made (dev profile, into target/python: the dependencies' features differ
# from the test build's, so nothing is shared but the Mesa shader cache, which the same
# SPIR-V hits), then runs its pytest suite against the numpy f64 reference on the default
# adapter, and the example of user modifiers (python/examples/flex.py, checked against numpy).
# Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export GALLIVM_PERF=${GALLIVM_PERF-nopt} # as run-tests.sh
export CARGO_TARGET_DIR="$PWD/target/python"
export VIRTUAL_ENV="$PWD/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
(cd python && maturin develop --quiet)
python -m pytest -q python/tests "$@"
python python/examples/flex.py --seq 128
