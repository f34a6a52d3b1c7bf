"""Exact FlashAttention, forward and backward, on any GPU that speaks WebGPU (through wgpu:
Vulkan, Metal, DX12), with flash-attn's function names and layouts.

    import numpy as np, flash_attn_wgpu as fa
    q = np.random.randn(2, 128, 8, 64).astype(np.float32)   # [batch, seq, heads, head_dim]
    k = np.random.randn(2, 128, 2, 64).astype(np.float32)   # 2 kv heads: GQA
    v = np.random.randn(2, 128, 2, 64).astype(np.float32)
    out, lse = fa.flash_attn_func(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = fa.flash_attn_backward(np.ones_like(out), q, k, v, out, lse, causal=True)

Arrays are numpy float32, float16 or bfloat16 (``ml_dtypes.bfloat16``), any layout (made
C-contiguous on upload). A call given numpy arrays copies them to the GPU and returns numpy
arrays; a call given :class:`Tensor` s (``fa.tensor(array)``) works on the GPU and returns
Tensors, so a chain of calls (a decode loop over a cache) copies nothing back until
``Tensor.numpy()``. Errors are :class:`FlashAttnError` subclasses carrying the library's
message. The GIL is released while the GPU works.

Where the semantics differ from flash-attn: a row that sees no key returns out 0 and lse
-inf (flash-attn: +inf); dropout's mask comes from Philox keyed by ``seed`` (not torch's
generator), so it is reproducible but not flash-attn's; ``return_lse`` stands for
``return_attn_probs`` (no probabilities are ever returned).
"""

import numpy as np

from . import _native
from ._errors import FlashAttnError, InvalidInputError, OutOfMemoryError, UnsupportedError

__all__ = [
    "Tensor",
    "tensor",
    "adapter",
    "flash_attn_func",
    "flash_attn_backward",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_backward",
    "flash_attn_with_kvcache",
    "QuantizedCache",
    "quantize_cache",
    "e4m3_head_scales",
    "create_block_mask",
    "FlashAttnError",
    "InvalidInputError",
    "UnsupportedError",
    "OutOfMemoryError",
]

try:  # bfloat16 arrays exist in numpy only through ml_dtypes
    import ml_dtypes

    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None


def _dtype_name(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return "float32"
    if dtype == np.float16:
        return "float16"
    if _BF16 is not None and dtype == _BF16:
        return "bfloat16"
    raise InvalidInputError(
        f"expected a float32, float16 or bfloat16 array, got dtype {dtype}"
        + ("" if _BF16 is not None else " (bfloat16 needs the ml_dtypes package)")
    )


class Tensor:
    """An array in GPU memory: made by :func:`tensor` or returned by a call given Tensors."""

    __slots__ = ("_t",)

    def __init__(self, native):
        self._t = native

    @property
    def shape(self):
        """The shape, row-major."""
        return tuple(self._t.shape)

    @property
    def dtype(self):
        """The numpy dtype of the values."""
        name = self._t.dtype
        if name == "bfloat16":
            if _BF16 is None:
                raise FlashAttnError("a bfloat16 tensor needs the ml_dtypes package on the host")
            return _BF16
        return np.dtype(name)

    def numpy(self):
        """Copies the values to a new numpy array (waits for the GPU)."""
        bits = self._t.download()
        return bits if self._t.dtype == "float32" else bits.view(self.dtype)

    def __repr__(self):
        return f"flash_attn_wgpu.Tensor(shape={self.shape}, dtype={self._t.dtype})"


def tensor(array):
    """Copies a numpy array (float32, float16 or ml_dtypes.bfloat16) to a new GPU tensor; a
    Tensor is returned as it is."""
    if isinstance(array, Tensor):
        return array
    a = np.asarray(array)
    name = _dtype_name(a.dtype)
    a = np.ascontiguousarray(a)
    return Tensor(_native.upload(a if name == "float32" else a.view(np.uint16), name))


def adapter():
    """The GPU in use: name, backend and driver (the default adapter, chosen on first use)."""
    return _native.adapter()


def _options(causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p, seed,
             cu_seqlens_q=None, cu_seqlens_k=None, block_table=None, num_splits=0,
             leftpad_k=None, score_mod=None, score_mod_tensors=None, mask_mod=None,
             mask_mod_tensors=None, block_mask=None):
    def ints(x):
        return None if x is None else [int(n) for n in np.asarray(x).ravel()]

    table = None
    if block_table is not None:
        t = np.asarray(block_table)
        if t.ndim != 2:
            raise InvalidInputError(
                f"block_table must be [batch, pages_per_seq], got shape {t.shape}")
        table = (ints(t), int(t.shape[1]))
    leftpad = ints(leftpad_k)
    if leftpad is not None and any(n < 0 for n in leftpad):
        raise InvalidInputError(f"cache_leftpad must hold starts >= 0, got {leftpad}")
    slopes = None
    if alibi_slopes is not None:
        slopes = [float(s) for s in np.asarray(alibi_slopes, dtype=np.float32).ravel()]
    left, right = window_size
    return {
        "causal": bool(causal),
        "softmax_scale": None if softmax_scale is None else float(softmax_scale),
        "window_size": (int(left), int(right)),
        "softcap": float(softcap),
        "alibi_slopes": slopes,
        "dropout_p": float(dropout_p),
        "seed": int(seed),
        "cu_seqlens_q": ints(cu_seqlens_q),
        "cu_seqlens_k": ints(cu_seqlens_k),
        "block_table": table,
        "num_splits": int(num_splits),
        "leftpad_k": leftpad,
        "score_mod": None if score_mod is None else str(score_mod),
        "score_mod_tensors": _captured(score_mod_tensors),
        "mask_mod": None if mask_mod is None else str(mask_mod),
        "mask_mod_tensors": _captured(mask_mod_tensors),
        "block_mask": _block_mask(block_mask, mask_mod),
    }


def _captured(tensors):
    return [(str(name), [float(x) for x in np.asarray(t, dtype=np.float32).ravel()])
            for name, t in (tensors or {}).items()]


def _block_mask(block_mask, mask_mod):
    if block_mask is None:
        return None
    if not isinstance(block_mask, _native.BlockMask):
        raise InvalidInputError(
            f"block_mask must come from create_block_mask, got {type(block_mask).__name__}")
    if mask_mod is None:
        raise InvalidInputError("block_mask goes with the mask_mod it was made from: give both")
    return block_mask


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, BLOCK_SIZE=128, mask_mod_tensors=None):
    """The block mask of a user mask (FlexAttention's ``create_block_mask``), evaluated on the
    GPU: ``mask_mod`` the WGSL given to :func:`flash_attn_func` (with its ``mask_mod_tensors``),
    over ``B x H`` grids (``None`` or 1: the mask does not depend on the batch or the head, and
    the block mask is shared) of ``Q_LEN x KV_LEN`` pairs, in blocks of ``BLOCK_SIZE`` (an int,
    or (rows, keys)). Pass it as ``block_mask=`` beside the same ``mask_mod``: blocks the mask
    hides are never visited, and blocks it keeps whole skip its evaluation. Make it once and
    reuse it across calls and layers (it depends on the mask and the shape only)."""
    bq, bkv = (BLOCK_SIZE, BLOCK_SIZE) if np.isscalar(BLOCK_SIZE) else BLOCK_SIZE
    grid = (int(B or 1), int(H or 1), int(Q_LEN), int(KV_LEN))
    return _native.create_block_mask(str(mask_mod), _captured(mask_mod_tensors), grid,
                                     (int(bq), int(bkv)))


def _out(as_numpy, t):
    wrapped = Tensor(t)
    return wrapped.numpy() if as_numpy else wrapped


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_lse=False,
                    seed=0, score_mod=None, score_mod_tensors=None, mask_mod=None,
                    mask_mod_tensors=None, block_mask=None):
    """Attention of q ``[batch, seqlen_q, nheads, headdim]`` over k, v ``[batch, seqlen_k,
    nheads_k, headdim]`` (nheads a multiple of nheads_k: GQA/MQA). v may be narrower or wider
    than q and k (``headdim_v``, its last dimension, as flash-attn 3 reads it; out is then that
    wide; forward and backward for head dims of q and k up to 576 and of v up to 512, past 256
    on small tiles, on wgpu; CUDA runs one head dim for all three, up to 256).

    ``causal``: bottom-right aligned (query i sees keys j <= i + seqlen_k - seqlen_q);
    ``window_size`` (left, right), -1 unbounded; ``softcap`` > 0 caps the scaled scores with
    tanh; ``alibi_slopes`` ``[nheads]`` or ``[batch, nheads]`` float32; ``dropout_p`` with
    ``seed`` drops probabilities. ``score_mod``: WGSL defining ``score_mod(s, b, h, i, j)`` and
    its derivative ``score_mod_ds`` (FlexAttention's score_mod, applied after the built-in
    modifiers; the crate's docs/SEMANTICS.md), reading the float32 arrays of
    ``score_mod_tensors`` (a dict) by name. ``mask_mod``: WGSL defining ``mask_mod(b, h, i, j)
    -> bool`` (FlexAttention's mask_mod; pairs where it is false are hidden), reading
    ``mask_mod_tensors`` by name, with ``block_mask`` from :func:`create_block_mask` where
    given. Returns out (q's dtype), or (out, lse) with ``return_lse``
    (lse ``[batch, nheads, seqlen_q]`` float32).
    """
    as_numpy = not isinstance(q, Tensor)
    opts = _options(causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p, seed,
                    score_mod=score_mod, score_mod_tensors=score_mod_tensors,
                    mask_mod=mask_mod, mask_mod_tensors=mask_mod_tensors,
                    block_mask=block_mask)
    out, lse = _native.forward(tensor(q)._t, tensor(k)._t, tensor(v)._t, opts)
    out = _out(as_numpy, out)
    return (out, _out(as_numpy, lse)) if return_lse else out


def flash_attn_backward(dout, q, k, v, out, lse, dropout_p=0.0, softmax_scale=None,
                        causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                        seed=0, score_mod=None, score_mod_tensors=None, mask_mod=None,
                        mask_mod_tensors=None, block_mask=None):
    """Gradients (dq, dk, dv) of attention from the forward's ``out`` and ``lse`` and the
    output's gradient ``dout``, with the forward's options (the probabilities are recomputed,
    never stored). Shapes and dtypes as q, k and v."""
    as_numpy = not isinstance(q, Tensor)
    opts = _options(causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p, seed,
                    score_mod=score_mod, score_mod_tensors=score_mod_tensors,
                    mask_mod=mask_mod, mask_mod_tensors=mask_mod_tensors,
                    block_mask=block_mask)
    grads = _native.backward(tensor(dout)._t, tensor(q)._t, tensor(k)._t, tensor(v)._t,
                             tensor(out)._t, tensor(lse)._t, opts)
    return tuple(_out(as_numpy, g) for g in grads)


def _unpack(x, parts, name):
    """Slices a packed numpy array ``[batch, seq, parts, heads, headdim]`` along its third
    axis."""
    if isinstance(x, Tensor):
        raise InvalidInputError(
            f"{name} must be a numpy array (a packed Tensor cannot be sliced on the device): "
            "pass the parts to flash_attn_func as Tensors")
    a = np.asarray(x)
    if a.ndim != 5 or a.shape[2] != parts:
        raise InvalidInputError(
            f"{name} must be [batch, seqlen, {parts}, nheads, headdim], got shape {a.shape}")
    return [a[:, :, n] for n in range(parts)]


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              return_lse=False, seed=0):
    """:func:`flash_attn_func` on q, k and v stacked in one array ``[batch, seqlen, 3, nheads,
    headdim]`` (a fused QKV projection's output), numpy only."""
    q, k, v = _unpack(qkv, 3, "qkv")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, return_lse, seed)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             return_lse=False, seed=0):
    """:func:`flash_attn_func` with k and v stacked in one array ``[batch, seqlen_k, 2,
    nheads_k, headdim]``, numpy only."""
    k, v = _unpack(kv, 2, "kv")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, return_lse, seed)


def _packed(x, name):
    """A varlen array ``[total, heads, headdim]`` as the library's batch of one."""
    if isinstance(x, Tensor):
        if len(x.shape) != 4 or x.shape[0] != 1:
            raise InvalidInputError(
                f"a varlen {name} Tensor must be [1, total, heads, headdim], got {x.shape}")
        return x
    a = np.asarray(x)
    if a.ndim != 3:
        raise InvalidInputError(
            f"varlen {name} must be [total, heads, headdim], got shape {a.shape}")
    return tensor(a[None])


def _check_max(cu, given, name):
    cu = np.asarray(cu)
    if given is not None and cu.size > 1 and int(np.max(np.diff(cu))) > int(given):
        raise InvalidInputError(
            f"{name} is {given}, but the longest sequence in its cu_seqlens has "
            f"{int(np.max(np.diff(cu)))}")


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                           max_seqlen_k=None, dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           return_lse=False, seed=0):
    """Sequences of different lengths packed end to end: q ``[total_q, nheads, headdim]``, k
    and v ``[total_k, nheads_k, headdim]``, ``cu_seqlens_q``/``cu_seqlens_k`` the cumulative
    lengths (batch + 1 entries from 0). Each sequence attends within itself, causal and
    window aligned per sequence. ``max_seqlen_*`` are checked, not needed. Returns out
    ``[total_q, nheads, headdim]``, and lse ``[nheads, total_q]`` with ``return_lse``."""
    _check_max(cu_seqlens_q, max_seqlen_q, "max_seqlen_q")
    _check_max(cu_seqlens_k, max_seqlen_k, "max_seqlen_k")
    as_numpy = not isinstance(q, Tensor)
    opts = _options(causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p, seed,
                    cu_seqlens_q, cu_seqlens_k)
    out, lse = _native.forward(_packed(q, "q")._t, _packed(k, "k")._t, _packed(v, "v")._t,
                               opts)
    out, lse = _out(as_numpy, out), _out(as_numpy, lse)
    if as_numpy:
        out, lse = out[0], lse[0]
    return (out, lse) if return_lse else out


def flash_attn_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                               dropout_p=0.0, softmax_scale=None, causal=False,
                               window_size=(-1, -1), softcap=0.0, alibi_slopes=None, seed=0):
    """Gradients (dq, dk, dv) of a varlen call, in the packed layouts of q, k and v."""
    as_numpy = not isinstance(q, Tensor)
    opts = _options(causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p, seed,
                    cu_seqlens_q, cu_seqlens_k)
    if not isinstance(lse, Tensor):
        lse = np.asarray(lse)[None]
    grads = _native.backward(_packed(dout, "dout")._t, _packed(q, "q")._t, _packed(k, "k")._t,
                             _packed(v, "v")._t, _packed(out, "out")._t, tensor(lse)._t, opts)
    grads = tuple(_out(as_numpy, g) for g in grads)
    return tuple(g[0] for g in grads) if as_numpy else grads


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


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """Attention of q ``[batch, seqlen_q, nheads, headdim]`` over a KV cache, after appending
    the new keys and values ``k``, ``v`` ``[batch, seqlen_new, nheads_k, headdim]`` at each
    batch's length ``cache_seqlens`` (an int or ``[batch]``: the rows each batch held before
    the call; the caller advances them). The caches are ``[batch, seqlen_cache, nheads_k,
    headdim]``, or with ``block_table`` ``[batch, pages_per_seq]`` (int32) page pools
    ``[num_pages, page_size, nheads_k, headdim]``; they are updated in place: on the GPU when
    they are Tensors (a decode loop then copies nothing but q and the new rows), and copied
    back into the arrays when they are numpy arrays. ``cache_batch_idx`` ``[batch]`` names the
    cache row each batch entry uses (a dense cache may then hold more rows than the batch;
    appending to one row from two entries is an error). ``cache_leftpad`` ``[batch]`` hides
    each batch's keys before that index (left-padded prompts; positions are not renumbered).
    Causal, window and ALiBi are aligned to each batch's length. ``rotary_cos``,
    ``rotary_sin`` ``[seqlen_ro, rotary_dim / 2]`` (q's dtype) rotate q and the new keys
    first, as flash-attn does: the new keys at positions ``cache_seqlens + i``, q there too
    when causal or windowed, else every query at ``cache_seqlens``; pairs ``(2f, 2f + 1)``
    with ``rotary_interleaved`` (the default), else ``(f, f + rotary_dim / 2)``; the cache
    keeps the rotated keys. ``num_splits`` 0 picks the split-KV count. The caches may be
    8-bit (``QuantizedCache`` from ``quantize_cache``): the new rows are quantized on the GPU.
    Returns out, and lse with ``return_softmax_lse``."""
    as_numpy = not isinstance(q, Tensor)
    batch = np.shape(q)[0] if as_numpy else q.shape[0]
    if cache_batch_idx is not None:
        if block_table is not None:
            raise InvalidInputError("cache_batch_idx is for a dense cache: not with block_table")
        # a dense cache row per batch entry is a paged layout of one whole-row page each
        block_table = np.asarray(cache_batch_idx).reshape(-1, 1)
    if cache_seqlens is None:  # every row of the cache holds a key
        rows = (k_cache.shape[1] if isinstance(k_cache, (Tensor, QuantizedCache))
                else np.shape(k_cache)[1])
        if block_table is not None:
            rows *= np.shape(block_table)[1]
        cache_seqlens = [rows] * batch
    elif np.ndim(cache_seqlens) == 0:
        cache_seqlens = [int(cache_seqlens)] * batch
    else:
        cache_seqlens = [int(n) for n in np.asarray(cache_seqlens).ravel()]
    if (k is None) != (v is None):
        raise InvalidInputError("k and v are appended together: give both or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise InvalidInputError("rotary_cos and rotary_sin go together: give both or neither")
    rotary = None
    if rotary_cos is not None:
        rotary = (tensor(rotary_cos)._t, tensor(rotary_sin)._t, bool(rotary_interleaved))
    opts = _options(causal, softmax_scale, window_size, softcap, alibi_slopes, 0.0, 0,
                    block_table=block_table, num_splits=num_splits,
                    leftpad_k=cache_leftpad)
    new_k = None if k is None else tensor(k)._t
    new_v = None if v is None else tensor(v)._t
    quantized = [isinstance(c, QuantizedCache) for c in (k_cache, v_cache)]
    if any(quantized):
        if not all(quantized):
            raise InvalidInputError("k_cache and v_cache are both QuantizedCache or neither")
        out, lse = _native.forward_with_quantized_kvcache(
            tensor(q)._t, k_cache, v_cache, cache_seqlens, new_k, new_v, opts, rotary)
        out = _out(as_numpy, out)
        return (out, _out(as_numpy, lse)) if return_softmax_lse else out
    kc, vc = tensor(k_cache), tensor(v_cache)
    out, lse = _native.forward_with_kvcache(
        tensor(q)._t, kc._t, vc._t, cache_seqlens, new_k, new_v, opts, rotary)
    if k is not None:
        for given, dev in ((k_cache, kc), (v_cache, vc)):
            if not isinstance(given, Tensor):
                given[...] = dev.numpy()
    out = _out(as_numpy, out)
    return (out, _out(as_numpy, lse)) if return_softmax_lse else out
