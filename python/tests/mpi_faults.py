"""No exchange of a context-parallel call from Python waits past the deadline, run under
``mpiexec -n 2`` (test_distributed.py does): the last rank leaves the call at each of its
exchanges in turn (its communicator raises at the k-th message it would receive: before the
first exchange, between each two, at the last), the forward's and then the handle's
backward's, and the other rank must fail within FLASH_ATTN_MPI_TIMEOUT_S (2 s here) naming
it. The communicator offers only what the library's transport uses (Get_rank, Get_size,
Irecv, Isend), so a blocking collective of mpi4py's (allreduce, bcast: no deadline) anywhere in
the path fails here too. Prints ``N passed, M failed`` on rank 0; exits 1 on a failure,
without MPI's finalize (the abandoned transfers stay with MPI)."""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import flash_attn_wgpu as fa
import flash_attn_wgpu.distributed as dist

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
leaving = rank == size - 1
DEADLINE_S = 2


class Leaving:
    """A communicator that counts its exchanges (one receive each) and raises at exchange
    ``leave_at``: the rank leaves the call there."""

    def __init__(self, comm):
        self._comm, self.leave_at, self.exchanges = comm, None, 0

    def Get_rank(self):
        return self._comm.Get_rank()

    def Get_size(self):
        return self._comm.Get_size()

    def Irecv(self, *args, **kwargs):
        if self.exchanges == self.leave_at:
            raise RuntimeError(f"rank {rank} leaves the call at exchange {self.leave_at}")
        self.exchanges += 1
        return self._comm.Irecv(*args, **kwargs)

    def Isend(self, *args, **kwargs):
        return self._comm.Isend(*args, **kwargs)


rng = np.random.default_rng(0)
q = rng.standard_normal((1, 12, 2, 8)).astype(np.float32)
k = rng.standard_normal((1, 12, 1, 8)).astype(np.float32)


def forward(comm):
    return dist.zigzag_ring_flash_attn_func(q, k, k, causal=True, return_handle=True,
                                            group=comm)


def exchanges():
    """The exchanges of a forward and of its backward, counted on a whole call (under the
    default deadline: the first call compiles the pipelines)."""
    comm = Leaving(world.Dup())
    call = forward(comm)
    n_forward = comm.exchanges
    call.backward(np.ones_like(call.out))
    return n_forward, comm.exchanges - n_forward


def leave_at(phase, at):
    """The last rank leaves `phase` (forward, backward) at its exchange `at`."""
    # a fresh communicator: a message the case abandons cannot reach the next one
    comm = Leaving(world.Dup())
    call = forward(comm) if phase == "backward" else None
    if leaving:
        comm.leave_at = comm.exchanges + at
    start = time.monotonic()
    try:
        if call is None:
            forward(comm)
        else:
            call.backward(np.ones_like(call.out))
    except fa.FlashAttnError as e:
        took = time.monotonic() - start
        if leaving:
            assert "leaves the call" in str(e), str(e)
        else:
            assert f"no message from rank {size - 1} within {DEADLINE_S} s" in str(e), str(e)
            assert took < DEADLINE_S + 8, f"failed after {took:.1f} s"
        return
    raise AssertionError("the call went on without the rank that left")


n_forward, n_backward = exchanges()
os.environ["FLASH_ATTN_MPI_TIMEOUT_S"] = str(DEADLINE_S)
cases = [("forward", at) for at in range(n_forward)]
cases += [("backward", at) for at in range(n_backward)]
passed = failed = 0
for phase, at in cases:
    try:
        leave_at(phase, at)
        ok = True
    except Exception as e:  # noqa: BLE001 (every rank must reach the vote below)
        print(f"rank {rank}/{size}: FAILED leaving the {phase} at exchange {at}: {e}",
              file=sys.stderr, flush=True)
        ok = False
    if all(world.allgather(ok)):
        passed += 1
    else:
        failed += 1
if rank == 0:
    print(f"mpi_faults ({size} ranks; {n_forward} exchanges forward, {n_backward} backward): "
          f"{passed} passed, {failed} failed", flush=True)
sys.stdout.flush()
sys.stderr.flush()
os._exit(1 if failed or not cases else 0)
