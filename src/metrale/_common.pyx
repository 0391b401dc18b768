# cython: language_level=3, boundscheck=False, wraparound=False, binding=False
"""Argument checks shared by every metrale module.

One rule for integer arguments, in the spirit of numpy.random's
`check_constraint`: any object with `__index__` (numpy integers included) but
not `bool`, within [minimum, maximum], where maximum defaults to 2**64 - 1.
Wrong types raise TypeError, values out of range ValueError, each naming the
argument.  One rule for streams: an int handle or an object of the CUDA
stream protocol.
"""

from cpython.number cimport PyNumber_Index
from libc.stdint cimport uint64_t, uintptr_t

__all__ = ["check_index", "U64_MAX"]

U64_MAX = 0xFFFFFFFFFFFFFFFF


cdef str _show(object v):
    # Huge ints have no str() past sys.get_int_max_str_digits(): say their size.
    if v.bit_length() > 256:
        return f"an int of {v.bit_length()} bits"
    return str(v)


cdef object _to_int(object value, str name):
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return PyNumber_Index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


cdef uint64_t u64_arg(object value, str name, uint64_t minimum=0,
                      uint64_t maximum=0xFFFFFFFFFFFFFFFF) except? 0:
    """`value` as a uint64_t within [minimum, maximum]."""
    cdef uint64_t x
    if type(value) is not int:
        value = _to_int(value, name)
    if value < 0:
        raise ValueError(f"{name} must be >= {minimum}, got {_show(value)}")
    try:
        x = value
    except OverflowError:
        x = 0xFFFFFFFFFFFFFFFF
        if maximum == x:
            raise ValueError(f"{name} must fit in 64 bits unsigned (<= 2**64 - 1), "
                             f"got {_show(value)}") from None
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {_show(value)}")
    if x > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {_show(value)}")
    return x


cdef object index_arg(object value, str name, uint64_t minimum=0,
                      uint64_t maximum=0xFFFFFFFFFFFFFFFF):
    """`value` as an exact int within [minimum, maximum]."""
    if type(value) is not int:
        value = _to_int(value, name)
    u64_arg(value, name, minimum, maximum)
    return value


def check_index(value, name, minimum=0, maximum=U64_MAX):
    """Return `value` as an int in [minimum, maximum] (default: 0 .. 2**64 - 1).

    Accepts any object with ``__index__`` except ``bool``.

    Raises
    ------
    TypeError
        `value` is not an integer; the message names `name`.
    ValueError
        `value` is out of range; the message names `name`.
    """
    return index_arg(value, name, minimum, maximum)


cdef uintptr_t _handle(object value, str what) except? 0:
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"stream: {what} must be an int handle, got {type(value).__name__}")
    return u64_arg(value, "stream")


cdef uintptr_t as_stream(object stream) except? 0:
    """A stream handle from an int (0 = the legacy default stream), an object
    of the CUDA stream protocol (`__cuda_stream__()` returning (0, handle)),
    or an object with an int `cuda_stream` (torch) or `ptr` (CuPy)."""
    if type(stream) is int:
        return u64_arg(stream, "stream")
    if stream is None or isinstance(stream, bool):
        raise TypeError(f"stream must be an int handle or a stream object, got {type(stream).__name__}")
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        if not callable(proto):
            raise TypeError("stream.__cuda_stream__ must be a method returning (0, handle)")
        got = proto()
        if type(got) is not tuple or len(got) != 2:
            raise TypeError("stream.__cuda_stream__() must return a (version, handle) tuple, "
                            f"got {type(got).__name__}")
        version, handle = got
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"stream.__cuda_stream__() version must be an int, got {type(version).__name__}")
        if version != 0:
            raise ValueError(f"stream.__cuda_stream__() protocol version {version} is not supported "
                             "(expected 0)")
        return _handle(handle, "the handle of __cuda_stream__()")
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if handle is not None:
            return _handle(handle, f"stream.{attr}")
    if hasattr(type(stream), "__index__"):
        return u64_arg(stream, "stream")
    raise TypeError("stream must be an int handle or an object with __cuda_stream__, "
                    f"cuda_stream or ptr, got {type(stream).__name__}")
