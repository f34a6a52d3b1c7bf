#!/usr/bin/env bash
# GPU check with prebuilt binaries (no cargo, no Rust needed), on whatever adapter wgpu picks
# (WGPU_BACKEND, WGPU_ADAPTER_NAME and WGPU_POWER_PREF choose one).
#
#   BIN_DIR   prebuilt binaries, laid out like cargo's target/release
#             (examples/bench, deps/<test>-<hash>); default target/release.
#             scripts/gpu-check-build.sh builds and strips them into gpu-bin/.
#   OUT_DIR   where the logs, bench JSON/Markdown/SVG and summary.md go; default gpu-check-out
#   MODE      full (default): the correctness tests and the bench grid below, sized for a
#             fast GPU (see BENCH_BUDGET_S); smoke: one test per test binary and a tiny bench
#             (under a minute on lavapipe)
#   BENCH_BUDGET_S   full mode: wall-clock budget of the wgpu bench grid in seconds (default
#                    240); points predicted to end past it are recorded as skipped, not measured
#   TEST_TIMEOUT_S   per test binary (default 120; smoke mode 600, for pipelines compiled
#                    from a cold shader cache on a CPU driver)
#
# Full mode takes about BENCH_BUDGET_S plus the tests' and the comparison's time (a few
# minutes on a fast GPU); at most BENCH_BUDGET_S + 120 + 8 * TEST_TIMEOUT_S + 3 * 180 seconds
# (one timeout per test binary and per comparison bench). On a 10-minute device call, set
# BENCH_BUDGET_S=120 and TEST_TIMEOUT_S=90.
#
# Steps: (a) the adapter summary, (b) the test executables dtypes, variants, forward,
# backward, nonfinite, split, errors, backends that exist in $BIN_DIR/deps (backends
# runs the one suite on wgpu and on the first CUDA device, with NVRTC from
# FLASH_ATTN_NVRTC_DIR or found below; its CUDA half prints a skip where there is no CUDA
# driver), (c) full mode: the CUDA path, PyTorch SDPA's flash backend and the wgpu path on the
# same shapes (bf16, head_dim 128, B=1, H=32, N=4K..16K, causal and not, forward and
# forward+backward), merged by scripts/bench_compare.py into compare.json and compare.md,
# (c2) the decode bench (bench --decode: KV caches of 1K..64K keys, split-KV next to one
# split, the per-call cost; and cuda_bench --decode, the CUDA decode kernel), (d) the wgpu bench grid with every kernel family side by side,
# (e) $OUT_DIR/summary.md.
# Every step runs even if an earlier one failed; the exit status is non-zero if any failed.
set -uo pipefail

BIN_DIR=${BIN_DIR:-target/release}
OUT_DIR=${OUT_DIR:-gpu-check-out}
MODE=${MODE:-full}
BENCH_BUDGET_S=${BENCH_BUDGET_S:-240}
# smoke mode compiles each binary's pipelines from a cold shader cache on a CPU driver
if [ "$MODE" = smoke ]; then
    TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-600}
else
    TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-120}
fi
# smoke mode: the test each binary runs, where its first listed one is not the cheapest
declare -A SMOKE_PICK=([variants]=only_the_adapters_fixed_subgroup_size_is_accepted)
TESTS=(dtypes variants forward backward nonfinite split errors backends)

log() { echo "gpu-check: $*" >&2; }

case "$MODE" in
    full | smoke) ;;
    *) log "MODE must be full or smoke, got '$MODE'"; exit 2 ;;
esac
BENCH="$BIN_DIR/examples/bench"
if [ ! -x "$BENCH" ]; then
    log "no executable $BENCH (build it with scripts/gpu-check-build.sh and set BIN_DIR=gpu-bin)"
    exit 2
fi
mkdir -p "$OUT_DIR" || exit 2
rm -f "$OUT_DIR"/*.log "$OUT_DIR"/bench.* "$OUT_DIR"/adapter.txt "$OUT_DIR"/summary.md \
    "$OUT_DIR"/compare.* "$OUT_DIR"/cmp-*.json "$OUT_DIR"/cmp-*.txt

started=$(date +%s)
failed=0
steps=()      # markdown rows: | step | status | seconds | detail |
test_rows=()  # markdown rows: | binary | status | result |

# run_step NAME LOGFILE DETAIL CMD...: runs CMD with stdout and stderr to LOGFILE (and stderr),
# records the outcome.
run_step() {
    local name=$1 logfile=$2 detail=$3
    shift 3
    log "== $name: $*"
    local t0 rc
    t0=$(date +%s)
    "$@" >"$logfile" 2>&1
    rc=$?
    local secs=$(($(date +%s) - t0))
    if [ "$rc" -eq 0 ]; then
        steps+=("| $name | ok | $secs | $detail |")
        log "   ok ($secs s)"
    else
        failed=1
        local why="exit $rc"
        [ "$rc" -eq 124 ] && why="timed out (exit 124)"
        steps+=("| $name | **FAILED: $why** | $secs | $detail; log: $(basename "$logfile") |")
        log "   FAILED: $why ($secs s); last lines of $logfile:"
        tail -n 20 "$logfile" >&2
    fi
    return "$rc"
}

# NVRTC for the CUDA test: FLASH_ATTN_NVRTC_DIR if set, else the first folder with
# libnvrtc.so.13 among the CUDA toolkit's and Python's nvidia wheels' (PyTorch's CUDA 13
# builds bring one)
if [ -z "${FLASH_ATTN_NVRTC_DIR:-}" ]; then
    wheel_dirs=$(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null || true)
    for d in .tools/cuda-13.0/lib /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $wheel_dirs; do
        if ls "$d"/libnvrtc.so.13* >/dev/null 2>&1; then
            export FLASH_ATTN_NVRTC_DIR=$d
            break
        fi
    done
fi

# (a) the adapter, and what the machine offers
{
    echo "nvrtc: ${FLASH_ATTN_NVRTC_DIR:-not found}"
    echo "host: $(uname -srm)"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi -L 2>&1 | sed 's/^/nvidia-smi: /'
    fi
    if command -v ldconfig >/dev/null 2>&1; then
        ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' &&
            echo "vulkan loader: present" || echo "vulkan loader: libvulkan.so.1 NOT FOUND"
    fi
    for f in /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json; do
        [ -e "$f" ] && echo "vulkan icd: $f"
    done
} >"$OUT_DIR/machine.txt" 2>&1
run_step "adapter" "$OUT_DIR/adapter.log" "bench --info" "$BENCH" --info
cp "$OUT_DIR/adapter.log" "$OUT_DIR/adapter.txt"
cat "$OUT_DIR/machine.txt" "$OUT_DIR/adapter.txt" >&2

# (b) correctness tests: the newest <name>-<16 hex digits> executable per test target
found_tests=0
for name in "${TESTS[@]}"; do
    exe=""
    for f in $(ls -t "$BIN_DIR/deps/" 2>/dev/null); do
        if [[ "$f" =~ ^${name}-[0-9a-f]{16}$ ]] && [ -x "$BIN_DIR/deps/$f" ] && [ -f "$BIN_DIR/deps/$f" ]; then
            exe="$BIN_DIR/deps/$f"
            break
        fi
    done
    if [ -z "$exe" ]; then
        log "no $name test executable in $BIN_DIR/deps: skipped"
        test_rows+=("| $name | not built | - |")
        continue
    fi
    found_tests=$((found_tests + 1))
    args=()
    what="all tests"
    if [ "$MODE" = smoke ]; then
        # One test per binary (SMOKE_PICK, else the first listed): the binary runs on this adapter. `cargo test`
        # runs all of them.
        first=${SMOKE_PICK[$name]:-}
        if [ -z "$first" ]; then
            first=$("$exe" --list 2>/dev/null | sed -n 's/: test$//p' | head -n 1)
        fi
        if [ -n "$first" ]; then
            args=(--exact "$first")
            what="smoke: $first"
        fi
    fi
    logfile="$OUT_DIR/test-$name.log"
    if run_step "test $name" "$logfile" "$what" timeout "$TEST_TIMEOUT_S" "$exe" "${args[@]}"; then
        status=ok
    else
        status="**FAILED**"
    fi
    result=$(grep -E '^test result:' "$logfile" | tail -n 1)
    test_rows+=("| $name | $status | ${result:-no result line (see test-$name.log)} |")
done
if [ "$found_tests" -eq 0 ]; then
    failed=1
    steps+=("| tests | **FAILED: no test executables in $BIN_DIR/deps** | 0 | - |")
    log "no test executables found in $BIN_DIR/deps"
fi

# (c) the CUDA path beside PyTorch SDPA (flash backend) and the wgpu path, on the issue's
# shapes: B * H * N fills an H200 at every N (B=1, H=32: 2048 forward blocks of 64 rows at
# N=4K). Each bench writes records of one shape; bench_compare.py matches them into one table.
CMP_SHAPE=(--seq 4096,8192,16384 --batch 1 --heads 32 --head-dim 128 --dtype bf16 --causal-both)
compare_note="not run (smoke mode)"
if [ "$MODE" = full ]; then
    cmp_inputs=()
    if [ -x "$BIN_DIR/examples/cuda_bench" ]; then
        run_step "compare: CUDA path" "$OUT_DIR/cmp-cuda.log" "cuda_bench ${CMP_SHAPE[*]}" \
            timeout 180 "$BIN_DIR/examples/cuda_bench" "${CMP_SHAPE[@]}" --repeats 5 \
            --json "$OUT_DIR/cmp-cuda.json"
        cmp_inputs+=("$OUT_DIR/cmp-cuda.json")
    else
        log "no $BIN_DIR/examples/cuda_bench: the CUDA column stays empty"
    fi
    if python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
        run_step "compare: PyTorch SDPA (flash)" "$OUT_DIR/cmp-sdpa.log" "scripts/sdpa_bench.py" \
            timeout 180 python3 "$(dirname "$0")/sdpa_bench.py" "${CMP_SHAPE[@]}" --repeats 5 \
            --json "$OUT_DIR/cmp-sdpa.json"
        cmp_inputs+=("$OUT_DIR/cmp-sdpa.json")
    else
        log "no PyTorch with CUDA here: the SDPA column stays empty"
    fi
    run_step "compare: wgpu path" "$OUT_DIR/cmp-wgpu.log" "bench, tiled, every variant" \
        timeout 180 "$BENCH" "${CMP_SHAPE[@]}" --algorithms tiled --variant coop,blocks,lanes,rows \
        --pass both --repeats 3 --roofline-scale 5 --budget-s 150 --json "$OUT_DIR/cmp-wgpu.json"
    cmp_inputs+=("$OUT_DIR/cmp-wgpu.json")
    if run_step "compare: table" "$OUT_DIR/cmp-table.log" "scripts/bench_compare.py" \
        python3 "$(dirname "$0")/bench_compare.py" --out-json "$OUT_DIR/compare.json" \
        --out-md "$OUT_DIR/compare.md" "${cmp_inputs[@]}"; then
        compare_note="compare.md, records in compare.json"
    else
        compare_note="the table step failed (cmp-table.log)"
    fi
fi

# (c2) decode (bench --decode): one query row against KV caches (32/8 heads, head_dim 128,
# f16), split-KV next to one split, KV bytes per second against the copy roofline, and the
# per-call cost
if [ "$MODE" = full ]; then
    decode_args=(--seq 1024,4096,16384,32768,65536 --batch 1,8 --repeats 5)
else
    decode_args=(--seq 256 --batch 1 --repeats 1)
fi
run_decode() {
    timeout 300 "$BENCH" --decode "${decode_args[@]}" --heads 32 --kv-heads 8 --head-dim 128 \
        --dtype f16 >"$OUT_DIR/decode.txt"
}
run_step "decode" "$OUT_DIR/decode.log" "bench --decode ${decode_args[*]}; table in decode.txt" run_decode
# the CUDA decode kernel (cuda/flash_decode.cu) on the same shapes, where the CUDA bench is built
if [ "$MODE" = full ] && [ -x "$BIN_DIR/examples/cuda_bench" ]; then
    run_cuda_decode() {
        timeout 180 "$BIN_DIR/examples/cuda_bench" --decode "${decode_args[@]}" --heads 32 \
            --kv-heads 8 --head-dim 128 --dtype f16 >"$OUT_DIR/decode-cuda.txt"
    }
    run_step "decode: CUDA path" "$OUT_DIR/decode-cuda.log" \
        "cuda_bench --decode ${decode_args[*]}; table in decode-cuda.txt" run_cuda_decode
fi

# (d) the wgpu bench grid
if [ "$MODE" = full ]; then
    # B = 1, 4; H = 8, 32; D = 64, 128; N = 1K..16K; f16, bf16, f32; forward and
    # forward+backward (measured from the same calls); causal and not; naive only to N = 4096
    # (O(N^2) memory). Cheapest shapes first; what would end past the budget is skipped and
    # recorded as skipped. The tiled points alone are ~3.5e15 FLOP with the warm-up calls
    # (4 * BH * N^2 * D summed over the grid, x1.5 for causal and not, x3 dtypes, x3.5 for
    # fwd+bwd, x4 calls): ~6 min at 10 TFLOP/s, so on a GPU slower than ~15 TFLOP/s the
    # largest shapes (B=4, H=32, N=16K) are the ones skipped.
    # Every kernel family side by side: coop (where the adapter has cooperative matrices;
    # left out with a note elsewhere), blocks, lanes, rows.
    bench_args=(--batch 1,4 --heads 8,32 --head-dim 64,128 --seq 1024,2048,4096,8192,16384
        --dtype f16,bf16,f32 --variant coop,blocks,lanes,rows --pass both --causal-both
        --algorithms tiled,naive
        --naive-max-seq 4096 --repeats 3 --roofline-scale 20 --budget-s "$BENCH_BUDGET_S")
    bench_timeout=$((BENCH_BUDGET_S + 120))
else
    # Every dtype, both passes, both algorithms; non-causal only (the causal pipelines would
    # double the shader compilations, the bulk of a smoke run on a cold shader cache).
    bench_args=(--batch 1 --heads 2 --head-dim 16 --seq 64,128 --dtype f16,bf16,f32
        --variant coop,rows --pass both --algorithms tiled,naive --repeats 1
        --roofline-scale 0.1)
    bench_timeout=600
fi
# The table goes to bench.txt (stdout), progress and errors to bench.log (stderr).
run_bench() {
    timeout "$bench_timeout" "$BENCH" "${bench_args[@]}" --json "$OUT_DIR/bench.json" \
        --markdown "$OUT_DIR/bench.md" --plot "$OUT_DIR/bench.svg" >"$OUT_DIR/bench.txt"
}
run_step "bench" "$OUT_DIR/bench.log" "$MODE grid; table in bench.txt and bench.md, records in bench.json, plot bench.svg" run_bench
if [ -f "$OUT_DIR/bench.json" ]; then
    measured=$(grep -c '"median_ms": [0-9]' "$OUT_DIR/bench.json" || true)
    skipped=$(grep -c '"note": "skipped' "$OUT_DIR/bench.json" || true)
    limited=$(grep -c '"note": "device limit' "$OUT_DIR/bench.json" || true)
    bench_counts="$measured records measured, $skipped skipped (time budget), $limited over a device limit"
else
    bench_counts="no bench.json"
fi

# smoke mode: the comparison table from the wgpu records alone (the script runs; the CUDA and
# SDPA columns need a GPU)
if [ "$MODE" = smoke ] && [ -f "$OUT_DIR/bench.json" ]; then
    if run_step "compare: table" "$OUT_DIR/cmp-table.log" "scripts/bench_compare.py on bench.json" \
        python3 "$(dirname "$0")/bench_compare.py" --out-json "$OUT_DIR/compare.json" \
        --out-md "$OUT_DIR/compare.md" "$OUT_DIR/bench.json"; then
        compare_note="compare.md (wgpu records only), records in compare.json"
    fi
fi

# (e) the summary
total=$(($(date +%s) - started))
{
    echo "# GPU check ($MODE mode)"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), $total s in all; binaries from \`$BIN_DIR\`."
    echo
    echo "## Machine and adapter"
    echo
    echo '```'
    cat "$OUT_DIR/machine.txt" "$OUT_DIR/adapter.txt" 2>/dev/null
    echo '```'
    echo
    echo "## Steps"
    echo
    echo "| step | status | seconds | detail |"
    echo "|---|---|---|---|"
    printf '%s\n' "${steps[@]}"
    echo
    echo "## Tests"
    echo
    echo "| test binary | status | result |"
    echo "|---|---|---|"
    printf '%s\n' "${test_rows[@]}"
    echo
    echo "## CUDA path, PyTorch SDPA (flash) and wgpu on the same shapes"
    echo
    if [ -f "$OUT_DIR/compare.md" ]; then
        cat "$OUT_DIR/compare.md"
    else
        echo "($compare_note)"
    fi
    echo
    echo "## Bench"
    echo
    echo "Arguments: \`${bench_args[*]}\`"
    echo
    echo "$bench_counts."
    echo
    if [ -f "$OUT_DIR/bench.md" ]; then
        # Rows skipped for the time budget are left out here (bench.md and bench.json have them).
        grep -v '| skipped: ' "$OUT_DIR/bench.md"
    else
        echo "(no table: the bench step failed; see bench.log)"
    fi
} >"$OUT_DIR/summary.md"

log "summary: $OUT_DIR/summary.md ($total s)"
if [ "$failed" -ne 0 ]; then
    log "FAILED: at least one step failed (see the summary)"
    exit 1
fi
log "all steps passed"
