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
# The CI tier's pipeline budget (issue 27: the suite compiles a bounded set): every wgpu
# pipeline the tests create is logged, and the distinct ones counted at the end (362 at
# 2026-12-03; 413 at 2026-12-04 with the user modifiers' tests, each snippet its own
# pipelines; the property tests draw theirs at random; Dawn's replays compile in Node.js and
# are not counted here; 434 at 2026-12-04 with the 8-bit caches' tests; the head dims' tests,
# tests/gpu/head_dims.rs, add about 40: values of their own dim are pipelines of their own;
# 478 measured with them, the property tests' random draws a few either side). Issue 27's
# bound for the whole suite is 500, now the budget.
CI_PIPELINE_BUDGET=${CI_PIPELINE_BUDGET:-500}
plog=$(mktemp -d)
trap 'rm -rf "$plog"' EXIT
export FLASH_ATTN_PIPELINE_LOG=$plog
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --no-fail-fast "$@"
else
    echo "run-tests: cargo-nextest not found; cargo test runs the test binaries one by one" >&2
    cargo test --tests "$@"
fi
cargo test --doc "$@"
bash scripts/pipeline-count.sh "$plog" "$CI_PIPELINE_BUDGET"
# The rustdoc builds without a warning (broken links included; lib.rs denies missing docs).
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps "$@"
