"""The exceptions the native module raises: one class per kind of error, each carrying the
library's message (what was expected and what was given)."""


class FlashAttnError(RuntimeError):
    """Any error of the library: no adapter, a device or driver failure, and the base of
    the more specific classes below."""


class InvalidInputError(FlashAttnError, ValueError):
    """A shape, dtype, length or option that does not fit the call."""


class UnsupportedError(FlashAttnError, NotImplementedError):
    """A valid request this backend or device cannot run (the message says why)."""


class OutOfMemoryError(FlashAttnError, MemoryError):
    """The device could not allocate a buffer the call needs."""
