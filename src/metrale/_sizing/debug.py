"""Debug arenas: the options and the reports (docs/debug.md).

An arena built with ``debug=True`` (or ``debug=DebugOptions(...)``) places a
guard band after every live buffer; `BufferArena.check_guards` reports the
bands a kernel wrote into as `GuardDamage` values, `BufferArena.find_nonfinite`
the buffers holding NaN or Inf in their live rows as `NonFinite` values (in a
`NonFiniteScan`, a list that also says what was scanned and what skipped).
Plain Python (records only): they sit on the arena's import path.
"""

from .._base._record import Record

__all__ = ["DebugOptions", "GuardDamage", "NonFinite", "NonFiniteScan", "DEFAULT_GUARD_BYTES",
           "GUARD_ALIGN", "MAX_GUARD_BYTES", "SKIP_REASONS"]

# The guard band's default size, its unit (the slab's alignment) and its cap.
DEFAULT_GUARD_BYTES = 4096
GUARD_ALIGN = 256
MAX_GUARD_BYTES = 1 << 30
# Why `find_nonfinite` leaves a buffer out (`NonFiniteScan.skipped`), each
# with its meaning (docs/debug.md).
SKIP_REASONS = {
    "empty": "0 bytes in this arena",
    "untyped": "no element type (dtype None: raw bytes, mixed regions, q8_1 blocks)",
    "not float": "an integer or bool element type: no NaN to find",
    "unsupported": "a float type the scan does not decode (float16, float64, float8_e5m2, "
                   "complex)",
    "not cleared": "in no zero_all_rows clearing, so it may hold stale bytes: scanned "
                   "(whole) only when named in `names`",
}


class DebugOptions(Record):
    """How a debug arena is built (``BufferArena.new(..., debug=DebugOptions(...))``).

    Parameters
    ----------
    guard_bytes : int, optional
        Bytes of guard band after every live buffer, beyond the padding up to
        the next 256-byte boundary (which belongs to the band too): a
        positive multiple of 256, at most 2**30.  Default 4096.  An overrun
        that jumps further than the band lands in the next buffer unseen.

    Attributes
    ----------
    guard_bytes : int
        The guard bytes after every live buffer.

    Raises
    ------
    TypeError
        `guard_bytes` is not an int.
    ValueError
        `guard_bytes` is not a positive multiple of 256 up to 2**30.
    """

    __slots__ = ("guard_bytes",)
    _defaults = {"guard_bytes": DEFAULT_GUARD_BYTES}

    def __init__(self, guard_bytes=DEFAULT_GUARD_BYTES):
        if isinstance(guard_bytes, bool) or not hasattr(type(guard_bytes), "__index__"):
            raise TypeError(f"guard_bytes must be an int, got {type(guard_bytes).__name__}")
        guard_bytes = guard_bytes.__index__()
        if guard_bytes <= 0 or guard_bytes % GUARD_ALIGN or guard_bytes > MAX_GUARD_BYTES:
            raise ValueError(f"guard_bytes must be a positive multiple of {GUARD_ALIGN} up to "
                             f"{MAX_GUARD_BYTES}, got {guard_bytes}")
        super().__init__(guard_bytes)

    @staticmethod
    def coerce(debug):
        """The options a ``debug=`` argument asks for.

        Parameters
        ----------
        debug : bool, DebugOptions or None
            True: the default options; False or None: no debug mode.

        Returns
        -------
        DebugOptions or None

        Raises
        ------
        TypeError
            `debug` is anything else.
        """
        if debug is None or debug is False:
            return None
        if debug is True:
            return DebugOptions()
        if isinstance(debug, DebugOptions):
            return debug
        raise TypeError(f"debug must be a bool or a DebugOptions, got {type(debug).__name__}")


class GuardDamage(Record):
    """A guard band that no longer holds its pattern (`BufferArena.check_guards`).

    Attributes
    ----------
    buffer : str
        The buffer the band follows: the one that was overrun (or, for a
        wild write, the one whose band it hit).
    offset : int
        The first damaged byte, counted from the buffer's end (0: the first
        byte past it).
    nbytes : int
        Bytes of the band that differ from the pattern.
    band_bytes : int
        The band's length: the padding up to the next 256-byte boundary plus
        the arena's guard bytes.
    """

    __slots__ = ("buffer", "offset", "nbytes", "band_bytes")

    def __str__(self):
        return (f"{self.buffer}: {self.nbytes} byte(s) of its {self.band_bytes}-byte guard "
                f"overwritten, the first {self.offset} byte(s) past its end")


class NonFinite(Record):
    """A buffer with NaN or infinite elements in the bytes
    `BufferArena.find_nonfinite` scanned (live rows, or all of it).

    Attributes
    ----------
    buffer : str
        The buffer.
    nan : int
        NaN elements.
    inf : int
        Infinite elements.
    first_offset : int
        Byte offset in the buffer of the first non-finite element.
    first_row : int or None
        The token row holding it (its offset divided by the row bytes of
        the zero_all_rows rule); None when the buffer was scanned whole
        because it is not split in rows.
    """

    __slots__ = ("buffer", "nan", "inf", "first_offset", "first_row")

    def __str__(self):
        where = f"row {self.first_row}" if self.first_row is not None else f"byte {self.first_offset}"
        return f"{self.buffer}: {self.nan} NaN, {self.inf} Inf; the first at {where}"


class NonFiniteScan(list):
    """What `BufferArena.find_nonfinite` returns: the `NonFinite` values, one
    per buffer holding NaN or Inf, in the set's order, in a list that also
    says what the scan covered.

    It is a ``list``: it compares, iterates and indexes as the plain list
    earlier releases returned (``scan == []`` on a clean step; the two
    attributes take no part in comparisons).

    Parameters
    ----------
    found : iterable of NonFinite, optional
        The buffers holding NaN or Inf.
    scanned : mapping of str to int, optional
        Buffer name -> bytes scanned (see Attributes).
    skipped : mapping of str to str, optional
        Buffer name -> a key of `SKIP_REASONS`.

    Attributes
    ----------
    scanned : dict of str to int
        Every buffer the scan decoded as its element type -> the bytes it
        read from the buffer's start: the live rows of a row-trimmed buffer
        (0 at ``tokens=0``), the whole buffer otherwise (one cleared whole,
        or one named in `names`), in the set's order.
    skipped : dict of str to str
        Every other buffer asked for (every buffer of the set when `names`
        is None) -> why it was left out, a key of `SKIP_REASONS`:
        ``"empty"``, ``"untyped"``, ``"not float"``, ``"unsupported"`` or
        ``"not cleared"``; in the set's order.
    """

    __slots__ = ("scanned", "skipped")

    def __init__(self, found=(), scanned=None, skipped=None):
        super().__init__(found)
        self.scanned = dict(scanned or {})
        self.skipped = dict(skipped or {})

    def __reduce__(self):
        return (type(self), (list(self), self.scanned, self.skipped))
