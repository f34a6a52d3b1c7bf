"""Context parallelism from Python (flash_attn_wgpu.distributed, over mpi4py): mpi_check.py
under ``mpiexec -n 2`` and ``-n 4``, each rank on the default adapter, against the float64
reference; mpi_faults.py under ``-n 2`` (a rank that leaves at any exchange: the other fails
within the deadline). Skipped where mpiexec or mpi4py is missing, unless FLASH_ATTN_REQUIRE_MPI is set
(CI sets it: scripts/ensure-mpi.sh installs MPI)."""

import os
import shutil
import subprocess
import sys

import pytest


def _mpi():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed"
    if shutil.which("mpiexec") is None:
        return "no mpiexec (bash scripts/ensure-mpi.sh installs MPICH)"
    return None


def _run(ranks, script):
    why = _mpi()
    if why is not None:
        if os.environ.get("FLASH_ATTN_REQUIRE_MPI"):
            pytest.fail(why)
        pytest.skip(why)
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run(
        ["mpiexec", "-n", str(ranks), sys.executable, os.path.join(here, script)],
        cwd=here, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_ring_over_mpi_ranks_is_the_whole_call(ranks):
    out = _run(ranks, "mpi_check.py")
    assert f"({ranks} ranks" in out and "5 passed, 0 failed" in out, out


def test_a_rank_that_leaves_at_any_exchange_fails_the_others_within_the_deadline():
    out = _run(2, "mpi_faults.py")
    assert "(2 ranks;" in out and " 0 failed" in out and " 0 passed" not in out, out
