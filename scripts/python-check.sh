#!/usr/bin/env bash
# The Python package in CI, as a user gets it: builds the abi3 wheel with maturin, installs that
# wheel into a fresh virtualenv outside the checkout with its test extra (pip resolves the
# pins of python/requirements-dev.txt), and runs the pytest suite there, from a copy of the
# tests outside the checkout (so that nothing imports the source tree), against the numpy f64
# reference on the default adapter; then the example of user modifiers
# (python/examples/flex.py, checked against numpy). The Mesa shader cache the suite filled
# serves the pipelines: the SPIR-V is the same whatever the opt level. Arguments go to pytest.
#
# Which build: the full tier (FLASH_ATTN_TEST_FULL) builds the release wheel a user's `pip
# install` builds, into target/python (python/.cargo/config.toml keeps builds out of
# python/): 139-177 s cold on 2 cores, all of wgpu and naga at opt-level 3. The CI tier builds
# the same source with the development profile in the suite's own target folder and the
# suite's features (the package's `suite-build`), so that it compiles pyo3, numpy and this
# package alone: about 60 s cold (docs/log/ci-time.md).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
export GALLIVM_PERF=${GALLIVM_PERF-nopt} # as run-tests.sh
log() { echo "python-check: $*" >&2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
if [ -n "${FLASH_ATTN_TEST_FULL:-}" ]; then
    (cd python && ../.venv/bin/maturin build --release --quiet --out "$tmp/wheels")
else
    (cd python && CARGO_TARGET_DIR="$repo/target" ../.venv/bin/maturin build --profile dev \
        --features suite-build --out "$tmp/wheels" 2>"$tmp/build.log") ||
        { cat "$tmp/build.log" >&2; exit 1; }
    # the reuse is a matter of minutes, never of correctness: say when it failed
    again=$(grep -oE 'Compiling (naga|wgpu-core|wgpu) ' "$tmp/build.log" | sort -u | tr -d '\n' || true)
    [ -z "$again" ] || log "naga and wgpu compiled again (${again% }): the suite has not built in target/ yet, or" \
        "the features of python/Cargo.toml's suite-build and harness/Cargo.toml disagree"
fi
wheel=$(ls "$tmp"/wheels/*.whl)
case "$wheel" in
    *-cp39-abi3-manylinux*_x86_64.whl) ;;
    *) log "expected one abi3 manylinux wheel for Python >= 3.9, got $wheel"; exit 1 ;;
esac
[ ! -e python/target ] || { log "python/target exists: the build left the source tree"; exit 1; }
log "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) in $((SECONDS - start)) s"
python3 -m venv "$tmp/venv"
# the test extra, at the versions the development virtualenv pins
grep -vE '^(#|maturin)' python/requirements-dev.txt >"$tmp/pins.txt"
# pytest-xdist runs the tests in two processes: one pytest process is one core compiling
# pipelines (120 s cold against about 65 s in two)
"$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -c "$tmp/pins.txt" "$wheel[test,bf16,mpi]" pytest-xdist >&2
# CI runs the distributed tests (mpiexec, scripts/ensure-mpi.sh) rather than skip them
if [ -n "${CI:-}" ]; then export FLASH_ATTN_REQUIRE_MPI=1; fi
cp -r python/tests "$tmp/tests"
cp python/examples/flex.py "$tmp/flex.py"
cd "$tmp"
where=$("$tmp/venv/bin/python" -c 'import flash_attn_wgpu as fa; print(fa.__file__)')
case "$where" in
    "$tmp/venv/"*) log "testing the installed wheel: $where" ;;
    *) log "flash_attn_wgpu came from $where, not the wheel"; exit 1 ;;
esac
# on lavapipe 26.1 where its root exists, as the suite (scripts/mesa26-env.sh; the MPI
# tests' ranks, started by mpiexec, run on the machine's loader and Mesa)
. "$repo/scripts/mesa26-env.sh"
# the workers are started as pytest's own interpreter is: in the Mesa 26 root where it exists
# (a worker started by path would load the machine's Mesa)
worker=$tmp/venv/bin/python
if [ ${#MESA26_RUN[@]} -gt 0 ]; then
    printf '#!/bin/sh\nexec %s "%s" "$@"\n' "${MESA26_RUN[*]}" "$tmp/venv/bin/python" >"$tmp/worker"
    chmod +x "$tmp/worker"
    worker=$tmp/worker
fi
"${MESA26_RUN[@]}" "$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider \
    --tx "2*popen//python=$worker" --dist load tests "$@"
"${MESA26_RUN[@]}" "$tmp/venv/bin/python" flex.py --seq 128
