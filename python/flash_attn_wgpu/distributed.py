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
option) or refused its inputs makes every rank raise, naming it; a rank that does not answer
within ``FLASH_ATTN_MPI_TIMEOUT_S`` seconds (default 120) likewise. Arrays travel as
float32; each output is rounded once to the inputs' dtype.
"""

import numpy as np

from . import _args, _native
from ._errors import InvalidInputError
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


class RingAttnCall:
    """One context-parallel forward, as its backward needs it: ``out`` and ``softmax_lse``
    (this rank's rows), and ``backward(dout)`` giving this rank's ``(dq, dk, dv)``."""

    __slots__ = ("out", "softmax_lse", "_saved")

    def __init__(self, out, lse, saved):
        self.out, self.softmax_lse, self._saved = out, lse, saved

    def backward(self, dout):
        comm, q, k, v, out32, lse, dims, opts, schedule, layout, dtype = self._saved
        d = np.asarray(dout)
        if d.shape != out32.shape:
            raise InvalidInputError(f"dout has shape {list(d.shape)}, out {list(out32.shape)}")
        g = _native.cp_backward(comm, (q, k, v, out32, lse, np.ascontiguousarray(d, np.float32)),
                                dims, opts, schedule, layout)
        return tuple(np.asarray(x).reshape(t.shape).astype(dtype)
                     for x, t in zip(g, (q, k, v)))


def _ring(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic,
          return_attn_probs, group, return_handle, schedule, layout):
    comm = _comm(group)
    q, k, v = _arrays(q, k, v)
    dtype = q.dtype
    b, local, hq, d = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    if k.shape[:2] != (b, local) or v.shape[:3] != k.shape[:3]:
        raise InvalidInputError(f"k and v must hold q's rows [batch={b}, local_seq={local}, "
                                f"heads_k, ...], got k {list(k.shape)}, v {list(v.shape)}")
    n = comm.allreduce(local)
    mine = local_rows(n, layout, comm)
    if sum(e - s for s, e in mine) != local:
        raise InvalidInputError(
            f"q holds {local} rows, but rank {comm.Get_rank()}'s {layout} chunks of the "
            f"{n} rows are {mine}: pass this rank's chunks (local_rows)")
    _args.flag(deterministic, "deterministic")
    dropout_p = _args.number(dropout_p, "dropout_p", 0.0, 1.0, high_open=True)
    # one dropout seed for every rank: rank 0's
    seed = comm.bcast(int(np.random.randint(0, 2**62)) if comm.Get_rank() == 0 else None)
    opts = _options(dropout_p, softmax_scale, causal, window_size, 0.0, alibi_slopes, seed)
    dims = (b, n, hq, hkv, d, dv)
    f32 = [np.ascontiguousarray(x, np.float32) for x in (q, k, v)]
    out, lse = _native.cp_forward(comm, *f32, dims, opts, schedule, layout)
    out32 = np.asarray(out).reshape(b, local, hq, dv)
    lse = np.asarray(lse).reshape(b, hq, local)
    o = out32.astype(dtype)
    if _args.flag(return_handle, "return_handle"):
        return RingAttnCall(o, lse, (comm, *f32, out32, lse, dims, opts, schedule, layout,
                                     dtype))
    if _args.flag(return_attn_probs, "return_attn_probs"):
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
                 deterministic, return_attn_probs, group, return_handle, schedule, "zigzag")


def ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                         window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                         return_attn_probs=False, group=None, *, return_handle=False,
                         schedule="ring"):
    """ring-flash-attention's ``ring_flash_attn_func``: as
    :func:`zigzag_ring_flash_attn_func` with contiguous chunks (rank r holds chunk r of R; a
    causal call then gives the last rank the most work)."""
    return _ring(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                 deterministic, return_attn_probs, group, return_handle, schedule, "contiguous")
