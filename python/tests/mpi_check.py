"""Context parallelism from Python, run under ``mpiexec -n R`` (test_distributed.py does, at 2
and 4 ranks): each rank its zigzag (or contiguous) chunks, against the float64 numpy reference
of the whole call, forward and backward; a rank that disagrees makes every rank raise, naming
it, the field and both values; a rank that refuses its inputs (its rows, its dout) raises its
own error and the others, at once, one that carries its reason (mpi_faults.py: a rank that
leaves). Prints ``N passed, M failed`` on rank 0; exits 1 on a failure."""

import sys
import time

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


def expect_raised(call, mine, theirs):
    """Every rank raises at once (well within the deadline): the rank at fault its own error
    (``mine``: class, start of the message), every other rank one naming it (``theirs``)."""
    start = time.monotonic()
    try:
        call()
    except fa.FlashAttnError as e:
        took = time.monotonic() - start
        kind, text = mine if mine is not None else (fa.FlashAttnError, theirs)
        assert isinstance(e, kind) and text in str(e), f"{type(e).__name__}: {e}"
        assert took < 10, f"raised after {took:.1f} s, not at once"
        return
    raise AssertionError("nothing was raised")


def inputs(n, heads, dtype=np.float32, extra=0):
    local = sum(e - s for s, e in dist.local_rows(n, "zigzag")) + extra
    q = rng.standard_normal((1, local, heads, 8)).astype(dtype)
    k = rng.standard_normal((1, local, 1, 8)).astype(dtype)
    return q, k


def check_disagreement():
    # the last rank without the causal mask, then in float16: named in the caller's words
    last = rank == size - 1
    q, k = inputs(24, 2)
    text = f"rank {size - 1} calls with causal = false, rank 0 with causal = true"
    expect_raised(lambda: dist.zigzag_ring_flash_attn_func(q, k, k, causal=not last),
                  None, text)
    q, k = inputs(24, 2, np.float16 if last else np.float32)
    text = f"rank {size - 1} calls with dtype = float16, rank 0 with dtype = float32"
    expect_raised(lambda: dist.zigzag_ring_flash_attn_func(q, k, k, causal=True), None, text)


def check_refusal():
    # rank 0 passes two rows more than its zigzag chunks of 24: the call is then one of 26
    # rows, which rank 0's rows do not fit, nor some other ranks' (at 4 ranks, ranks 0 and 1;
    # rank 2 once waited in a blocking collective with no deadline). Each of those says why;
    # the rest raise at once with rank 0's reason
    q, k = inputs(24, 2, extra=2 if rank == 0 else 0)
    fits = q.shape[1] == sum(e - s for s, e in dist.local_rows(26, "zigzag"))
    expect_raised(lambda: dist.zigzag_ring_flash_attn_func(q, k, k, causal=True),
                  None if fits else (fa.InvalidInputError, f"q of rank {rank} holds"),
                  "rank 0 refused its inputs: invalid attention config: q of rank 0 holds")


def check_backward_refusal():
    # the last rank's dout is a row short: its shape error, carried to every other rank
    q, k = inputs(24, 2)
    call = dist.zigzag_ring_flash_attn_func(q, k, k, causal=True, return_handle=True)
    dout = np.ones_like(call.out)
    if rank == size - 1:
        dout = dout[:, 1:]
    why = f"dout has shape {list(dout.shape)} where this rank's out has"
    expect_raised(lambda: call.backward(dout),
                  (fa.InvalidInputError, why) if rank == size - 1 else None,
                  f"rank {size - 1} refused its inputs: dout has shape")


checks = [
    ("zigzag, causal, f32", lambda: check_ring(dist.zigzag_ring_flash_attn_func, "zigzag",
                                               True, np.float32, 2e-5)),
    ("contiguous, not causal, f16", lambda: check_ring(dist.ring_flash_attn_func,
                                                       "contiguous", False, np.float16, 4e-3)),
    ("ranks that disagree", check_disagreement),
    ("a rank that refuses its rows", check_refusal),
    ("a rank that refuses its dout", check_backward_refusal),
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
