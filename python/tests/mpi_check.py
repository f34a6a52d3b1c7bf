"""Context parallelism from Python, run under ``mpiexec -n R`` (test_distributed.py does, at 2
and 4 ranks): each rank its zigzag (or contiguous) chunks, against the float64 numpy reference
of the whole call, forward and backward; a rank that disagrees makes every rank raise, naming
it. Prints ``N passed, M failed`` on rank 0; exits 1 on a failure."""

import sys

import numpy as np
from mpi4py import MPI

import flash_attn_wgpu as fa
import flash_attn_wgpu.distributed as dist
from reference import attention

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
seed = comm.bcast(int(np.random.SeedSequence().entropy % 2**32) if rank == 0 else None)
rng = np.random.default_rng(seed)


def take(x, rows):
    return np.concatenate([x[:, s:e] for s, e in rows], axis=1)


def check_ring(fn, layout, causal, dtype, tol):
    b, n, hq, hk, d = 2, 53, 4, 2, 16
    q = rng.standard_normal((b, n, hq, d)).astype(np.float32).astype(dtype)
    k = rng.standard_normal((b, n, hk, d)).astype(np.float32).astype(dtype)
    v = rng.standard_normal((b, n, hk, d)).astype(np.float32).astype(dtype)
    dout = rng.standard_normal((b, n, hq, d)).astype(np.float32).astype(dtype)
    out, lse, dq, dk, dv = attention(q, k, v, dout, causal=causal)
    mine = dist.local_rows(n, layout)
    call = fn(take(q, mine), take(k, mine), take(v, mine), causal=causal, return_handle=True)
    got = call.backward(take(dout, mine))
    for name, g, w in [("out", call.out, out), ("dq", got[0], dq), ("dk", got[1], dk),
                       ("dv", got[2], dv)]:
        w = take(w, mine)
        err = float(np.max(np.abs(np.asarray(g, np.float64) - w)))
        assert err <= tol * max(1.0, float(np.max(np.abs(w)))), f"{name}: error {err}"
    lse_mine = np.concatenate([lse[:, :, s:e] for s, e in mine], axis=2)
    assert np.max(np.abs(call.softmax_lse - lse_mine)) < 1e-4, "lse"


def check_disagreement():
    n = 24
    heads = 4 if rank == size - 1 else 2
    rows = dist.local_rows(n, "zigzag")
    local = sum(e - s for s, e in rows)
    q = np.ones((1, local, heads, 8), np.float32)
    k = np.ones((1, local, 1, 8), np.float32)
    try:
        dist.zigzag_ring_flash_attn_func(q, k, k, causal=True)
    except fa.FlashAttnError as e:
        assert f"rank {size - 1}'s heads_q is 4 where rank 0's is 2" in str(e), str(e)
        return
    raise AssertionError("the ranks disagreed, and nothing was raised")


checks = [
    ("zigzag, causal, f32", lambda: check_ring(dist.zigzag_ring_flash_attn_func, "zigzag",
                                               True, np.float32, 2e-5)),
    ("contiguous, not causal, f16", lambda: check_ring(dist.ring_flash_attn_func,
                                                       "contiguous", False, np.float16, 4e-3)),
    ("ranks that disagree", check_disagreement),
]
passed = failed = 0
for name, check in checks:
    try:
        check()
        ok = True
    except Exception as e:  # noqa: BLE001 (every rank must reach the vote below)
        print(f"rank {rank}/{size}: FAILED {name}: {e}", file=sys.stderr, flush=True)
        ok = False
    if all(comm.allgather(ok)):
        passed += 1
    else:
        failed += 1
if rank == 0:
    print(f"mpi_check ({size} ranks, seed {seed}): {passed} passed, {failed} failed", flush=True)
sys.exit(1 if failed else 0)
