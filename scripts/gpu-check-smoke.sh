#!/usr/bin/env bash
# Smoke test of the GPU check on this machine's adapter (lavapipe in CI): builds, in release,
# what scripts/gpu-check.sh needs (scripts/gpu-check-build.sh, into gpu-bin/) and runs it
# with MODE=smoke: the adapter summary, one test of each test binary, a tiny bench grid in
# f32/f16/bf16 (JSON, Markdown, SVG) and the summary, into gpu-check-out/smoke/.
set -euo pipefail
cd "$(dirname "$0")/.."
# As scripts/run-tests.sh: llvmpipe without its LLVM passes, so the smoke run finds the
# pipelines the suite compiled (with the same setting) in Mesa's shader cache.
export GALLIVM_PERF=${GALLIVM_PERF-nopt}
GPU_BIN=${GPU_BIN:-gpu-bin} bash scripts/gpu-check-build.sh
MODE=smoke BIN_DIR=${GPU_BIN:-gpu-bin} OUT_DIR=${OUT_DIR:-gpu-check-out/smoke} bash scripts/gpu-check.sh
