"""Context parallelism from Python (flash_attn_wgpu.distributed, over mpi4py): mpi_check.py
under ``mpiexec -n 2`` and ``-n 4``, each rank on the default adapter, against the float64
reference. Skipped where mpiexec or mpi4py is missing, unless FLASH_ATTN_REQUIRE_MPI is set
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


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_ring_over_mpi_ranks_is_the_whole_call(ranks):
    why = _mpi()
    if why is not None:
        if os.environ.get("FLASH_ATTN_REQUIRE_MPI"):
            pytest.fail(why)
        pytest.skip(why)
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run(
        ["mpiexec", "-n", str(ranks), sys.executable, os.path.join(here, "mpi_check.py")],
        cwd=here, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"({ranks} ranks" in r.stdout and "3 passed, 0 failed" in r.stdout, r.stdout
