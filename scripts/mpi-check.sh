#!/usr/bin/env bash
# Context parallelism over MPI (issue 63): tests/mpi.rs (feature mpi) under `mpiexec -n 2` and
# `-n 4` (oversubscribed on a 2-core machine, every rank on lavapipe), then `--leave` (the last
# rank leaves before the call: the others must fail with a typed error within their
# deadline). Arguments go to cargo (the suite's --features cuda). Skipped with a message where
# MPI is missing, unless CI is set.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "mpi-check: $*" >&2; }
if ! command -v mpiexec >/dev/null; then
    if [ -n "${CI:-}" ]; then
        log "no mpiexec (bash scripts/ensure-mpi.sh installs MPICH)"
        exit 1
    fi
    log "no mpiexec: skipped (bash scripts/ensure-mpi.sh installs MPICH)"
    exit 0
fi
export GALLIVM_PERF=${GALLIVM_PERF-nopt} # as run-tests.sh
messages=$(mktemp)
trap 'rm -f "$messages"' EXIT
cargo test --no-run "$@" --features mpi --test mpi --message-format=json-render-diagnostics \
    >"$messages"
bin=$(grep '"reason":"compiler-artifact"' "$messages" |
    sed -n 's/.*"target":{[^}]*"name":"mpi".*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -x "$bin" ] || { log "no mpi test binary among cargo's artifacts"; exit 1; }
# each rank on lavapipe 26.1 where its root exists, as the suite (scripts/mesa26-env.sh)
. scripts/mesa26-env.sh
for n in 2 4; do
    mpiexec -n "$n" "${MESA26_RUN[@]}" "$bin"
done
mpiexec -n 2 "${MESA26_RUN[@]}" "$bin" --leave
