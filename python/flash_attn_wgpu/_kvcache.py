"""KV caches: flash-attn 2's ``flash_attn_with_kvcache`` (dense, paged, ``cache_batch_idx``,
``cache_leftpad``, rotary) and the 8-bit caches (``QuantizedCache``)."""

import numpy as np

from . import _args, _native
from ._errors import InvalidInputError
from ._interface import _options, _table
from ._tensor import Tensor, out_of, tensor

QuantizedCache = _native.QuantizedCache
QuantizedCache.__doc__ = """A KV cache in GPU memory stored in 8 bits (``format``: "q8_0",
llama.cpp's blocks of 32 int8 with an f16 scale, or "e4m3", fp8 with a scale per kv head), of
``shape`` values; ``dequantize()`` gives them as float32, as the kernels read them."""


def quantize_cache(array, format="q8_0", head_scales=None):
    """An 8-bit KV cache (``QuantizedCache``) holding ``array`` ``[batch, seqlen_cache,
    nheads_k, headdim]`` (or a paged pool), quantized on the host; ``headdim`` a multiple of
    32. ``head_scales`` ``[nheads_k]``: e4m3's static per-head scales (``e4m3_head_scales`` of
    a prefill); None for q8_0. Pass it as ``k_cache`` / ``v_cache`` to
    ``flash_attn_with_kvcache``, which updates it in place."""
    a = np.ascontiguousarray(np.asarray(array, dtype=np.float32))
    scales = None if head_scales is None else [float(x) for x in np.asarray(head_scales).ravel()]
    return _native.quantized_cache(a, str(format), scales)


def e4m3_head_scales(array):
    """Per-kv-head e4m3 scales for ``array`` ``[batch, seqlen, nheads_k, headdim]``: each
    head's largest finite magnitude over 448 (1 for a head of zeros), so that none of it
    saturates (the library's rule, ``CacheFormat::e4m3_head_scales``)."""
    a = np.ascontiguousarray(np.asarray(array, dtype=np.float32))
    return np.asarray(_native.e4m3_head_scales(a), dtype=np.float32)


def _shape(x):
    return tuple(x.shape) if isinstance(x, (Tensor, QuantizedCache)) else np.shape(x)


def _per_batch(x, name, batch):
    """An int, or [batch] ints, >= 0, as a list of batch ints."""
    if np.ndim(x) == 0:
        return [_args.integer(x, name)] * batch
    a = _args.int_array(x, name, ndim=1)
    if a.size != batch:
        raise InvalidInputError(f"{name} must be an int or hold one value per batch entry "
                                f"({batch}), got {a.size}")
    return [int(n) for n in a]


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """flash-attn 2's ``flash_attn_with_kvcache``, same signature: attention of q ``[batch,
    seqlen_q, nheads, headdim]`` over a KV cache, after appending the new keys and values
    ``k``, ``v`` ``[batch, seqlen_new, nheads_k, headdim]`` at each batch's length
    ``cache_seqlens`` (an int or ``[batch]``: the rows each batch held before the call; the
    caller advances them). The caches are ``[batch_cache, seqlen_cache, nheads_k, headdim]``,
    or with ``block_table`` ``[batch, pages_per_seq]`` (int32) page pools ``[num_pages,
    page_size, nheads_k, headdim]``; they are updated in place: on the GPU when they are
    Tensors (a decode loop then copies nothing but q and the new rows), and copied back into
    the arrays when they are numpy arrays. ``cache_batch_idx`` ``[batch]`` names the cache
    row each batch entry uses (a dense cache may then hold more rows than the batch;
    appending to one row from two entries is an error). ``cache_leftpad`` ``[batch]`` hides
    each batch's keys before that index (left-padded prompts; positions are not renumbered).
    Causal, window and ALiBi are aligned to each batch's length. ``rotary_cos``,
    ``rotary_sin`` ``[seqlen_ro, rotary_dim / 2]`` (q's dtype) rotate q and the new keys
    first, as flash-attn does: the new keys at positions ``cache_seqlens + i``, q there too
    when causal or windowed, else every query at ``cache_seqlens``; pairs ``(2f, 2f + 1)``
    with ``rotary_interleaved`` (the default), else ``(f, f + rotary_dim / 2)``; the cache
    keeps the rotated keys. ``num_splits`` 0 picks the split-KV count. The caches may be
    8-bit (``QuantizedCache`` from ``quantize_cache``): the new rows are quantized on the GPU.
    Returns out, and ``(out, softmax_lse)`` with ``return_softmax_lse``."""
    as_numpy = not isinstance(q, Tensor)
    qs, cs = _shape(q), _shape(k_cache)
    if len(qs) != 4:
        raise InvalidInputError(f"q must be [batch, seqlen_q, nheads, headdim], got shape {qs}")
    if len(cs) != 4:
        raise InvalidInputError(
            f"k_cache must be [batch_cache, seqlen_cache, nheads_k, headdim] (or a page pool "
            f"[num_pages, page_size, nheads_k, headdim] with block_table), got shape {cs}")
    batch = qs[0]
    if (k is None) != (v is None):
        raise InvalidInputError("k and v are appended together: give both or neither")
    new = 0 if k is None else _shape(k)[1] if len(_shape(k)) == 4 else 0
    table = None
    if cache_batch_idx is not None:
        if block_table is not None:
            raise InvalidInputError("cache_batch_idx is for a dense cache: not with block_table")
        idx = _args.int_array(cache_batch_idx, "cache_batch_idx", ndim=1, high=cs[0] - 1)
        if idx.size != batch:
            raise InvalidInputError(f"cache_batch_idx must hold one cache row per batch entry "
                                    f"({batch}), got {idx.size}")
        if k is not None and np.unique(idx).size != idx.size:
            row = int(next(r for r in idx if np.sum(idx == r) > 1))
            raise InvalidInputError(
                f"cache_batch_idx names cache row {row} for two batch entries, and k and v "
                "would append to it from both")
        # a dense cache row per batch entry is a paged layout of one whole-row page each
        table = ([int(n) for n in idx], 1)
        capacity = cs[1]
    elif block_table is not None:
        table = _table(block_table, batch, cs[0])
        capacity = table[1] * cs[1]
    else:
        if cs[0] != batch:
            raise InvalidInputError(f"k_cache holds {cs[0]} sequences and q {batch}: give "
                                    "cache_batch_idx to pick the cache rows")
        capacity = cs[1]
    if cache_seqlens is None:  # every row of the cache holds a key
        lens = [capacity] * batch
    else:
        lens = _per_batch(cache_seqlens, "cache_seqlens", batch)
    for b, n in enumerate(lens):
        if n + new > capacity:
            raise InvalidInputError(
                f"cache_seqlens[{b}] is {n}" + (f" and k appends {new} rows" if new else "")
                + f", but the cache holds {capacity} rows a sequence")
    leftpad = None
    if cache_leftpad is not None:
        leftpad = _per_batch(cache_leftpad, "cache_leftpad", batch)
        for b, (p, n) in enumerate(zip(leftpad, lens)):
            if p > n + new:
                raise InvalidInputError(
                    f"cache_leftpad[{b}] is {p}, past batch {b}'s {n + new} keys "
                    f"(cache_seqlens[{b}] = {n} plus {new} new)")
    if (rotary_cos is None) != (rotary_sin is None):
        raise InvalidInputError("rotary_cos and rotary_sin go together: give both or neither")
    rotary = None
    if rotary_cos is not None:
        rotary = (tensor(rotary_cos, "rotary_cos")._t, tensor(rotary_sin, "rotary_sin")._t,
                  _args.flag(rotary_interleaved, "rotary_interleaved"))
    opts = _options(0.0, softmax_scale, causal, window_size, softcap, alibi_slopes, None,
                    block_table=table, num_splits=num_splits,
                    leftpad_k=None if leftpad is None else np.asarray(leftpad))
    new_k = None if k is None else tensor(k, "k")._t
    new_v = None if v is None else tensor(v, "v")._t
    lse_wanted = _args.flag(return_softmax_lse, "return_softmax_lse")
    quantized = [isinstance(c, QuantizedCache) for c in (k_cache, v_cache)]
    if any(quantized):
        if not all(quantized):
            raise InvalidInputError("k_cache and v_cache are both QuantizedCache or neither")
        out, lse = _native.forward_with_quantized_kvcache(
            tensor(q, "q")._t, k_cache, v_cache, lens, new_k, new_v, opts, rotary)
        out = out_of(as_numpy, out)
        return (out, out_of(as_numpy, lse)) if lse_wanted else out
    kc, vc = tensor(k_cache, "k_cache"), tensor(v_cache, "v_cache")
    out, lse = _native.forward_with_kvcache(tensor(q, "q")._t, kc._t, vc._t, lens, new_k, new_v,
                                            opts, rotary)
    if k is not None:
        for given, dev in ((k_cache, kc), (v_cache, vc)):
            if not isinstance(given, Tensor):
                given[...] = dev.numpy()
    out = out_of(as_numpy, out)
    return (out, out_of(as_numpy, lse)) if lse_wanted else out
