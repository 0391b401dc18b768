"""A buffer's wake contract (docs/stable-addresses.md): what `BufferArena.wake`
gives it after a sleep, declared in its spec (``BufferSpec(wake=...)``) and
checked there, and the bytes of a ``"fill:VALUE"`` contract in its element
type.  Pure Python: the spec module and the buffer set read it; the arena
takes the kinds and the fill patterns from the set.
"""

import math
import struct

__all__ = ["WAKES", "POOL_WAKES", "DEFAULT_TAG", "MAX_CLASSES", "check_tag", "check_wake",
           "fill_pattern", "fills_of", "wake_kind"]

# The contracts: zeros (the default), the bytes back through a pinned host copy,
# the bytes back and readable at their addresses while asleep (host memory
# mapped there), a constant, nothing (asked for by name: never a default).
WAKES = ("zero", "keep", "offload", "undefined")
_FILL = "fill:"
# The arena's pool (open_pool): its segments' bytes are torch's, of no one type.
POOL_WAKES = ("zero", "offload", "undefined")

# A buffer's class (`BufferSpec(tag=...)`): the buffers a guard names together
# and, with the pool's class "torch", what sleeps and wakes apart.  An untagged
# buffer is in the class "default".  A guard tests a 64-bit mask: 63 classes
# of buffers and the pool's.
DEFAULT_TAG = "default"
MAX_CLASSES = 63
_MAX_TAG = 64

_INTS = {"bool": (0, 1), "int8": (-2**7, 2**7 - 1), "int16": (-2**15, 2**15 - 1),
         "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1), "uint8": (0, 2**8 - 1),
         "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1)}
_STRUCT = {"float16": "<e", "float32": "<f", "float64": "<d"}
# The 8-bit floats by (exponent bits, mantissa bits, bias, whether the top
# exponent is inf/NaN (IEEE) or, as E4M3's "fn", only S.1111.111 is NaN).
_FP8 = {"float8_e4m3fn": (4, 3, 7, False), "float8_e5m2": (5, 2, 15, True)}
# The small floats rounded here: (exponent bits, mantissa bits, bias, largest
# finite value).
_MINI = {"bfloat16": (8, 7, 127, (2 - 2**-7) * 2.0**127),
         "float8_e4m3fn": (4, 3, 7, 448.0), "float8_e5m2": (5, 2, 15, 57344.0)}


def wake_kind(wake):
    """The kind of a checked contract.

    Parameters
    ----------
    wake : str
        A contract as `check_wake` gives it.

    Returns
    -------
    str
        One of `WAKES`, or ``"fill"``.
    """
    return "fill" if wake.startswith(_FILL) else wake


def check_tag(where, tag, pool_name):
    """Check a spec's `tag` (a class name) and give it.

    Parameters
    ----------
    where : str
        The spec, for messages.
    tag : object
        As `BufferSpec` takes it.
    pool_name : str
        The pool's class, which no buffer may take.

    Returns
    -------
    str

    Raises
    ------
    TypeError, ValueError
        Not a str; not an ASCII identifier of at most 64 characters; the
        pool's class.
    """
    if not isinstance(tag, str):
        raise TypeError(f"{where}: tag must be a str, got {type(tag).__name__}")
    if not (tag.isascii() and tag.isidentifier()) or len(tag) > _MAX_TAG:
        raise ValueError(f"{where}: tag must be an ASCII identifier of at most {_MAX_TAG} "
                         f"characters (a class name such as 'weights' or 'kv'), got {tag!r}")
    if tag == pool_name:
        raise ValueError(f"{where}: tag {tag!r} is the arena's pool's class")
    return tag


def check_wake(where, wake, dtype, init_zero):
    """Check a spec's `wake` and give it as stored.

    Parameters
    ----------
    where : str
        The spec, for messages (``"buffer spec 'x'"``).
    wake : object
        As `BufferSpec` takes it.
    dtype : str or None
        The spec's element type (a fill needs one).
    init_zero : bool
        The spec's `init_zero` (zeroed when built and on wake: a fill or
        ``"undefined"`` contradicts it).

    Returns
    -------
    str
        `wake`, a fill's value as written without surrounding blanks.

    Raises
    ------
    TypeError, ValueError
        Not a str; not a contract; a fill without a dtype, of a complex
        type, or of a value beyond the element type's range (a value between
        two of its values is rounded to the nearer, ties to even).
    """
    if not isinstance(wake, str):
        raise TypeError(f"{where}: wake must be a str, got {type(wake).__name__}")
    if wake.startswith(_FILL):
        wake = _FILL + wake[len(_FILL):].strip()
        fill_pattern(wake, dtype, where)
    elif wake not in WAKES:
        raise ValueError(f"{where}: wake must be one of {', '.join(map(repr, WAKES))} or "
                         f"'fill:VALUE', got {wake!r}")
    if init_zero and wake_kind(wake) in ("fill", "undefined"):
        raise ValueError(f"{where}: init_zero (zeroed when built and on wake) contradicts "
                         f"wake={wake!r}")
    return wake


def fill_pattern(wake, dtype, where="wake"):
    """The 16 bytes a ``"fill:VALUE"`` buffer is written with: the value's
    little-endian bytes in `dtype`, repeated (the fill kernel writes byte
    ``pattern[offset % 16]`` at slab offset `offset`; a buffer starts
    256-aligned, so each element gets the value whole).

    Parameters
    ----------
    wake : str
        A ``"fill:VALUE"`` contract.
    dtype : str or None
        The buffer's element type.
    where : str, optional
        What to name in messages.

    Returns
    -------
    bytes

    Raises
    ------
    ValueError
        As `check_wake`.
    """
    text = wake[len(_FILL):]
    if dtype is None:
        raise ValueError(f"{where}: wake={wake!r}: a fill needs the buffer's dtype (the value "
                         "is written in its element type)")
    if dtype in _INTS:
        lo, hi = _INTS[dtype]
        words = {"true": 1, "false": 0} if dtype == "bool" else {}
        try:
            value = words[text.lower()] if text.lower() in words else int(text, 0)
        except ValueError:
            raise ValueError(f"{where}: wake={wake!r}: {text!r} is not an integer "
                             f"({dtype})") from None
        if not lo <= value <= hi:
            raise ValueError(f"{where}: wake={wake!r}: {value} is outside {dtype} "
                             f"({lo} .. {hi})")
        size = (hi.bit_length() + (lo < 0) + 7) // 8
        raw = value.to_bytes(size, "little", signed=lo < 0)
    else:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{where}: wake={wake!r}: {text!r} is not a number "
                             f"({dtype})") from None
        raw = _float_bytes(value, dtype, where, wake)
    return (raw * (16 // len(raw)))[:16]


def fills_of(buffers):
    """The fills of a buffer set: what the arena writes over its fill buffers.

    Parameters
    ----------
    buffers : BufferSet

    Returns
    -------
    tuple of (str, bytes)
        (name, 16-byte pattern) of each ``"fill:VALUE"`` buffer, in set
        order (cached in the set).
    """
    fills = buffers._cache.get("fills")
    if fills is None:
        fills = buffers._cache["fills"] = tuple(
            (s.name, fill_pattern(s.wake, s.dtype)) for s in buffers.specs
            if s.wake.startswith(_FILL))
    return fills


def _float_bytes(value, dtype, where, wake):
    # rounded to the nearest value of the type, ties to even (as torch.full
    # writes it); beyond its finite range refused, never made infinite
    if dtype in _STRUCT:
        try:
            return struct.pack(_STRUCT[dtype], value)
        except OverflowError:
            pass
    elif dtype in _MINI:
        ebits, mbits, bias, top = _MINI[dtype]
        v = value if math.isnan(value) or math.isinf(value) else _rounded(value, mbits, bias)
        if dtype == "bfloat16" and (not abs(v) > top or math.isinf(v)):  # float32's top half
            return struct.pack("<f", v)[2:]
        for code in range(256 if dtype in _FP8 else 0):
            c = _fp8_value(code, *_FP8[dtype])
            if c is not None and _same(c, v):
                return bytes([code])
    else:
        raise ValueError(f"{where}: wake={wake!r}: a fill of {dtype} is not supported (an "
                         "integer, bool or real floating type)")
    raise ValueError(f"{where}: wake={wake!r}: {value!r} is outside the values of {dtype}")


def _rounded(x, mbits, bias):
    """`x` rounded to `mbits` mantissa bits (subnormal below 2**(1 - bias)),
    ties to even: every step exact in a double."""
    if x == 0:
        return x
    e = max(math.frexp(abs(x))[1] - 1, 1 - bias)
    q = math.ldexp(1.0, e - mbits)
    return math.copysign(round(abs(x) / q) * q, x)


def _same(a, b):
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                 math.copysign(1, b))


def _fp8_value(code, ebits, mbits, bias, ieee):
    """The value of an 8-bit float code (NaN for its NaN codes, the first
    NaN code only, so that a NaN fill has one encoding)."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
    top = (1 << ebits) - 1
    if ieee and e == top:
        if m == 0:
            return sign * math.inf
        return math.nan if code == (top << mbits) | (1 << (mbits - 1)) else None
    if not ieee and e == top and m == (1 << mbits) - 1:
        return math.nan if code == 0x7F else None
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - mbits)
    return sign * (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
