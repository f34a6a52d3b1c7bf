#!/usr/bin/env bash
# The SwiftShader tier (issues 47 and 48): the GPU tests again on a second native Vulkan
# driver, SwiftShader (from Debian's chromium package, which ensure-web.sh installs): subgroup
# size 4 where lavapipe's is 8, no shader f16 (f16 runs packed), 1 GiB bindings, and a `max`
# and an `exp2` that drop a NaN operand (docs/SEMANTICS.md, "Guarantees"). What differs between
# the two drivers is a defect to fix or a documented driver bug.
#
# Two runs: the adapter's default family (rows, SwiftShader being a CPU driver) over the
# modules of tests/gpu listed below (every module in the full tier), whose `variants::`,
# `nonfinite::`, `hidden::` and `dtypes::` tests cover the blocks kernels and the naive path
# too; then, in the full tier, the blocks family forced
# (`FLASH_ATTN_WGPU_VARIANT=blocks`) over the tests that run the adapter's default family
# (`backends::`, the property tests). Two tests whose cost is SwiftShader executing
# hundreds of MiB are left out (`limits::more_than_65535_workgroups...`: 30 s on rows, 420 s on
# blocks; `errors::naive_reports_its_memory_limit...`: 70-140 s), and one whose windows
# `backends::` runs too (`variants::..._with_sliding_windows`: 60 s); the split test past one
# binding runs with a 4 MiB binding (FLASH_ATTN_TEST_MAX_BINDING) rather than SwiftShader's
# 1 GiB, the same windows code at a size that fits (at 128 MiB it took 340 s).
# Arguments go to cargo (e.g. --features cuda). Skips with a message where the driver is
# missing, unless FLASH_ATTN_REQUIRE_SWIFTSHADER is set (CI's run-tests.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
ICD=${SWIFTSHADER_ICD:-/usr/lib/chromium/vk_swiftshader_icd.json}
. scripts/chromium-part.sh
chromium_part "$ICD" FLASH_ATTN_REQUIRE_SWIFTSHADER swiftshader-tier
export VK_DRIVER_FILES=$ICD
# a context on any other adapter is an error, not a quiet run on lavapipe
export WGPU_ADAPTER_NAME=SwiftShader
export FLASH_ATTN_REQUIRE_WGPU=1
export FLASH_ATTN_TEST_MAX_BINDING=$((4 << 20))
# the CI pipeline budget counts lavapipe's compiles only
unset FLASH_ATTN_PIPELINE_LOG
start=$SECONDS
# One process per run (libtest, two threads) rather than nextest's process per test:
# SwiftShader keeps no pipeline cache on disk, so tests in one process share the context's
# compiled pipelines (136 s for the first run against 261 s under nextest).
# The CI tier's first run takes the modules where the driver's differences bite (subgroup 4
# in every variant's lanes, the decode and the caches; packed f16; the max and exp2 that drop
# NaN; 1 GiB bindings): 202 s for the whole CI tier, about 70 s for these (docs/log/ci-time.md).
# The full tier (FLASH_ATTN_TEST_FULL) runs every module.
modules=(variants:: forward:: backward:: dtypes:: decode:: kvcache:: merge:: nonfinite:: hidden::
    errors:: limits::)
[ -z "${FLASH_ATTN_TEST_FULL:-}" ] || modules=()
echo "swiftshader-tier: the default family (rows): ${modules[*]:-every module}" >&2
cargo test "$@" --test gpu -- --test-threads 2 "${modules[@]}" \
    --skip limits::more_than_65535_workgroups_are_folded_into_two_dimensions \
    --skip errors::naive_reports_its_memory_limit_and_tiled_has_none \
    --skip variants::every_variant_and_the_naive_path_match_the_reference_with_sliding_windows
# The blocks family forced over the tests that run the adapter's default family: the full tier
# (the CI tier's run above has every family's kernels on this driver in variants::, nonfinite::,
# hidden:: and dtypes::; these add the API paths and the property tests' shapes on the blocks
# kernels: 62-67 s, moved for the CI time budget, docs/log/ci-time.md).
if [ -n "${FLASH_ATTN_TEST_FULL:-}" ]; then
    echo "swiftshader-tier: the blocks family forced" >&2
    FLASH_ATTN_WGPU_VARIANT=blocks cargo test "$@" --test gpu -- --test-threads 2 \
        backends:: combinations:: fuzz::
else
    echo "swiftshader-tier: the blocks family forced over backends::, combinations:: and fuzz:: is the full tier's" >&2
fi
echo "swiftshader-tier: passed in $((SECONDS - start)) s" >&2
