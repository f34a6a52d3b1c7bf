#!/usr/bin/env bash
# What a call costs from Python beyond the same call from Rust (issue 50), on the default
# adapter: the release wheel (scripts/python-check.sh's build) in a fresh virtualenv, and
# the release build of examples/call_cost.rs, timing the same forward (N = 1024, numpy in and
# out) and decode step (a device-resident cache), alternating Rust and Python for ROUNDS
# rounds (default 3) of REPS calls (default 20; the median of each). Prints every round and
# the median round's overhead. Needs ensure-python.sh's .venv (maturin).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-20}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd python && ../.venv/bin/maturin build --release --quiet --out "$tmp/wheels" >/dev/null)
python3 -m venv "$tmp/venv"
grep -vE '^(#|maturin)' python/requirements-dev.txt >"$tmp/pins.txt"
"$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$tmp/pins.txt" \
    "$tmp"/wheels/*.whl >&2
cargo build --quiet --release --example call_cost
rust=${CARGO_TARGET_DIR:-target}/release/examples/call_cost
for r in $(seq "$ROUNDS"); do
    "$rust" --reps "$REPS" | sed "s/^/round $r /"
    "$tmp/venv/bin/python" python/examples/call_cost.py --reps "$REPS" | sed "s/^/round $r /"
done | tee "$tmp/rounds.txt"
python3 - "$tmp/rounds.txt" <<'PY'
import statistics, sys
ms = {}
for line in open(sys.argv[1]):
    _, _, side, what, value, _ = line.split()
    ms.setdefault((side, what), []).append(float(value))
for what in ("forward", "decode"):
    r, p = statistics.median(ms[("rust", what)]), statistics.median(ms[("python", what)])
    print(f"{what}: rust {r:.3f} ms, python {p:.3f} ms (median rounds): python adds "
          f"{p - r:.3f} ms, {100 * (p - r) / r:.1f}%")
PY
