"""GPU tensors: :class:`Tensor` wraps the native module's, :func:`tensor` uploads a numpy array."""

import numpy as np

from . import _native
from ._errors import FlashAttnError, InvalidInputError


try:  # bfloat16 arrays exist in numpy only through ml_dtypes
    import ml_dtypes

    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None


def _dtype_name(dtype, what="the array"):
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return "float32"
    if dtype == np.float16:
        return "float16"
    if _BF16 is not None and dtype == _BF16:
        return "bfloat16"
    raise InvalidInputError(
        f"{what} must be a float32, float16 or bfloat16 array, got dtype {dtype}"
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


def tensor(array, what="array"):
    """Copies a numpy array (float32, float16 or ml_dtypes.bfloat16) to a new GPU tensor; a
    Tensor is returned as it is. ``what`` names the array in an error (the caller's argument:
    the package passes "q", "k_cache", ...)."""
    if isinstance(array, Tensor):
        return array
    try:
        a = np.asarray(array)
    except Exception:
        raise InvalidInputError(
            f"{what} must be a numpy array, got {type(array).__name__}") from None
    name = _dtype_name(a.dtype, what)
    a = np.ascontiguousarray(a)
    return Tensor(_native.upload(a if name == "float32" else a.view(np.uint16), name))


def adapter():
    """The GPU in use: name, backend and driver (the default adapter, chosen on first use)."""
    return _native.adapter()



def out_of(as_numpy, t):
    """A native tensor as the caller gets it: numpy when the call was given numpy arrays."""
    wrapped = Tensor(t)
    return wrapped.numpy() if as_numpy else wrapped


