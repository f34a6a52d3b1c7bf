#!/usr/bin/env bash
# Prints the one command to give the GPU machine (the device tool's `run`: at most 2,000
# characters, run in the repository root with $OUT set) and the paths to carry (at most 8),
# after scripts/gpu-bundle.sh has built them. The rehearsal (scripts/gpu-rehearse.sh) runs
# this same command on lavapipe.
#
#   bash scripts/gpu-run-command.sh            # command line, then "carry: ..."
#   bash scripts/gpu-run-command.sh --command  # the command line alone
#   bash scripts/gpu-run-command.sh --carry    # the carried paths alone, one a line
set -euo pipefail
cd "$(dirname "$0")/.."
# DEADLINE_S: 540 s of steps in a 600 s call (the last step's kill grace and the report end
# by about 555 s), leaving the machine's start and the transfers within the session's 15
# minutes (docs/GPU.md, "Budgets").
COMMAND='DEADLINE_S=${DEADLINE_S:-540} OUT_DIR=$OUT bash scripts/gpu-run.sh'
CARRY=(gpu-bin .gl)
case "${1:-}" in
    --command) echo "$COMMAND" ;;
    --carry) printf '%s\n' "${CARRY[@]}" ;;
    "")
        echo "$COMMAND"
        echo "carry: ${CARRY[*]}"
        echo "timeout_s: 600"
        ;;
    *) echo "usage: $0 [--command | --carry]" >&2; exit 2 ;;
esac
