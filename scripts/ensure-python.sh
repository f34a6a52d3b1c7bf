#!/usr/bin/env bash
# The Python package's tools (scripts/python-check.sh): a virtualenv in .venv/ with maturin,
# numpy, ml_dtypes (bfloat16 arrays) and pytest from PyPI, at the versions pinned in
# python/requirements-dev.txt. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "ensure-python: $*" >&2; }
venv=.venv
if [ ! -x "$venv/bin/python" ]; then
    log "making the virtualenv $venv"
    python3 -m venv "$venv"
fi
want=$(sha256sum python/requirements-dev.txt | cut -d' ' -f1)
if [ "$(cat "$venv/.requirements" 2>/dev/null)" != "$want" ]; then
    log "installing python/requirements-dev.txt"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r python/requirements-dev.txt >&2
    echo "$want" > "$venv/.requirements"
else
    log "requirements present in $venv"
fi
