"""Exact FlashAttention, forward and backward, on any GPU that speaks WebGPU (through wgpu:
Vulkan, Metal, DX12), with flash-attn 2's functions: the same names, positional parameters,
defaults and return values, so that a flash-attn 2 call runs here unchanged.

    import numpy as np, flash_attn_wgpu as fa
    q = np.random.randn(2, 128, 8, 64).astype(np.float32)   # [batch, seq, heads, head_dim]
    k = np.random.randn(2, 128, 2, 64).astype(np.float32)   # 2 kv heads: GQA
    v = np.random.randn(2, 128, 2, 64).astype(np.float32)
    out = fa.flash_attn_func(q, k, v, 0.0, None, True)      # dropout_p, softmax_scale, causal
    call = fa.flash_attn_func(q, k, v, causal=True, return_handle=True)
    dq, dk, dv = call.backward(np.ones_like(call.out))      # the forward's options and seed

Arrays are numpy float32, float16 or bfloat16 (``ml_dtypes.bfloat16``), any layout (made
C-contiguous on upload). A call given numpy arrays copies them to the GPU and returns numpy
arrays; a call given :class:`Tensor` s (``fa.tensor(array)``) works on the GPU and returns
Tensors, so a chain of calls (a decode loop over a cache) copies nothing back until
``Tensor.numpy()``. Errors are :class:`FlashAttnError` subclasses naming the argument the
caller passed and what it should be (``InvalidInputError`` is a ``ValueError`` too). The GIL
is released while the GPU works.

Where the semantics differ from flash-attn 2 (python/README.md has the table): a row that
sees no key returns out 0 and lse -inf (flash-attn: +inf); dropout's mask comes from Philox
keyed by ``seed`` (a fresh one per call unless given), not torch's generator;
``return_attn_probs`` gives ``S_dmask`` None; ``deterministic`` changes nothing (every pass is
deterministic); gradients come from the handle (``return_handle=True``) or the explicit
backward functions, not autograd.
"""


from . import _native
from ._errors import FlashAttnError, InvalidInputError, OutOfMemoryError, UnsupportedError
from ._interface import (
    FlashAttnCall,
    create_block_mask,
    flash_attn_backward,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_backward,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flex_attention,
)
from ._kvcache import QuantizedCache, e4m3_head_scales, flash_attn_with_kvcache, quantize_cache
from ._tensor import Tensor, tensor

__all__ = [
    "Tensor",
    "tensor",
    "adapter",
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "FlashAttnCall",
    "flash_attn_backward",
    "flash_attn_varlen_backward",
    "QuantizedCache",
    "quantize_cache",
    "e4m3_head_scales",
    "create_block_mask",
    "flex_attention",
    "FlashAttnError",
    "InvalidInputError",
    "UnsupportedError",
    "OutOfMemoryError",
]


def adapter():
    """The GPU in use: name, backend and driver (the default adapter, chosen on first use)."""
    return _native.adapter()
