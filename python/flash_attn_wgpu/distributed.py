"""Context parallelism over MPI (mpi4py): one attention call spread over the ranks of a
communicator, each holding its chunk of the sequence, with the calls ring-flash-attention's
users know. The algorithms are the library's (``flash_attn_wgpu::distributed``, in Rust: the
ring, zigzag for causal calls, the all-gather form); mpi4py carries the messages, so the
package links no MPI of its own.

    from mpi4py import MPI
    import flash_attn_wgpu.distributed as dist
    # each rank: its zigzag chunks of q, k, v, [batch, local_seq, heads, head_dim]
    out = dist.zigzag_ring_flash_attn_func(q, k, v, causal=True)
    call = dist.zigzag_ring_flash_attn_func(q, k, v, causal=True, return_handle=True)
    dq, dk, dv = call.backward(dout)

Run under ``mpiexec -n R python your_script.py``. Which rows a rank holds:
:func:`local_rows`. The ranks compare the call first: a rank that disagrees (a shape, an
option) makes every rank raise, naming it, the field and both values (``rank 1 calls with
causal = false, rank 0 with causal = true``); a rank that refuses its inputs raises its own
error and every other rank one that carries its reason; a rank that does not answer within
``FLASH_ATTN_MPI_TIMEOUT_S`` seconds (default 120) is an error naming it. Every exchange of a
call, the first agreement included, is under that deadline (no blocking collective of
mpi4py's). Arrays travel as float32; each output is rounded once to the inputs' dtype.
"""

import numpy as np

from . import _args, _native
from ._errors import FlashAttnError, InvalidInputError
from ._interface import _options
from ._tensor import _dtype_name

__all__ = ["local_rows", "zigzag_ring_flash_attn_func", "ring_flash_attn_func",
           "RingAttnCall"]


def _comm(group):
    if group is not None:
        return group
    try:
        from mpi4py import MPI
    except ImportError:
        raise InvalidInputError("group: context parallelism needs mpi4py (pip install "
                                "mpi4py) and an MPI, or give the communicator") from None
    return MPI.COMM_WORLD


def _chunks(n, count):
    base, extra = divmod(n, count)
    at, out = 0, []
    for c in range(count):
        size = base + (c < extra)
        out.append((at, at + size))
        at += size
    return out


def local_rows(seqlen, layout="zigzag", group=None):
    """The rows ``[start, end)`` of a sequence of ``seqlen`` rows this rank holds, in the
    order of its local arrays: zigzag (rank r: chunks r and 2R - 1 - r of 2R) or contiguous
    (chunk r of R); the first chunks take the remainder's rows."""
    comm = _comm(group)
    r, size = comm.Get_rank(), comm.Get_size()
    if layout == "zigzag":
        c = _chunks(seqlen, 2 * size)
        return [c[r], c[2 * size - 1 - r]]
    if layout == "contiguous":
        return [_chunks(seqlen, size)[r]]
    raise InvalidInputError(f"layout must be 'zigzag' or 'contiguous', got {layout!r}")


def _arrays(q, k, v):
    arrays = {"q": q, "k": k, "v": v}
    out = {}
    for name, x in arrays.items():
        a = np.asarray(x)
        if a.ndim != 4:
            raise InvalidInputError(f"{name} must have 4 dimensions [batch, local_seq, heads, "
                                    f"head_dim], got shape {list(a.shape)}")
        _dtype_name(a.dtype, name)
        out[name] = a
    dtypes = {a.dtype for a in out.values()}
    if len(dtypes) != 1:
        raise InvalidInputError("q, k and v must share one dtype, got " +
                                ", ".join(f"{n} {a.dtype}" for n, a in out.items()))
    return out["q"], out["k"], out["v"]


def _refusing(comm, error):
    """Takes part in the first agreement of the call the other ranks make, as a rank that
    refused its inputs (``error`` says why), so that they raise at once with its reason."""
    reason = str(error) if isinstance(error, FlashAttnError) else f"{type(error).__name__}: {error}"
    try:
        _native.cp_refuse(comm, reason)
    except Exception:  # noqa: BLE001 (the caller raises its own error, which says more)
        pass


class RingAttnCall:
    """One context-parallel forward, as its backward needs it: ``out`` and ``softmax_lse``
    (this rank's rows), and ``backward(dout)`` giving this rank's ``(dq, dk, dv)``."""

    __slots__ = ("out", "softmax_lse", "_saved")

    def __init__(self, out, lse, saved):
        self.out, self.softmax_lse, self._saved = out, lse, saved

    def backward(self, dout):
        comm, q, k, v, out32, lse, dims, opts, schedule, layout, dtype = self._saved
        try:
            d = np.asarray(dout)
            if d.shape != out32.shape:
                raise InvalidInputError(
                    f"dout has shape {list(d.shape)} where this rank's out has "
                    f"{list(out32.shape)}")
            d = np.ascontiguousarray(d, np.float32)
        except Exception as e:
            _refusing(comm, e)
            raise
        g = _native.cp_backward(comm, (q, k, v, out32, lse, d), dims, opts, schedule, layout)
        return tuple(np.asarray(x).reshape(t.shape).astype(dtype)
                     for x, t in zip(g, (q, k, v)))


def _ring(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic,
          return_attn_probs, group, return_handle, schedule, function, layout):
    comm = _comm(group)
    # this rank's own checks: a rank that fails one still takes part in the agreement
    try:
        q, k, v = _arrays(q, k, v)
        dtype = q.dtype
        b, local, hq, d = q.shape
        hkv, dv = k.shape[2], v.shape[3]
        if k.shape[:2] != (b, local) or v.shape[:3] != k.shape[:3]:
            raise InvalidInputError(
                f"k and v must hold q's rows [batch={b}, local_seq={local}, heads_k, ...], got "
                f"k {list(k.shape)}, v {list(v.shape)}")
        if schedule not in ("ring", "all_gather", "auto"):
            raise InvalidInputError(
                f"schedule must be 'ring', 'all_gather' or 'auto', got {schedule!r}")
        _args.flag(deterministic, "deterministic")
        handle = _args.flag(return_handle, "return_handle")
        probs = _args.flag(return_attn_probs, "return_attn_probs")
        # each rank draws a dropout seed; the agreement gives every rank rank 0's
        opts = _options(dropout_p, softmax_scale, causal, window_size, 0.0, alibi_slopes)
        f32 = [np.ascontiguousarray(x, np.float32) for x in (q, k, v)]
    except Exception as e:
        _refusing(comm, e)
        raise
    # the whole call's length and its dropout seed as the ranks agreed them, for the backward
    out, lse, n, seed = _native.cp_forward(comm, *f32, (b, local, hq, hkv, d, dv), function,
                                           _dtype_name(dtype), opts, schedule, layout)
    out32 = np.asarray(out).reshape(b, local, hq, dv)
    lse = np.asarray(lse).reshape(b, hq, local)
    o = out32.astype(dtype)
    if handle:
        return RingAttnCall(o, lse, (comm, *f32, out32, lse, (b, n, hq, hkv, d, dv),
                                     dict(opts, seed=seed), schedule, layout, dtype))
    if probs:
        return o, lse, None
    return o


def zigzag_ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                                window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                                return_attn_probs=False, group=None, *, return_handle=False,
                                schedule="ring"):
    """ring-flash-attention's ``zigzag_ring_flash_attn_func``: q, k, v are this rank's zigzag
    chunks ``[batch, local_seq, heads, head_dim]`` (chunks r and 2R - 1 - r of 2R, in that
    order: :func:`local_rows`), the call the whole sequence's; returns this rank's rows of
    out, or ``(out, softmax_lse, None)`` with ``return_attn_probs`` (lse ``[batch, heads,
    local_seq]``). ``group``: the mpi4py communicator (``MPI.COMM_WORLD``). Ours:
    ``return_handle`` (a :class:`RingAttnCall` whose ``backward(dout)`` gives this rank's dq,
    dk, dv), ``schedule`` ("ring", "all_gather": every rank gathers K and V; "auto")."""
    return _ring(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                 deterministic, return_attn_probs, group, return_handle, schedule,
                 "zigzag_ring_flash_attn_func", "zigzag")


def ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                         window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                         return_attn_probs=False, group=None, *, return_handle=False,
                         schedule="ring"):
    """ring-flash-attention's ``ring_flash_attn_func``: as
    :func:`zigzag_ring_flash_attn_func` with contiguous chunks (rank r holds chunk r of R; a
    causal call then gives the last rank the most work)."""
    return _ring(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                 deterministic, return_attn_probs, group, return_handle, schedule,
                 "ring_flash_attn_func", "contiguous")
