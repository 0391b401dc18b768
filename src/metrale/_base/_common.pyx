# cython: language_level=3, binding=False
"""Argument checks shared by every metrale module.

One rule for integer arguments, in the spirit of numpy.random's
`check_constraint`: any object with `__index__` (numpy integers included) but
not `bool`, within [minimum, maximum], where maximum defaults to 2**64 - 1.
Wrong types raise TypeError, values out of range ValueError, each naming the
argument.  One rule for streams: an int handle, an object of the CUDA
stream protocol, or None for the legacy default stream.  One rule for element
types: the names and spellings numpy gives them (`dtype_info`).
"""

from cpython.number cimport PyNumber_Index
from libc.stdint cimport uint64_t, uintptr_t

from collections.abc import Mapping


__all__ = ["check_index", "seconds_arg", "stream_handle", "MAX_SECONDS", "resolve_dtype", "DTYPE_NAMES", "U64_MAX"]

U64_MAX = 0xFFFFFFFFFFFFFFFF


cdef str _show(object v):
    # Huge ints have no str() past sys.get_int_max_str_digits(): say their size.
    if v.bit_length() > 256:
        return f"an int of {v.bit_length()} bits"
    return str(v)


cdef bint _is_bool(object value):
    # numpy's bool has a (deprecated) __index__ before numpy 2.3: refuse it too.
    t = type(value)
    return isinstance(value, bool) or (t.__name__ in ("bool", "bool_") and
                                       t.__module__ == "numpy")


cdef object _to_int(object value, str name):
    if _is_bool(value):
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

    Accepts any object with ``__index__`` except ``bool``: the rule every
    integer argument of metrale follows.

    Parameters
    ----------
    value : SupportsIndex
        The argument to check.
    name : str
        The argument's name, for the error messages.
    minimum, maximum : int, optional
        The range allowed, inclusive.

    Returns
    -------
    int

    Raises
    ------
    TypeError
        `value` is not an integer; the message names `name`.
    ValueError
        `value` is out of range; the message names `name`.
    """
    return index_arg(value, name, minimum, maximum)


#: The longest any timeout of metrale may be, in seconds: a day (the driver's
#: lock timeout counts milliseconds in 32 bits, a barrier nanoseconds in 64).
MAX_SECONDS = 86400.0


def seconds_arg(value, name):
    """Return a duration argument in seconds as a float: the rule every
    timeout of metrale follows.

    Parameters
    ----------
    value : int or float
        The argument to check (not bool): positive, at most `MAX_SECONDS`.
    name : str
        The argument's name, for the error messages.

    Returns
    -------
    float

    Raises
    ------
    TypeError
        `value` is not a number.
    ValueError
        `value` is not positive, or above `MAX_SECONDS` (infinity and NaN
        included).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not 0 < value <= MAX_SECONDS:        # False for NaN
        raise ValueError(f"{name} must be a number of seconds in (0, {MAX_SECONDS:g}], got "
                         f"{value!r}")
    return float(value)


cdef uintptr_t _handle(object value, str what) except? 0:
    if _is_bool(value) or not hasattr(type(value), "__index__"):
        raise TypeError(f"stream: {what} must be an int handle, got {type(value).__name__}")
    return u64_arg(value, "stream")


cdef uintptr_t as_stream(object stream) except? 0:
    """A stream handle from an int (0 = the legacy default stream), None (the
    same: the default stream, as RMM and cuda.core read it), an object of the
    CUDA stream protocol (`__cuda_stream__()` returning (0, handle)), or an
    object with an int `cuda_stream` (torch) or `ptr` (CuPy)."""
    if type(stream) is int:
        return u64_arg(stream, "stream")
    if stream is None:
        return 0
    if _is_bool(stream):
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


# -- element types ---------------------------------------------------------------
# canonical name -> (array-interface typestr, DLPack type code, bits): the table
# of metrale/_base/_dtypes.py.
from metrale._base._dtypes import DTYPES as _DTYPE_TABLE
cdef dict _DTYPES = dict(_DTYPE_TABLE)

DTYPE_NAMES = tuple(_DTYPES)


cdef dict _spellings():
    """Every string numpy reads as one of _DTYPES (little-endian machine):
    names, typestrings with or without a byte-order mark, one-letter codes,
    and the C / Python type names, which mean what they mean to numpy
    ('float' is float64, 'int' int64, 'i8' int64)."""
    cdef dict out = {}
    for name, (typestr, code, bits) in _DTYPES.items():
        out[name] = name
        if typestr[1] != "V":
            out[typestr] = name
            out[typestr[1:]] = name
            out["=" + typestr[1:]] = name
            if typestr[0] == "|":
                out["<" + typestr[1:]] = name
    for names, name in (
            ("? bool_", "bool"), ("b byte", "int8"), ("B ubyte", "uint8"),
            ("h short", "int16"), ("H ushort", "uint16"), ("i intc", "int32"),
            ("I uintc", "uint32"), ("l q int long longlong intp", "int64"),
            ("L Q uint ulong ulonglong uintp", "uint64"), ("e half", "float16"),
            ("f single", "float32"), ("d double float", "float64"),
            ("F csingle", "complex64"), ("D cdouble complex", "complex128")):
        for alias in names.split():
            out[alias] = name
    return out


cdef dict _SPELLINGS = _spellings()
cdef dict _PYTYPES = {bool: "bool", int: "int64", float: "float64", complex: "complex128"}
cdef dict _SEEN = {}           # dtype argument -> canonical name, bounded


cdef str _unsupported(object dtype):
    raise ValueError(f"dtype {dtype!r} is not supported; use a numpy dtype, a typestring "
                     f"('<f4', 'f4'), or one of {', '.join(_DTYPES)}")


cdef str _resolve(object dtype):
    if isinstance(dtype, str):
        name = _SPELLINGS.get(dtype)
        if name is None:
            _unsupported(dtype)
        return name
    if isinstance(dtype, type):
        # Python scalar types as numpy reads them; numpy / ml_dtypes scalar
        # types by their name (np.float32, ml_dtypes.bfloat16).
        name = _PYTYPES.get(dtype)
        if name is None:
            name = getattr(dtype, "__name__", None)
            name = _SPELLINGS.get(name) if isinstance(name, str) else None
        if name is None:
            _unsupported(dtype)
        return name
    text = str(dtype)
    if text.startswith("torch."):            # torch.float32, torch.float8_e4m3fn
        name = _SPELLINGS.get(text[6:])
        if name is None or text[6:] != name:
            _unsupported(dtype)
        return name
    name = getattr(dtype, "name", None)        # a numpy (or CuPy) dtype object
    if not isinstance(name, str):
        raise TypeError(f"dtype must be a str, a numpy dtype or a scalar type, "
                        f"got {type(dtype).__name__}")
    if getattr(dtype, "byteorder", "=") == ">" or name not in _DTYPES:
        _unsupported(dtype)
    return name


cdef tuple dtype_info(object dtype):
    """(canonical name, array-interface typestr, DLPack code, bits) of a dtype
    argument; TypeError / ValueError naming `dtype` otherwise."""
    name = None
    try:
        name = _SEEN.get(dtype)
    except TypeError:          # unhashable: resolved below, not remembered
        pass
    if name is None:
        name = _resolve(dtype)
        try:
            if len(_SEEN) < 256:
                _SEEN[dtype] = name
        except TypeError:
            pass
    return (name,) + _DTYPES[name]


def stream_handle(stream):
    """The handle of a stream argument, as the arena's methods read it.

    Parameters
    ----------
    stream : int, None or stream object
        An int handle, None (0: the legacy default stream), an object of the
        CUDA stream protocol, or one with an int `cuda_stream` (torch) or
        `ptr` (CuPy).

    Returns
    -------
    int
    """
    return as_stream(stream)


def resolve_dtype(dtype):
    """The canonical name of an element type argument.

    Parameters
    ----------
    dtype : str, numpy.dtype, type or torch.dtype
        A numpy dtype or scalar type, a numpy spelling (``'float32'``,
        ``'<f4'``, ``'f4'``, ``'f'``), a Python scalar type (``float`` is
        float64 and ``int`` int64, as numpy reads them), a torch dtype, or
        one of ``'bfloat16'``, ``'float8_e4m3fn'``, ``'float8_e5m2'``.

    Returns
    -------
    str
        One of `DTYPE_NAMES`.

    Raises
    ------
    TypeError
        `dtype` is not a type description at all.
    ValueError
        `dtype` names a type metrale does not hand out (big-endian, structured,
        object, strings).
    """
    return dtype_info(dtype)[0]


# -- buffer names and serving limits ------------------------------------------------------

cdef object _log = None
cdef tuple _LIMITS = ("max_batch_tokens", "max_seq_len", "kv_block_size", "max_batch_size")


cdef object logger():
    global _log
    if _log is None:
        import logging
        _log = logging.getLogger("metrale")
    return _log


cdef tuple limit_tuple(object lim):
    return (lim.max_batch_tokens, lim.max_seq_len, lim.kv_block_size, lim.max_batch_size)


cdef object limit_arg(object value, str name, uint64_t minimum, object lim,
                      str where="from_sizes"):
    if value is None:
        if lim is None:
            raise TypeError(f"{where}: {name} is required: these sizes were not made by "
                            "BufferSizes.from_config and record no limits")
        return getattr(lim, name)
    value = index_arg(value, name, minimum)
    if lim is not None and value != getattr(lim, name):
        raise ValueError(f"{name}={value} disagrees with the sizes, which were computed for "
                         f"{name}={getattr(lim, name)}")
    return value


cdef list buffer_ids(object names, str arg, object buffers):
    if isinstance(names, str):
        names = (names,)
    try:
        it = iter(names)
    except TypeError:
        raise TypeError(f"{arg} must be a buffer name or an iterable of buffer names, "
                        f"got {type(names).__name__}") from None
    ids = []
    for name in it:
        if not isinstance(name, str):
            raise TypeError(f"{arg}: buffer names must be str, got {type(name).__name__}")
        i = buffers._index.get(name)
        if i is None:
            raise ValueError(f"{arg}: {buffers._unknown(name)}")
        if i not in ids:
            ids.append(i)
    return ids


cdef tuple reserve_limits(object reserve, tuple limits):
    """The reserved limits: `reserve` as a 4-tuple or a dict, each >= the current."""
    if isinstance(reserve, Mapping):
        unknown = set(reserve) - set(_LIMITS)
        if unknown:
            raise ValueError(f"reserve: unknown limit(s) {', '.join(sorted(map(str, unknown)))}")
        values = tuple(reserve.get(k, limits[i]) for i, k in enumerate(_LIMITS))
    elif isinstance(reserve, (tuple, list)):
        if len(reserve) != 4:
            raise ValueError(f"reserve: expected the 4 limits {_LIMITS}, got {len(reserve)}")
        values = tuple(reserve)
    else:
        raise TypeError(f"reserve must be a tuple or dict of the 4 limits, got {type(reserve).__name__}")
    out = []
    for i in range(4):
        v = index_arg(values[i], "reserve: " + _LIMITS[i], 0)
        if v < limits[i]:
            raise ValueError(f"reserve: {_LIMITS[i]}={v} is below the current {_LIMITS[i]}={limits[i]}")
        out.append(v)
    return tuple(out)
