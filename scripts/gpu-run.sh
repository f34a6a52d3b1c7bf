#!/usr/bin/env bash
# The GPU check as one run on a machine with no Rust (the lent H200): prebuilt binaries from
# scripts/gpu-bundle.sh, steps in order of value under a deadline, results in at most 8 files
# directly under $OUT_DIR, rewritten after every step so that a run killed at any point still
# returns what it measured. scripts/gpu-run-command.sh prints the exact command line and what
# to carry; scripts/gpu-rehearse.sh runs this on lavapipe (MODE=tiny) in CI.
#
#   OUT_DIR     where the results go (default $OUT, else gpu-run-out): summary.md,
#               results.json, logs.tar.gz (every log and table), bench.svg
#   BIN_DIR     the bundle: bench, cuda_bench and gpu-tests, each plain or .xz (default gpu-bin)
#   GL_DIR      Vulkan/EGL loader packages (.deb) to unpack first (default .gl; none: skipped)
#   GL_ROOT     where they are unpacked (default /, then ldconfig; elsewhere: a private root
#               that LD_LIBRARY_PATH points into, as the rehearsal does)
#   DEADLINE_S  no step starts after this many seconds, and each step's timeout is cut to
#               what is left (default 540)
#   MODE        full (the H200: the shapes below) or tiny (the rehearsal: tiny sizes, one
#               test a module)
#
# Steps and their budgets, each its worst case from counts (seconds; docs/GPU.md, "Budgets"):
# machine 10, NVRTC 10, adapter 45, CUDA device 15, tests: list 5, then the gpu test binary's
# modules in five steps (attention 60, every backend 90, decode and caches 35, modifiers and
# layouts 40, edges 45), compare CUDA 45, SDPA 60, wgpu 60, table 10, decode wgpu 40, 8-bit
# 25, MLA 20, CUDA 20: 635 s if every step took its whole budget, when the deadline would cut
# the decode benches; then the wgpu bench grid in what is left.
# Each runs under `timeout -k 10`; a step that cannot run here is skipped with its reason.
# Without an NVIDIA GPU the CUDA and SDPA steps check their arguments only (--dry-run).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT_DIR=${OUT_DIR:-${OUT:-gpu-run-out}}
BIN_DIR=${BIN_DIR:-gpu-bin}
GL_DIR=${GL_DIR:-.gl}
GL_ROOT=${GL_ROOT:-/}
DEADLINE_S=${DEADLINE_S:-540}
MODE=${MODE:-full}
case "$MODE" in
    full | tiny) ;;
    *) echo "gpu-run: MODE must be full or tiny, got '$MODE'" >&2; exit 2 ;;
esac

started=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-run.XXXXXX")
B=$WORK/bin
# what the steps that are functions of this script read (step runs them in a bash of their own)
export BIN_DIR GL_DIR GL_ROOT WORK B
LOGS=$WORK/logs
mkdir -p "$OUT_DIR" "$LOGS" "$WORK/bin" || exit 2
STEPS=$WORK/steps.tsv
: >"$STEPS"
log() { echo "gpu-run: $*" >&2; }
elapsed() { echo $(($(date +%s) - started)); }

# summary.md, results.json and logs.tar.gz in $OUT_DIR, from the steps so far
report() {
    python3 scripts/gpu_report.py --steps "$STEPS" --logs "$LOGS" --out "$OUT_DIR" \
        --mode "$MODE" --deadline "$DEADLINE_S" --elapsed "$(elapsed)" ||
        log "the report failed (python3 scripts/gpu_report.py)"
}

# record NAME STATUS SECONDS BUDGET DETAIL LOG
record() {
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" >>"$STEPS"
    report
}

skip() { # skip NAME BUDGET REASON
    log "== $1: skipped ($3)"
    record "$1" "skipped: $3" 0 "$2" "" ""
}

# step NAME BUDGET DETAIL CMD...: CMD under `timeout -k 10 min(BUDGET, time left)`, output to
# logs/NAME.log; a step with less than 5 s left is skipped
failed=0
step() {
    local name=$1 budget=$2 detail=$3
    shift 3
    local left=$((DEADLINE_S - $(elapsed)))
    if [ "$left" -lt 5 ]; then
        skip "$name" "$budget" "the deadline (${DEADLINE_S} s) has passed"
        return 1
    fi
    local t=$budget
    [ "$left" -lt "$t" ] && t=$left
    local file
    file=$(printf '%s' "$name" | tr -cs 'a-zA-Z0-9' '-').log
    log "== $name (at most $t s): $*"
    local t0 rc
    t0=$(date +%s)
    if declare -F "$1" >/dev/null; then
        # a function of this script: timeout runs programs, so a bash that defines it (and
        # the others, which it may call)
        local fn=$1
        shift
        timeout -k 10 "$t" bash -c "$(declare -f); $fn \"\$@\"" "$fn" "$@" \
            >"$LOGS/$file" 2>&1
    else
        timeout -k 10 "$t" "$@" >"$LOGS/$file" 2>&1
    fi
    rc=$?
    local secs=$(($(date +%s) - t0)) status
    case $rc in
        0) status=ok ;;
        124 | 137) status="FAILED: timed out after $t s"; failed=1 ;;
        *) status="FAILED: exit $rc"; failed=1 ;;
    esac
    log "   $status ($secs s)"
    [ "$rc" -ne 0 ] && tail -n 15 "$LOGS/$file" >&2
    record "$name" "$status" "$secs" "$budget" "$detail" "$file"
    return "$rc"
}

# ---- (1) the machine: loader, driver files, binaries
machine() {
    if ls "$GL_DIR"/*.deb >/dev/null 2>&1; then
        for f in "$GL_DIR"/*.deb; do
            dpkg -x "$f" "$GL_ROOT" || return 1
        done
        echo "loader packages: $(ls "$GL_DIR"/*.deb | xargs -n1 basename | tr '\n' ' ')-> $GL_ROOT"
        if [ "$GL_ROOT" = / ]; then
            ldconfig
        fi
    else
        echo "loader packages: none in $GL_DIR (the machine's own loader, if any)"
    fi
    if [ "$GL_ROOT" = / ]; then
        ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' &&
            echo "vulkan loader: $(ldconfig -p | grep -m1 'libvulkan\.so\.1' | sed 's/.*=> //')" ||
            echo "vulkan loader: libvulkan.so.1 NOT FOUND"
    else
        echo "vulkan loader: $(ls "$GL_ROOT"/usr/lib/*/libvulkan.so.1 2>/dev/null || echo NOT FOUND in "$GL_ROOT")"
    fi
    local icds
    icds=$(ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json 2>/dev/null | tr '\n' ' ')
    echo "vulkan ICDs in the default paths: ${icds:-none}"
    if command -v nvidia-smi >/dev/null; then
        echo "nvidia-smi: $(timeout 20 nvidia-smi -L 2>&1 | head -n 4 | tr '\n' ';')"
        # the GPU's name (which peak figures apply: scripts/gpu_report.py), driver, clocks
        # now and at most, power limit: header and first GPU, read by the report
        timeout 20 nvidia-smi --format=csv \
            --query-gpu=name,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,memory.total,temperature.gpu \
            2>&1 | head -n 2 | sed 's/^/nvidia-smi query: /'
        echo "nvidia-smi: $(timeout 20 nvidia-smi 2>/dev/null | grep -m1 -o 'CUDA Version: [0-9.]*')"
    else
        echo "nvidia-smi: not found"
    fi
    echo "host: $(uname -srm), $(nproc) cores"
    echo "NVRTC: ${FLASH_ATTN_NVRTC_DIR:-none on the device, the NVRTC step unpacks the bundled one}"
    for b in bench cuda_bench gpu-tests compiler_stats; do
        if [ -f "$BIN_DIR/$b.xz" ]; then
            xz -dc "$BIN_DIR/$b.xz" >"$WORK/bin/$b" && chmod +x "$WORK/bin/$b" || return 1
        elif [ -f "$BIN_DIR/$b" ]; then
            cp "$BIN_DIR/$b" "$WORK/bin/$b" && chmod +x "$WORK/bin/$b"
        fi
        echo "binary $b: $(ls -l "$WORK/bin/$b" 2>/dev/null | awk '{print $5 " bytes"}' || echo missing)"
    done
    [ -x "$WORK/bin/bench" ] || { echo "no bench in $BIN_DIR (scripts/gpu-bundle.sh)"; return 1; }
}
if [ "$GL_ROOT" != / ]; then
    mkdir -p "$GL_ROOT"
    export LD_LIBRARY_PATH="$GL_ROOT/usr/lib/x86_64-linux-gnu:$GL_ROOT/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# The NVIDIA driver's ICD and EGL vendor files sit outside the loaders' default paths there.
if ! ls /usr/share/vulkan/icd.d/*nvidia* /etc/vulkan/icd.d/*nvidia* >/dev/null 2>&1 &&
    [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
if [ -f /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json ]; then
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
# NVRTC: FLASH_ATTN_NVRTC_DIR, else the device's own (the toolkit's, a Python wheel's: PyTorch
# brings one, the loader's), else the bundle's (nvrtc.tar.xz, unpacked by the NVRTC step).
# Always as a folder: the test binary's fallback is a path fixed where it was built.
if [ -z "${FLASH_ATTN_NVRTC_DIR:-}" ]; then
    wheel_dirs=$(timeout 30 python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cuda_nvrtc")))' 2>/dev/null || true)
    loader_dir=$(ldconfig -p 2>/dev/null | grep -m1 'libnvrtc\.so\.13' | sed 's/.*=> //')
    for d in .tools/cuda-13.0/lib /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $wheel_dirs ${loader_dir:+"$(dirname "$loader_dir")"}; do
        if ls "$d"/libnvrtc.so.13* >/dev/null 2>&1; then
            export FLASH_ATTN_NVRTC_DIR=$d
            break
        fi
    done
fi
export VK_DRIVER_FILES=${VK_DRIVER_FILES-}
[ -z "$VK_DRIVER_FILES" ] && unset VK_DRIVER_FILES
step "machine" 10 "loader, driver files, binaries (machine.log)" machine

# ---- NVRTC: the device's own, or the bundle's where it has none; either loaded once here
# (nvrtcVersion through ctypes), so a broken one is named before the CUDA steps
nvrtc_check() { # nvrtc_check DIR [ARCHIVE]: unpacks ARCHIVE into DIR first
    if [ -n "${2:-}" ]; then
        mkdir -p "$1" && xz -dc "$2" | tar -C "$1" -xf - || return 1
    fi
    ls -l "$1"/libnvrtc* || return 1
    python3 - "$1" <<'PY'
import ctypes, glob, os, sys
lib = sorted(glob.glob(os.path.join(sys.argv[1], "libnvrtc.so.13*")))[0]
nvrtc = ctypes.CDLL(lib)
major, minor = ctypes.c_int(), ctypes.c_int()
rc = nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
print(f"{lib}: NVRTC {major.value}.{minor.value} (nvrtcVersion returned {rc})")
sys.exit(rc)
PY
}
if [ -n "${FLASH_ATTN_NVRTC_DIR:-}" ]; then
    step "NVRTC" 10 "the device's own: $FLASH_ATTN_NVRTC_DIR" nvrtc_check "$FLASH_ATTN_NVRTC_DIR"
elif [ -f "$BIN_DIR/nvrtc.tar.xz" ]; then
    step "NVRTC" 10 "none on the device: the bundle's ($BIN_DIR/nvrtc.tar.xz), unpacked" \
        nvrtc_check "$WORK/nvrtc" "$BIN_DIR/nvrtc.tar.xz" &&
        export FLASH_ATTN_NVRTC_DIR=$WORK/nvrtc
else
    skip "NVRTC" 10 "none on the device and no nvrtc.tar.xz in $BIN_DIR: the CUDA steps fail"
fi
GPU=0
# (a hung driver query must not take the run down: every probe has a timeout)
timeout 20 nvidia-smi -L 2>/dev/null | grep -q '^GPU' && GPU=1
# the coop self-check gives up within the adapter step's budget
export FLASH_ATTN_WGPU_COOP_TIMEOUT_S=${FLASH_ATTN_WGPU_COOP_TIMEOUT_S:-30}

# ---- (2) what the adapter and the CUDA device are
adapter_rc=0
step "adapter" 45 "bench --info (the coop self-check included)" "$B/bench" --info || adapter_rc=$?
# A coop self-check that hangs costs once: if it timed out here (or took the step down), every
# later wgpu process runs with the coop variant off instead of waiting for it again.
if grep -q 'self-check timed out' "$LOGS/adapter.log" 2>/dev/null ||
    [ "$adapter_rc" = 124 ] || [ "$adapter_rc" = 137 ]; then
    export FLASH_ATTN_WGPU_COOP=off
    log "the coop self-check hung: FLASH_ATTN_WGPU_COOP=off for the steps after it"
    echo "coop self-check hung in the adapter step: FLASH_ATTN_WGPU_COOP=off from here on" \
        >>"$LOGS/adapter.log"
fi
# what the driver's compiler makes of the pipelines the planner picks here (registers, spills,
# waves: VK_KHR_pipeline_executable_properties; issue 62), beside the timings; a driver
# without the extension (lavapipe in the rehearsal) is skipped with its reason
step "compiler statistics" 20 "compiler_stats: the planned pipelines through the driver's compiler" \
    "$B/compiler_stats" --or-skip --json "$LOGS/compiler-stats.json"
if [ "$GPU" = 1 ]; then
    step "CUDA device" 15 "cuda_bench --info (fails loudly: nvidia-smi sees a GPU)" \
        "$B/cuda_bench" --info
else
    step "CUDA device" 15 "no NVIDIA GPU: cuda_bench --dry-run checks its arguments" \
        "$B/cuda_bench" --dry-run --info
fi

# ---- (3) correctness at small sizes: every module of the gpu test binary (tests/gpu/main.rs),
# full tier, in steps in order of value (the calls users make first), each under a budget from
# its counts (docs/GPU.md, "Budgets": the full tier's tests and pipelines, counted on
# lavapipe). The backends:: step proves the CUDA path (required where nvidia-smi sees a GPU).
# "tests: list" checks first that the steps take every module the binary has; one they miss
# runs in the last step. MODE=tiny lists each step's tests and runs one of them (its sample).
TEST_STEPS=("tests: attention" "tests: every backend" "tests: decode, caches"
    "tests: modifiers, layouts" "tests: edges")
TEST_MODULES=("forward backward dtypes variants coop" "backends" "decode kvcache paged merge head_dims latent"
    "score_mod bias views hidden split interop concurrency trainable call_blocks"
    "nonfinite errors limits combinations fuzz driver context_parallel")
# worst cases from counts (docs/GPU.md, "Budgets"): 5 s + (warm test time on lavapipe +
# 0.15 s a distinct pipeline, over 8 threads) + the longest test; backends:: adds NVRTC
TEST_BUDGETS=(60 90 35 45 50)
TEST_SAMPLES=(forward::rows_with_no_visible_key_give_zero_and_neg_inf_lse
    backends::every_backend_chains_device_tensors_and_types_its_errors
    merge::random_shards_merge_as_the_f64_reference_merges_them
    hidden::nan_in_a_cache_past_its_length_or_in_its_padding_never_reaches_a_result
    driver::shader_loop_of_200000_iterations_counts_exactly)
export MODE
# the test binary, full tier, these arguments; results streamed to the step's log as each test
# ends (--nocapture: failures and error figures too), so a step killed at its budget keeps
# them; a filter that matches no test is a failure
run_tests() {
    local out rc
    out=$(mktemp)
    # the full tier (tests/common/tier.rs): a GPU compiles its pipelines in tens of ms
    FLASH_ATTN_TEST_FULL=1 FLASH_ATTN_TEST_MAX_BINDING=134217728 "$B/gpu-tests" --test-threads 8 \
        --include-ignored --nocapture "$@" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ] && grep -q '^test result: ok\. 0 passed' "$out"; then
        echo "gpu-run: no test matched $*"
        rc=3
    fi
    rm -f "$out"
    return "$rc"
}
# run_module_tests SAMPLE MODULE...: every test of the modules (full tier); MODE=tiny their
# list, then SAMPLE alone
run_module_tests() {
    local sample=$1 m n
    shift
    local filters=()
    for m in "$@"; do filters+=("$m::"); done
    n=$("$B/gpu-tests" --list --include-ignored "${filters[@]}" 2>/dev/null | grep -c ': test$')
    echo "gpu-run: ${n:-0} tests in ${filters[*]}"
    [ "${n:-0}" -gt 0 ] || return 3
    if [ "$MODE" = full ]; then
        run_tests "${filters[@]}"
    else
        run_tests --exact "$sample"
    fi
}
# test_list MODULES...: the binary's tests by module, each module's step ("MODULES" holds one
# word list a step, separated by "|"); a module no step takes fails the step and is written to
# $WORK/untaken-modules
test_list() {
    "$B/gpu-tests" --list --include-ignored 2>/dev/null | grep ': test$' | sed 's/: test$//' \
        >"$WORK/tests.txt" || return 1
    python3 - "$WORK/tests.txt" "$WORK/untaken-modules" "$@" <<'PY'
import collections, sys
tests = open(sys.argv[1]).read().split()
by_module = collections.Counter(t.split("::")[0] for t in tests)
steps = [s.split() for s in " ".join(sys.argv[3:]).split("|")]
untaken = [m for m in sorted(by_module) if not any(m in s for s in steps)]
print(f"{len(tests)} tests in {len(by_module)} modules (full tier: ignored ones included)")
for i, s in enumerate(steps):
    print(f"step {i + 1}: {sum(by_module[m] for m in s)} tests: "
          + ", ".join(f"{m} {by_module[m]}" for m in s))
for m in sorted(by_module):
    step = next((i + 1 for i, s in enumerate(steps) if m in s), None)
    print(f"module {m}: {by_module[m]} tests, step {step or 'NONE'}")
open(sys.argv[2], "w").write(" ".join(untaken))
if untaken:
    print(f"modules no step takes (run in the last): {' '.join(untaken)}")
    sys.exit(1)
PY
}
# test_step I: the I-th test step
test_step() {
    local i=$1 name=${TEST_STEPS[$1]} budget=${TEST_BUDGETS[$1]} mods
    read -r -a mods <<<"${TEST_MODULES[$i]}"
    local what="gpu-tests ${mods[*]/%/::}"
    [ "$MODE" = full ] || what="gpu-tests --list ${mods[*]/%/::}, then ${TEST_SAMPLES[$i]}"
    if [ ! -x "$B/gpu-tests" ]; then
        skip "$name" "$budget" "no gpu-tests in the bundle"
    elif [ "${mods[0]}" != backends ]; then
        step "$name" "$budget" "$what" run_module_tests "${TEST_SAMPLES[$i]}" "${mods[@]}"
    elif [ "$GPU" = 1 ]; then
        FLASH_ATTN_REQUIRE_CUDA=1 step "$name" "$budget" "$what (wgpu and CUDA; CUDA required)" \
            run_module_tests "${TEST_SAMPLES[$i]}" "${mods[@]}"
    else
        step "$name" "$budget" "$what (no NVIDIA GPU: the CUDA half skips)" \
            run_module_tests "${TEST_SAMPLES[$i]}" "${mods[@]}"
    fi
}
if [ -x "$B/gpu-tests" ]; then
    lists=()
    for m in "${TEST_MODULES[@]}"; do lists+=("$m" "|"); done
    step "tests: list" 5 "gpu-tests --list: every module in a step" test_list "${lists[@]}"
    untaken=$(cat "$WORK/untaken-modules" 2>/dev/null || true)
    [ -n "$untaken" ] && TEST_MODULES[-1]="${TEST_MODULES[-1]} $untaken"
else
    skip "tests: list" 5 "no gpu-tests in the bundle"
fi
for i in 0 1 2 3 4; do
    test_step "$i"
done

# ---- (4) the headline numbers: CUDA beside PyTorch SDPA (flash) and the wgpu kernels on the
# same shapes, then decode
if [ "$MODE" = full ]; then
    CMP=(--seq 4096,8192,16384 --batch 1 --heads 32 --head-dim 128 --dtype bf16 --causal-both)
    DECODE=(--seq 4096,8192,16384,32768 --heads 32 --kv-heads 8 --head-dim 128 --dtype f16)
    WGPU_CMP=(--variant coop,blocks --repeats 3 --roofline-scale 5 --budget-s 45)
    DECODE_WGPU=(--repeats 5 --subgroup-both)
    KV8=(--seq 4096,16384,32768 --heads 32 --kv-heads 8 --head-dim 128 --dtype f16 --repeats 5)
    MLA=(--seq 4096,16384,32768 --heads 128 --kv-heads 1 --head-dim 576 --mla-values 512
        --dtype f16 --repeats 5 --q-chunks-both)
else
    CMP=(--seq 64 --batch 1 --heads 2 --head-dim 16 --dtype bf16 --causal-both)
    DECODE=(--seq 256 --heads 4 --kv-heads 2 --head-dim 16 --dtype f16)
    WGPU_CMP=(--repeats 1 --roofline-scale 0.1)
    DECODE_WGPU=(--repeats 1)
    KV8=(--seq 256 --heads 4 --kv-heads 2 --head-dim 32 --dtype f16 --repeats 1)
    MLA=(--seq 256 --heads 16 --kv-heads 1 --head-dim 72 --mla-values 64 --dtype f16
        --repeats 1 --q-chunks-both)
fi
dry=()
[ "$GPU" = 1 ] || dry=(--dry-run)
step "compare: CUDA" 45 "cuda_bench ${CMP[*]} ${dry[*]}" \
    "$B/cuda_bench" "${CMP[@]}" --repeats 5 --json "$LOGS/cmp-cuda.json" "${dry[@]}"
step "compare: SDPA" 60 "scripts/sdpa_bench.py ${CMP[*]} ${dry[*]} (flash and cuDNN backends)" \
    python3 scripts/sdpa_bench.py "${CMP[@]}" --repeats 5 --json "$LOGS/cmp-sdpa.json" "${dry[@]}"
step "compare: wgpu" 60 "bench ${CMP[*]} ${WGPU_CMP[*]}" \
    "$B/bench" "${CMP[@]}" --algorithms tiled --pass both "${WGPU_CMP[@]}" \
    --json "$LOGS/cmp-wgpu.json"
cmp_in=()
for f in cmp-cuda cmp-sdpa cmp-wgpu; do
    [ -f "$LOGS/$f.json" ] && cmp_in+=("$LOGS/$f.json")
done
if [ ${#cmp_in[@]} -gt 0 ]; then
    step "compare: table" 10 "scripts/bench_compare.py -> compare.md" \
        python3 scripts/bench_compare.py --out-json "$LOGS/compare.json" \
        --out-md "$LOGS/compare.md" "${cmp_in[@]}"
else
    skip "compare: table" 10 "no records from the compare steps"
fi
step "decode: wgpu" 40 "bench --decode ${DECODE[*]} ${DECODE_WGPU[*]}" \
    "$B/bench" --decode "${DECODE[@]}" "${DECODE_WGPU[@]}"
step "decode 8-bit: wgpu" 25 "bench --decode ${KV8[*]} --kv-formats q8_0,e4m3" \
    "$B/bench" --decode "${KV8[@]}" --kv-formats q8_0,e4m3
# MLA's step, its decode workgroups of as many heads as hold q whole and of the most with q in
# chunks (Tuning::decode_q_chunks) side by side: the GPU default's prediction to check
step "decode MLA: wgpu" 20 "bench --decode ${MLA[*]}" "$B/bench" --decode "${MLA[@]}"
step "decode: CUDA" 20 "cuda_bench --decode ${DECODE[*]} ${dry[*]}" \
    "$B/cuda_bench" --decode "${DECODE[@]}" --repeats 5 --json "$LOGS/decode-cuda.json" "${dry[@]}"

# ---- (5) the rest while time remains: the wgpu grid, every variant side by side
left=$((DEADLINE_S - $(elapsed)))
if [ "$MODE" = full ]; then
    GRID=(--batch 1,4 --heads 8,32 --head-dim 64,128 --seq 1024,2048,4096,8192,16384
        --dtype f16,bf16,f32 --variant coop,blocks,rows --pass both --causal-both
        --algorithms tiled,naive --naive-max-seq 4096 --repeats 3 --roofline-scale 5)
else
    GRID=(--batch 1 --heads 2 --head-dim 16 --seq 64 --dtype f16,f32 --pass both
        --algorithms tiled,naive --repeats 1 --roofline-scale 0.1)
fi
if [ "$left" -ge 30 ]; then
    step "bench grid" "$((left - 5))" "bench ${GRID[*]} --budget-s $((left - 25))" \
        "$B/bench" "${GRID[@]}" --budget-s "$((left - 25))" --json "$LOGS/bench.json" \
        --markdown "$LOGS/bench.md" --plot "$OUT_DIR/bench.svg"
else
    skip "bench grid" "$left" "$left s left of the deadline, 30 needed"
fi

log "done in $(elapsed) s; $OUT_DIR/summary.md"
rm -rf "$WORK"
exit "$failed"
