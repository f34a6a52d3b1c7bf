#!/usr/bin/env bash
# The Khronos validation layer over a sample of the GPU tests (issue 47): every kernel family
# (rows, blocks, naive), every pass (forward, dQ, dK/dV, the bias and sinks gradients), the
# decode, merge, KV-cache, paged, split-window, view, interop and concurrency paths, with
# synchronization validation on. Fails on any validation error that the allow-list in
# validation_report.py does not name exactly, and when the loader did not insert the layer.
#
# The layer ships in Debian's chromium package (ensure-web.sh installs it) without a manifest:
# one is written to a temporary VK_LAYER_PATH. It runs on lavapipe after run-tests.sh's suite,
# whose pipelines Mesa's disk cache then holds, so the sample costs the layer's checks and
# the tests' dispatches, not compiles. The tests run in one process (libtest, two threads),
# whose stdout holds every message of the layer.
# Arguments go to cargo (e.g. --features cuda). Skips where the layer is missing, unless
# FLASH_ATTN_REQUIRE_VALIDATION is set (CI's run-tests.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
LIB=${VK_VALIDATION_LAYER_LIB:-/usr/lib/chromium/libVkLayer_khronos_validation.so}
. scripts/chromium-part.sh
chromium_part "$LIB" FLASH_ATTN_REQUIRE_VALIDATION validation-layer
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/VkLayer_khronos_validation.json" <<EOF
{
  "file_format_version": "1.2.0",
  "layer": {
    "name": "VK_LAYER_KHRONOS_validation",
    "type": "GLOBAL",
    "library_path": "$LIB",
    "api_version": "1.3.0",
    "implementation_version": "1",
    "description": "Khronos validation layer (Debian's chromium package)"
  }
}
EOF
export VK_LAYER_PATH=$dir VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation
export VK_KHRONOS_VALIDATION_VALIDATE_SYNC=true
export VK_KHRONOS_VALIDATION_DEBUG_ACTION=VK_DBG_LAYER_ACTION_LOG_MSG
# the layer's messages go to the process's stdout (a log file would be truncated by every
# instance, and each test makes its own), which libtest does not capture; the loader's note
# that it inserted the layer goes to stderr
export VK_LOADER_DEBUG=layer
# every message, not the first ten of each kind
export VK_KHRONOS_VALIDATION_ENABLE_MESSAGE_LIMIT=false
# lavapipe, as the suite before it (a SwiftShader run in the same shell would set this)
unset VK_DRIVER_FILES
export WGPU_ADAPTER_NAME=llvmpipe FLASH_ATTN_REQUIRE_WGPU=1
unset FLASH_ATTN_PIPELINE_LOG
export GALLIVM_PERF=${GALLIVM_PERF-nopt}
start=$SECONDS
tests=0
cargo test "$@" --test gpu -- --test-threads 2 \
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
