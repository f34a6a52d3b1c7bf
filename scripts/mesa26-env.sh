# Sourced by the test scripts (run-tests.sh, test-fast.sh, test-full.sh, and the steps of the
# test command that run on lavapipe: the validation layer, MPI, Python, burn): where the Mesa 26
# root of scripts/ensure-mesa26.sh exists, `MESA26_ENV` holds the environment under which cargo
# and nextest start every test binary through scripts/mesa26.sh (cargo's target runner), and
# `MESA26_RUN` the prefix that starts any other program so (mpiexec's ranks, pytest's python),
# so the suite runs on lavapipe 26.1, and every step after it finds its pipelines in that
# driver's shader cache: its cooperative matrices run the coop kernels (tests/gpu/coop.rs,
# required there through FLASH_ATTN_EXPECT_COOP), and LLVM 19 compiles the suite's pipelines
# about 3x faster than the machine's Mesa 25.0.7 (docs/log/ci-time.md). Prefix a command with
# `env "${MESA26_ENV[@]}"`; not exported, so that the steps on other drivers (SwiftShader, the
# validation layer, AMD's compiler on 25.0.7) keep theirs. Without the root: empty (the
# machine's Mesa, the coop tests skip), and in CI a failure. FLASH_ATTN_MACHINE_MESA=1 asks
# for the machine's Mesa on purpose.
MESA26_ENV=()
MESA26_RUN=()
mesa26_root=${FLASH_ATTN_MESA26_ROOT:-/var/lib/flash-attn-wgpu/mesa26}
mesa26_sh="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/mesa26.sh"
if [ -n "${FLASH_ATTN_MACHINE_MESA:-}" ]; then
    echo "mesa26-env: FLASH_ATTN_MACHINE_MESA is set: the suite runs on the machine's Mesa" >&2
elif [ -e "$mesa26_root/.flash-attn-wgpu-mesa26" ]; then
    MESA26_ENV=(
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=bash $mesa26_sh"
        "FLASH_ATTN_EXPECT_COOP=1"
    )
    MESA26_RUN=(bash "$mesa26_sh")
elif [ -n "${CI:-}" ]; then
    echo "mesa26-env: no Mesa 26 root at $mesa26_root (bash scripts/ensure-mesa26.sh makes it)" >&2
    exit 1
else
    echo "mesa26-env: no Mesa 26 root (bash scripts/ensure-mesa26.sh): the suite runs on the machine's Mesa, the coop tests skip" >&2
fi
