#!/usr/bin/env bash
# cubecl-attention (burn's attention, on cubecl's wgpu runtime) next to our tiled forward, on
# the same adapter, interleaved. Run by hand (the peer's crates are fetched by cargo, which CI
# cannot do); paste the output into docs/PERFORMANCE.md.
#
#   scripts/peers/cubecl.sh [--rounds N] [--peer-src DIR] [--build-dir DIR]
#
# The peer is the small wrapper binary in DIR (default /work/shared/peers/cubecl-attention, see
# its README one level up). The first run copies it to the build dir (default
# /tmp/peers/cubecl-attention) and builds it there with `cargo build --release`; later runs reuse
# it. Our bench is built with cargo if target/release/examples/bench is missing. Needs jq.
#
# Shape: forward only, B=1, H=8, D=64, N = seq_q = seq_kv = 512, 1024, 2048, f32 Q/K/V/out, no
# mask, non-causal. FLOPs 4*B*H*Sq*Sk*D. Each round runs, in alternating order, our
# `bench --seq 512,1024,2048 --batch 1 --heads 8 --head-dim 64 --dtype f32 --algorithms tiled
# --pass fwd --repeats 5` and `peer 1 8 N 64 --reps 5` (strategy "unit") for each N.
# Times: ours, the median GPU time (timestamps) of 5 calls after a warm-up; cubecl, the median
# wall time of 5 launch+sync pairs after a warm-up (it checks its output against an f64
# reference; a wrong result is marked). The last rows are the medians over rounds.
set -euo pipefail

ROUNDS=3; PEER_SRC=/work/shared/peers/cubecl-attention; PEER=/tmp/peers/cubecl-attention
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --peer-src) PEER_SRC=${2:?}; shift 2 ;;
    --build-dir) PEER=${2:?}; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--peer-src DIR] [--build-dir DIR]" >&2; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=$ROOT/target/release/examples/bench
NS=(512 1024 2048)
command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }

if [[ ! -x $PEER/target/release/peer ]]; then
  mkdir -p "$PEER" && cp -r "$PEER_SRC"/. "$PEER"/ && chmod -R u+w "$PEER"
  (cd "$PEER" && cargo build --release)
fi
[[ -x $BENCH ]] || (cd "$ROOT" && cargo build --release --example bench)

WORK=$(mktemp -d /tmp/peers-cubecl.XXXXXX)   # raw logs; results.tsv: round side N gflops
RES=$WORK/results.tsv; : > "$RES"

run_ours() {  # $1 round
  "$BENCH" --seq "$(IFS=,; echo "${NS[*]}")" --batch 1 --heads 8 --head-dim 64 --dtype f32 \
      --algorithms tiled --pass fwd --repeats 5 --json "$WORK/ours.$1.json" > "$WORK/ours.$1.log" 2>&1
  jq -r --arg r "$1" '.[] | "\($r) ours \(.seq_q) \(.gflops)"' "$WORK/ours.$1.json" >> "$RES"
}
run_cubecl() {  # $1 round
  local n line
  for n in "${NS[@]}"; do
    "$PEER/target/release/peer" 1 8 "$n" 64 --reps 5 > "$WORK/cubecl.$1.$n.log" 2>&1 || true
    # "peer=cubecl-attention strategy=unit B=1 H=8 N=512 D=64 median_ms=... gflops=... status=ok"
    line=$(grep -m1 '^peer=cubecl-attention' "$WORK/cubecl.$1.$n.log" || true)
    if [[ $line == *status=ok* ]]; then
      echo "$1 cubecl $n $(sed -E 's/.* gflops=([0-9.]+).*/\1/' <<< "$line")"
    else
      echo "$1 cubecl $n failed"   # see the log
    fi
  done >> "$RES"
}
for ((r = 1; r <= ROUNDS; r++)); do
  echo "round $r/$ROUNDS (logs in $WORK)" >&2
  if ((r % 2)); then run_ours "$r"; run_cubecl "$r"; else run_cubecl "$r"; run_ours "$r"; fi
done

get() { awk -v r="$1" -v s="$2" -v n="$3" '$1 == r && $2 == s && $3 == n { print $4; exit }' "$RES"; }
med() {  # median over rounds of one side and N, or n/a
  awk -v s="$1" -v n="$2" '$2 == s && $3 == n && $4 + 0 > 0 {
      for (i = k++; i > 0 && m[i - 1] > $4 + 0; i--) m[i] = m[i - 1]
      m[i] = $4 + 0 }
    END { if (!k) print "n/a"; else print (k % 2 ? m[(k - 1) / 2] : (m[k / 2 - 1] + m[k / 2]) / 2) }' "$RES"
}
row() {  # round N ours cubecl
  awk -v r="$1" -v n="$2" -v o="${3:-n/a}" -v c="${4:-n/a}" 'BEGIN {
    f = "%.1f"; os = o + 0 > 0 ? sprintf(f, o) : o; cs = c + 0 > 0 ? sprintf(f, c) : c
    printf "| %s | %s | %s | %s | %s |\n", r, n, os, cs, (o + 0 > 0 && c + 0 > 0) ? sprintf("%.2f", o / c) : "n/a" }'
}

echo "## cubecl-attention vs flash-attn-wgpu, forward ($(date -u '+%Y-%m-%d %H:%M UTC'), $ROUNDS rounds, interleaved)"
echo
echo "- ours: $(grep -m1 '^adapter:' "$WORK/ours.1.log" || echo 'adapter: ?')"
echo "- cubecl: $(grep -m1 '^runtime=' "$WORK/cubecl.1.${NS[0]}.log" || echo '?'),"\
     "cubecl-attention $(grep -A1 '^name = "cubecl-attention"' "$PEER/Cargo.lock" | sed -n 's/^version = "\(.*\)"/\1/p'), strategy unit"
echo "- B=1, H=8, D=64, N = seq_q = seq_kv, f32, non-causal, no mask; GFLOP/s = 4*B*H*N*N*D / median time"
echo "- ratio = ours GFLOP/s / cubecl GFLOP/s (above 1: ours faster)"
echo
echo "| round | N | ours GFLOP/s | cubecl GFLOP/s | ours / cubecl |"
echo "|---|---|---|---|---|"
for ((r = 1; r <= ROUNDS; r++)); do
  for n in "${NS[@]}"; do row "$r" "$n" "$(get "$r" ours "$n")" "$(get "$r" cubecl "$n")"; done
done
for n in "${NS[@]}"; do row "**median**" "$n" "$(med ours "$n")" "$(med cubecl "$n")"; done
