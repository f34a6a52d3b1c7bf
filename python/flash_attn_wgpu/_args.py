"""Argument conversion in the caller's words: every check names the argument as the caller
passed it and says what it should be, and nothing raises a bare TypeError, ValueError or
OverflowError from a conversion (each becomes an InvalidInputError, a ValueError too)."""

import numbers
import secrets

import numpy as np

from ._errors import InvalidInputError

U32_MAX = 2**32 - 1


def flag(x, name):
    """A bool (or numpy bool, or 0/1)."""
    if isinstance(x, (bool, np.bool_)) or (isinstance(x, numbers.Integral) and x in (0, 1)):
        return bool(x)
    raise InvalidInputError(f"{name} must be True or False, got {x!r}")


def number(x, name, low=None, high=None, low_open=False, high_open=False, allow_none=False):
    """A finite float within [low, high] (an end excluded where it says open)."""
    if x is None and allow_none:
        return None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise InvalidInputError(f"{name} must be a number, got {x!r}")
    f = float(x)
    ok = np.isfinite(f)
    if ok and low is not None:
        ok = f > low if low_open else f >= low
    if ok and high is not None:
        ok = f < high if high_open else f <= high
    if not ok:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        want = f"in {lo}{low}, {high}{hi}" if high is not None else (
            f"{'>' if low_open else '>='} {low}" if low is not None else "finite")
        raise InvalidInputError(f"{name} must be a finite number {want}, got {x!r}")
    return f


def integer(x, name, low=0, high=U32_MAX):
    """An int within [low, high] (a Python or numpy integer, or an integral float)."""
    if isinstance(x, (bool, np.bool_)):
        raise InvalidInputError(f"{name} must be an integer, got {x!r}")
    if isinstance(x, numbers.Integral):
        n = int(x)
    elif isinstance(x, numbers.Real) and float(x).is_integer():
        n = int(x)
    else:
        raise InvalidInputError(f"{name} must be an integer, got {x!r}")
    if not low <= n <= high:
        raise InvalidInputError(f"{name} must be an integer in [{low}, {high}], got {n}")
    return n


def int_array(x, name, ndim=1, low=0, high=U32_MAX):
    """A numpy int64 array of ints within [low, high], of `ndim` dimensions (None: any)."""
    try:
        a = np.asarray(x)
    except Exception as e:  # a ragged list, an object numpy cannot read
        raise InvalidInputError(f"{name} must be an array of integers, got {x!r} ({e})") from None
    if a.dtype == object or not (np.issubdtype(a.dtype, np.integer)
                                 or (np.issubdtype(a.dtype, np.floating)
                                     and np.all(np.isfinite(a)) and np.all(a == np.round(a)))):
        raise InvalidInputError(f"{name} must be an array of integers, got dtype {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise InvalidInputError(
            f"{name} must have {ndim} dimension{'s' if ndim != 1 else ''}, got shape {a.shape}")
    a = a.astype(np.int64)
    if a.size and (a.min() < low or a.max() > high):
        bad = a[(a < low) | (a > high)].ravel()[0]
        raise InvalidInputError(f"{name} must hold integers in [{low}, {high}], got {bad}")
    return a


def window(x, name="window_size"):
    """(left, right), each a key count >= 0, or negative for unbounded (flash-attn 2 takes any
    negative side as unbounded, not only -1): a negative side is returned as -1."""
    try:
        left, right = x
    except Exception:
        raise InvalidInputError(
            f"{name} must be a pair (left, right) of ints, negative for unbounded, got {x!r}"
        ) from None
    return tuple(max(integer(side, f"{name}[{k}]", low=-2**63, high=2**31 - 1), -1)
                 for k, side in enumerate((left, right)))


# the signatures of the functions a user's WGSL defines
SIGNATURES = {
    "score_mod": "fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32",
    "mask_mod": "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool",
}


def wgsl(x, name):
    """A user modifier's WGSL (``name`` is score_mod or mask_mod): a str, or None. A Python
    function (what a FlexAttention port passes first) is told that WGSL is expected."""
    if x is None or isinstance(x, str):
        return x
    want = f"{name} must be a WGSL string defining `{SIGNATURES[name]}`"
    if callable(x):
        what = getattr(x, "__name__", type(x).__name__)
        raise InvalidInputError(
            f"{want}, got the Python callable {what!r}: the kernels compile WGSL, not Python "
            f"(write its body in WGSL; flex_attention's docstring shows one)")
    raise InvalidInputError(f"{want}, got {type(x).__name__}")


def alibi(x, name="alibi_slopes"):
    """The slopes, float32, flattened ([nheads] or [batch, nheads]: the library checks which)."""
    if x is None:
        return None
    try:
        a = np.asarray(x, dtype=np.float32)
    except Exception:
        raise InvalidInputError(f"{name} must be an array of floats, got {x!r}") from None
    if a.ndim not in (1, 2):
        raise InvalidInputError(f"{name} must be [nheads] or [batch, nheads], got shape {a.shape}")
    return [float(s) for s in a.ravel()]


def seed_for(seed, dropout_p):
    """The dropout seed: the one given, else a fresh one per call (recorded by the handle)."""
    if seed is None:
        return secrets.randbits(63) if dropout_p > 0 else 0
    return integer(seed, "seed", low=0, high=2**64 - 1)


def cu_seqlens(x, name, total, total_name):
    """Cumulative lengths from 0, non-decreasing, ending at `total` (the packed rows)."""
    cu = int_array(x, name, ndim=1)
    if cu.size < 2:
        raise InvalidInputError(
            f"{name} must hold batch + 1 >= 2 cumulative lengths from 0, got {cu.tolist()}")
    if cu[0] != 0 or np.any(np.diff(cu) < 0):
        raise InvalidInputError(
            f"{name} must start at 0 and never decrease, got {cu.tolist()}")
    if total is not None and int(cu[-1]) != total:
        raise InvalidInputError(
            f"{name} ends at {int(cu[-1])}, but {total_name} has {total} rows: the last "
            f"cumulative length is the packed total")
    return cu


def max_seqlen(given, cu, name, cu_name):
    """flash-attn's max_seqlen_*: an int at least the longest sequence of `cu`."""
    if given is None:
        return
    n = integer(given, name)
    longest = int(np.max(np.diff(cu)))
    if n < longest:
        raise InvalidInputError(
            f"{name} is {n}, but the longest sequence in {cu_name} has {longest} rows")


def varlen_bounds(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_rows, k_rows):
    """A varlen call's (cu_q, cu_k): each checked against its packed rows (`k_rows` None: k is
    a page pool), both batch + 1 long, the max_seqlen_* at least their longest sequence."""
    cu_q = cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q_rows, "q")
    cu_k = cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k_rows, "k")
    if cu_q.size != cu_k.size:
        raise InvalidInputError(
            f"cu_seqlens_q has {cu_q.size} entries and cu_seqlens_k {cu_k.size}: both are "
            "batch + 1 long")
    max_seqlen(max_seqlen_q, cu_q, "max_seqlen_q", "cu_seqlens_q")
    max_seqlen(max_seqlen_k, cu_k, "max_seqlen_k", "cu_seqlens_k")
    return cu_q, cu_k
