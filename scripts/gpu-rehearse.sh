#!/usr/bin/env bash
# The GPU run rehearsed here, in CI, so that its one chance on a GPU machine is not wasted:
# builds the bundle (scripts/gpu-bundle.sh, from the test suite's debug builds unless
# PROFILE=release), copies the working tree as the device tool sends
# it (tracked and untracked-not-ignored files, plus the carried paths), and runs the exact
# command scripts/gpu-run-command.sh prints, with an empty $OUT, on this machine's adapter
# (lavapipe) at tiny sizes (MODE=tiny), the loader unpacked from the carried packages into a
# private root rather than taken from the system. Then it checks what would come back:
#   - every step ran or was skipped with a reason, none failed;
#   - NVRTC loaded (the bundle's, unpacked, where the machine has none), and the test steps
#     take every module of tests/gpu/main.rs (each lists its tests and runs one here);
#   - at most 8 files under $OUT, none more than 2 folders down, summary.md among them;
#   - a second run, killed part-way (once a step has finished, or after half the first run's
#     time, at most 60 s), still leaves a summary.md with the steps it finished;
#   - the bundle's backends:: tests pass with the Vulkan driver hidden (their CUDA half never
#     waits on wgpu).
# The CUDA and SDPA steps run up to their argument checks (--dry-run) where there is no GPU.
# Run 1 runs under the Khronos validation layer (validation-env.sh): every Vulkan step of the
# GPU run (the adapter, the test steps, the wgpu benches) must make no validation error
# (validation_report.py over the steps' logs). Where the layer is missing, run 1 goes without
# it, unless FLASH_ATTN_REQUIRE_VALIDATION is set (CI's run-tests.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
export GALLIVM_PERF=${GALLIVM_PERF-nopt} # as scripts/run-tests.sh: the suite's shader cache
log() { echo "gpu-rehearse: $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

PROFILE=${PROFILE:-dev} bash scripts/gpu-bundle.sh
command=$(bash scripts/gpu-run-command.sh --command)
mapfile -t carry < <(bash scripts/gpu-run-command.sh --carry)
[ "${#command}" -le 2000 ] || fail "the command has ${#command} characters, 2000 allowed"
[ "${#carry[@]}" -le 8 ] || fail "${#carry[@]} carried paths, 8 allowed"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/repo"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$tmp/repo"
for p in "${carry[@]}"; do
    cp -r --parents "$p" "$tmp/repo/"
done
mib=$(du -sm "$tmp/repo" | cut -f1)
log "the working tree that travels: $mib MiB (64 allowed)"
[ "$mib" -le 64 ] || fail "the working tree is $mib MiB"

# run_command OUT_DIR GL_ROOT: the device tool's run, here
run_command() {
    (cd "$tmp/repo" && OUT=$1 MODE=tiny GL_ROOT=$2 bash -c "$command")
}

check_out() { # check_out OUT_DIR
    local n deep
    n=$(find "$1" -type f | wc -l)
    deep=$(find "$1" -mindepth 4 -type f | wc -l)
    [ "$n" -le 8 ] || fail "$n files under \$OUT, 8 come back: $(find "$1" -type f)"
    [ "$deep" -eq 0 ] || fail "files more than 2 folders down: $(find "$1" -mindepth 4 -type f)"
    [ -s "$1/summary.md" ] || fail "no summary.md under \$OUT"
}

LIB=${VK_VALIDATION_LAYER_LIB:-/usr/lib/chromium/libVkLayer_khronos_validation.so}
layer=no
if [ -f "$LIB" ]; then
    layer=yes
elif [ -n "${FLASH_ATTN_REQUIRE_VALIDATION:-}" ]; then
    fail "$LIB not found (scripts/ensure-web.sh installs chromium)"
else
    log "$LIB not found: run 1 goes without the validation layer"
fi
log "run 1: $command (MODE=tiny, validation layer: $layer)"
t0=$(date +%s)
(
    if [ "$layer" = yes ]; then
        . scripts/validation-env.sh
        mkdir -p "$tmp/layer"
        validation_env "$tmp/layer"
    fi
    run_command "$tmp/out1" "$tmp/root1"
) || fail "the run exited $? (see $tmp/out1/summary.md)"
secs=$(($(date +%s) - t0))
check_out "$tmp/out1"
cat "$tmp/out1/summary.md" >&2
steps=$(grep -c '^| [a-zA-Z]' "$tmp/out1/summary.md" || true)
# every expected step has a row, ok or skipped with its reason
for s in "machine" "NVRTC" "adapter" "CUDA device" "tests: list" "tests: attention" \
    "tests: every backend" "tests: decode, caches" "tests: modifiers, layouts" "tests: edges" \
    "compare: CUDA" "compare: SDPA" "compare: wgpu" "compare: table" "decode: wgpu" \
    "decode 8-bit: wgpu" "decode MLA: wgpu" "decode: CUDA" "bench grid"; do
    row=$(grep -F "| $s | " "$tmp/out1/summary.md" | head -n 1)
    [ -n "$row" ] || fail "no row for step '$s'"
    case "$row" in
        "| $s | ok |"* | "| $s | skipped: "?*) ;;
        *) fail "step '$s': $row" ;;
    esac
done
grep -q 'vulkan loader: .*'"$tmp/root1" "$tmp/out1/summary.md" ||
    fail "the loader was not taken from the carried packages"
mkdir -p "$tmp/logs1"
tar -xzf "$tmp/out1/logs.tar.gz" -C "$tmp/logs1"
# NVRTC loaded: the machine's own, or (here, with none) the bundle's unpacked
grep -q 'NVRTC [0-9][0-9]*\.[0-9]' "$tmp/logs1/logs/NVRTC.log" ||
    fail "NVRTC did not load: $(cat "$tmp/logs1/logs/NVRTC.log")"
# The full mode's test steps take every module of the gpu test binary (issue 47): each `mod`
# of tests/gpu/main.rs has its step in the list the run made from the binary's own list
modules=$(sed -n 's/^mod \([a-z_0-9]*\);$/\1/p' tests/gpu/main.rs | grep -vx common)
[ -n "$modules" ] || fail "no modules read from tests/gpu/main.rs"
for m in $modules; do
    grep -qE "^module $m: [0-9]+ tests, step [0-9]+$" "$tmp/logs1/logs/tests-list.log" ||
        fail "gpu test module $m is in no test step of scripts/gpu-run.sh: $(grep "module $m:" "$tmp/logs1/logs/tests-list.log")"
done
log "run 1: $(grep -o 'NVRTC [0-9.]*' "$tmp/logs1/logs/NVRTC.log" | head -n 1); every gpu test module in a step: $(head -n 1 "$tmp/logs1/logs/tests-list.log")"
if [ "$layer" = yes ]; then
    # each step's log holds its output and its errors: the layer's messages and the loader's
    cat "$tmp"/logs1/logs/*.log >"$tmp/layer.log"
    python3 scripts/validation_report.py "$tmp/layer.log" "$tmp/layer.log" >&2 ||
        fail "the GPU run's steps under the validation layer (above)"
fi
log "run 1: $steps rows, $secs s, $(find "$tmp/out1" -type f | wc -l) files"

# The CUDA half of backends:: must not depend on Vulkan (issue 47): with no Vulkan driver the
# bundle's suite still passes every backends:: test, each wgpu half skipped with its reason
# (the CUDA half runs first; here, with no CUDA device, it is skipped with its own reason).
xz -dc "${GPU_BIN:-gpu-bin}/gpu-tests.xz" >"$tmp/gpu-tests"
chmod +x "$tmp/gpu-tests"
log "backends:: with the Vulkan driver hidden"
nowgpu=$(env -u FLASH_ATTN_REQUIRE_WGPU WGPU_BACKEND=vulkan VK_DRIVER_FILES="$tmp/none.json" \
    VK_ICD_FILENAMES="$tmp/none.json" "$tmp/gpu-tests" --test-threads 2 --nocapture backends:: 2>&1) ||
    fail "backends:: with no Vulkan driver: $(tail -n 30 <<<"$nowgpu")"
grep -q 'wgpu half skipped' <<<"$nowgpu" || fail "backends:: with no Vulkan driver ran a wgpu half"
grep -qE '^test result: ok\. [1-9]' <<<"$nowgpu" || fail "backends:: with no Vulkan driver ran no test"
log "backends:: with no Vulkan driver: $(grep -E '^test result' <<<"$nowgpu")"

kill_after=$((secs / 2))
[ "$kill_after" -gt 60 ] && kill_after=60
[ "$kill_after" -lt 5 ] && kill_after=5
log "run 2: killed once a step has finished, after $kill_after s at most"
set +e
(cd "$tmp/repo" && OUT=$tmp/out2 MODE=tiny GL_ROOT=$tmp/root2 exec setsid bash -c "$command") \
    >"$tmp/run2.log" 2>&1 &
pid=$!
# killed once a step has finished (and the next begun), or at kill_after at the latest
finished() {
    local n
    n=$(grep -cE '^\| [a-zA-Z][^|]* \| (ok|skipped|\*\*FAILED)' "$tmp/out2/summary.md" 2>/dev/null)
    echo "${n:-0}"
}
waited=0
while [ "$waited" -lt $((kill_after * 2)) ] && [ "$(finished)" -lt 1 ]; do
    sleep 0.5
    waited=$((waited + 1))
done
sleep 1
kill -KILL -- "-$pid" 2>/dev/null
wait "$pid" 2>/dev/null
set -e
check_out "$tmp/out2"
done2=$(finished)
[ "$done2" -ge 1 ] || fail "the killed run's summary.md lists no finished step"
log "run 2: killed after $((waited / 2 + 1)) s (at most $kill_after) with $done2 steps in its summary.md"
log "passed"
