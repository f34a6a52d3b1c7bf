#!/usr/bin/env bash
# The test suite, as the README's test command runs it: with cargo-nextest where the machine
# has it (every test in a process of its own, two at a time across all the test binaries, so
# no core idles while one binary's longest test finishes: on lavapipe the suite is LLVM
# compiling shaders, seconds a pipeline), else `cargo test`; then the doc tests, which
# nextest does not run. Arguments go to both (e.g. --features cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
# On lavapipe (llvmpipe) the suite is LLVM compiling pipelines at their first dispatch; without
# its optimization passes a compile takes about a quarter less, and the tests' tiny sizes run
# no slower for it (docs/PERFORMANCE.md, "CI time"). Only llvmpipe reads this variable; set it
# empty to test the optimized code.
export GALLIVM_PERF=${GALLIVM_PERF-nopt}
# the wgpu halves of tests/gpu/backends.rs must run here (tests/common/mod.rs: they skip only
# where wgpu has no adapter and this is unset, so that an NVIDIA machine runs the CUDA half)
export FLASH_ATTN_REQUIRE_WGPU=1
# The CI tier's pipeline budget (issue 27: the suite compiles a bounded set; issue 46: the
# same set every run, at most 450). Every wgpu pipeline the tests create is logged, and the
# distinct ones counted at the end. The property tests draw fresh cases whose pipelines are a
# fixed slot's (tests/common/pipelines.rs), so the count does not move with their draws; a new
# test should reuse the shapes, dtypes and modifiers other tests compile (the count's report
# lists the tests that compile pipelines no other test does). Dawn's replays compile in
# Node.js and are not counted here. 460 since issue 52's trainable tensors: their two kernels
# (three snippets' gradient kernels and the sum), the dQ and naive dS kernels that keep the
# scores, and one more snippet's attention pipelines, 8 more than the 445 before (about 20 s
# of lavapipe compiling; docs/log/ci-time.md). 470 since issue 53's latent cache: its tests
# reach MLA's 576/512 in bf16 (decode and the blocks prefill) and the tiled prefill of a cache
# of narrower values, and the dQ kernels' summing form of issue 52 replaced the kept-score
# ones: 460 in all, at the old budget exactly, so 10 of headroom. 490 since issues 62 and 63:
# 484 in all. The blocks of a call (tests/gpu/call_blocks.rs: 31 distinct pipelines, rows,
# blocks and naive with window, ALiBi, user code and dropout, f32; most shared with other
# tests) and context parallelism at 2-4 ranks (15, its ranks' threads), the wave64 tiles
# (variants: 6 of their own); nextest's time did not move (466 s against 465 s at 460). 530
# since issue 66: the coop kernels run (tests/gpu/coop.rs: 33 pipelines of their own, forward,
# dK/dV and dQ at 8x8x8, about 16 s of test time), on lavapipe 26.1, whose LLVM 19 compiles
# a pipeline in about a third of 25.0.7's time: 521 in all. 540 since the decode of an 8-bit
# cache in narrow columns (NVIDIA, Apple, wave64 GCN: tests/gpu/kvcache.rs, q8_0 and E4M3, with
# and without lanes): 4 more, and the figure had reached 525-527 (docs/TESTING.md). 545 since
# NVIDIA's blocks tiles (tests/gpu/variants.rs, at head dims 64 and 96): up to 6 more.
CI_PIPELINE_BUDGET=${CI_PIPELINE_BUDGET:-545}
plog=$(mktemp -d)
stats=""
# (the compiler statistics' folder too, also when a chip fails and set -e leaves early)
trap 'rm -rf "$plog" ${stats:+"$stats"}' EXIT
export FLASH_ATTN_PIPELINE_LOG=$plog
# The suite on Mesa 26.1's lavapipe where its root exists (issue 66: the coop kernels run
# there, and its LLVM 19 compiles pipelines about 3x faster): MESA26_ENV.
. scripts/mesa26-env.sh
if cargo nextest --version >/dev/null 2>&1; then
    env "${MESA26_ENV[@]}" cargo nextest run --no-fail-fast "$@"
else
    echo "run-tests: cargo-nextest not found; cargo test runs the test binaries one by one" >&2
    env "${MESA26_ENV[@]}" cargo test --tests "$@"
fi
cargo test --doc "$@"
bash scripts/pipeline-count.sh "$plog" "$CI_PIPELINE_BUDGET"
# Two more looks at the same code (issue 47): the Khronos validation layer over a sample, on
# lavapipe while its shader cache is warm from the suite; then a sample of the suite on a second
# Vulkan driver, SwiftShader, each kernel family in turn. Both come with Debian's chromium
# (scripts/ensure-web.sh); CI requires them, elsewhere they skip with a message where missing.
if [ -n "${CI:-}" ]; then
    export FLASH_ATTN_REQUIRE_VALIDATION=1 FLASH_ATTN_REQUIRE_SWIFTSHADER=1
fi
bash scripts/validation-layer.sh "$@"
bash scripts/swiftshader-tier.sh "$@"
# A 16-wide subgroup (issue 62): lavapipe with 512-bit vectors (LP_NATIVE_VECTOR_WIDTH=512, on a
# processor with AVX-512) reports subgroup 16 and runs every subgroup operation correctly (1024
# and 2048 report 32 and 64 with wrong lane ids and reductions: no tier for them). The rows
# family's and the decode kernel's lane paths at that width against the reference; the decode
# kernel's 32- and 64-wide text differs from its 16-wide only in the width (a unit test).
if grep -qw avx512f /proc/cpuinfo 2>/dev/null && cargo nextest --version >/dev/null 2>&1; then
    env "${MESA26_ENV[@]}" LP_NATIVE_VECTOR_WIDTH=512 FLASH_ATTN_EXPECT_SUBGROUP=16 \
        cargo nextest run "$@" -E \
        'test(=variants::every_variant_matches_reference_at_odd_sizes) | test(=decode::the_subgroup_path_runs_at_the_adapters_own_width)'
else
    echo "run-tests: no AVX-512 (or no nextest): the 16-wide subgroup tier is skipped" >&2
fi
# The rustdoc builds without a warning (broken links included; lib.rs denies missing docs), with
# the features asked for (docs.rs builds with `cuda`) and with the default ones (a user's
# `cargo doc`).
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps "$@"
if [ $# -gt 0 ]; then
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps
fi
# The GPU vendors' compilers over Mesa's no-op DRM shims (scripts/compiler-stats.sh): the
# pipelines the planner picks for forward, backward and decode calls at head dims 64 and 128 in
# f16 and f32, and the 8-bit decode. Each chip fails on a compile failure, or spills, scratch,
# local memory or occupancy past its vendor's floors (docs/log/compilers.md) beyond the misses
# recorded in examples/compiler_stats.rs (MISSES).
# - Issue 62, the machine's Mesa 25.0.7: AMD's ACO for RDNA3 with cooperative matrices
#   (navi31), an RDNA3.5 laptop (gfx1150) and a wave64 GCN laptop (renoir);
# - issue 66, the Mesa 26.1 root (scripts/ensure-mesa26.sh): NVIDIA GA100 (NAK), Apple M1
#   (AGX), Adreno 730 (ir3) and RADV 26.1 on gfx1201, navi31 and vega20 (wave64).
# The tool compiles on one thread, so two chips run at a time: 74 s -> about 40 s in all.
# Each entry: a chip and its arguments (the 25.0.7 chips compile the whole sample, the table
# written too; the 26.1 chips the planned pipelines).
stats=$(mktemp -d)
chips=()
if [ -e /usr/lib/x86_64-linux-gnu/libamdgpu_noop_drm_shim.so ]; then
    for chip in navi31 gfx1150 renoir; do
        chips+=("$chip --check --markdown $stats/$chip.md")
    done
elif [ -n "${CI:-}" ]; then
    echo "run-tests: no mesa-drm-shim (bash scripts/ensure-vulkan.sh installs it)" >&2
    exit 1
else
    echo "run-tests: no mesa-drm-shim: AMD's compiler statistics on Mesa 25.0.7 skipped" >&2
fi
# (MESA26_ENV is set where the root exists: mesa26-env.sh; in CI its absence failed above)
if [ ${#MESA26_ENV[@]} -gt 0 ]; then
    for chip in ga100 m1 a730 amd26:gfx1201 amd26:navi31 amd26:vega20; do
        chips+=("$chip --check --planned-only")
    done
else
    echo "run-tests: no Mesa 26 root: other vendors' compiler statistics skipped" >&2
fi
if [ ${#chips[@]} -gt 0 ]; then
    cargo build --quiet --example compiler_stats "$@"
    # xargs exits non-zero when any chip fails; each chip's own message says which
    printf '%s\n' "${chips[@]}" | COMPILER_STATS_BIN=target/debug/examples/compiler_stats \
        xargs -P 2 -L 1 bash scripts/compiler-stats.sh >/dev/null
fi
# Context parallelism over MPI at 2 and 4 ranks (issue 63: scripts/mpi-check.sh).
bash scripts/mpi-check.sh "$@"
# The public API against its committed snapshot (issue 61): a change to it is made on purpose,
# with `bash scripts/public-api.sh --bless` and a CHANGELOG entry.
bash scripts/public-api.sh
