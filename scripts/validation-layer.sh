#!/usr/bin/env bash
# The Khronos validation layer over a sample of the GPU tests (issue 47): every kernel family
# (rows, blocks, naive), every pass (forward, dQ, dK/dV, the bias and sinks gradients), the
# decode, merge, KV-cache, paged, split-window, view, interop and concurrency paths, with
# synchronization validation on. Fails on any validation error (validation_report.py), and
# when the loader did not insert the layer. The GPU run's Vulkan steps get the same layer in
# their rehearsal (gpu-rehearse.sh).
#
# The layer ships in Debian's chromium package (ensure-web.sh installs it) without a manifest:
# validation-env.sh writes one to a temporary VK_LAYER_PATH. It runs on lavapipe after
# run-tests.sh's suite, whose pipelines Mesa's disk cache then holds, so the sample costs the
# layer's checks and the tests' dispatches, not compiles. The tests run in one process (libtest, two threads),
# whose stdout holds every message of the layer.
# Arguments go to cargo (e.g. --features cuda). Skips where the layer is missing, unless
# FLASH_ATTN_REQUIRE_VALIDATION is set (CI's run-tests.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
LIB=${VK_VALIDATION_LAYER_LIB:-/usr/lib/chromium/libVkLayer_khronos_validation.so}
. scripts/chromium-part.sh
. scripts/validation-env.sh
chromium_part "$LIB" FLASH_ATTN_REQUIRE_VALIDATION validation-layer
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
validation_env "$dir"
# lavapipe, as the suite before it (a SwiftShader run in the same shell would set this)
unset VK_DRIVER_FILES
export WGPU_ADAPTER_NAME=llvmpipe FLASH_ATTN_REQUIRE_WGPU=1
unset FLASH_ATTN_PIPELINE_LOG
export GALLIVM_PERF=${GALLIVM_PERF-nopt}
# on lavapipe 26.1 where the suite ran there (its shader cache is warm): scripts/mesa26-env.sh
. scripts/mesa26-env.sh
start=$SECONDS
tests=0
env "${MESA26_ENV[@]}" cargo test "$@" --test gpu -- --test-threads 2 \
    backends:: interop:: concurrency:: merge:: paged:: views:: bias:: score_mod:: \
    nonfinite::nan_and_inf_reach_the_rows_that_see_them_and_no_other_on_every_family \
    split::query_and_key_windows_merge_exactly \
    kvcache::appending_then_attending_equals_attention_over_each_batch_keys \
    kvcache::eight_bit_caches_append_on_the_gpu_and_attend_as_the_reference_over_their_values \
    decode::decode_takes_every_mask_and_score_modifier \
    >"$dir/stdout" 2>"$dir/stderr" || tests=$?
if [ "$tests" != 0 ]; then
    grep -v -E '^(Validation|  |$)' "$dir/stdout" | tail -40 >&2
    tail -40 "$dir/stderr" >&2
fi
grep -E '^test result' "$dir/stdout" >&2 || true
python3 scripts/validation_report.py "$dir/stdout" "$dir/stderr"
[ "$tests" = 0 ] || { echo "validation-layer: the tests failed under the layer" >&2; exit 1; }
echo "validation-layer: passed in $((SECONDS - start)) s" >&2
