"""Byte counts given as ints or size strings ("12GiB", "80 GB"): the one
grammar `metrale.fit`, `metrale fit` and the pool's sizes take."""

import re
from fractions import Fraction

from ._common import check_index

__all__ = ["SIZE_UNITS", "parse_size"]

# Bytes per unit of a size string: SI (powers of 1000) and IEC (powers of 1024).
SIZE_UNITS = {
    "B": 1,
    "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")
_SIZE_CHARS = 100


def parse_size(value, name="size"):
    """A byte count given as an int or as a size string.

    The grammar of a size string: a decimal number (digits, optionally a
    ``.`` and more digits), optional spaces, then a unit: ``B``; SI units,
    powers of 1000: ``kB`` (or ``KB``), ``MB``, ``GB``, ``TB``, ``PB``; IEC
    units, powers of 1024: ``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB``.  No
    unit means bytes.  Units are case-sensitive (``Gb`` is refused: it
    reads as gigabits); the value must come to a whole, positive number of
    bytes (``"1.5 TiB"`` does, ``"0.5 B"`` does not).  Spaces around the
    string are ignored.

    Parameters
    ----------
    value : int or str
        The byte count (any object with ``__index__`` but ``bool``), or a
        size string such as ``"12GiB"``, ``"80 GB"`` or ``"1.5 TiB"``.
    name : str, optional
        The argument's name, for the error messages.

    Returns
    -------
    int
        The bytes, >= 1 and <= 2**64 - 1.

    Raises
    ------
    TypeError
        `value` is neither an int nor a str; the message names `name`.
    ValueError
        The string does not follow the grammar, names an unknown unit, is
        not a whole number of bytes, or the value is not positive or does
        not fit 64 bits; the message names `name`.
    """
    if isinstance(value, str):
        # No size of 64 bits needs more characters; more digits would reach
        # the interpreter's own limit on converting them (a ValueError naming
        # nothing).
        m = _SIZE.fullmatch(value) if len(value) <= _SIZE_CHARS else None
        unit = SIZE_UNITS.get(m.group(2) or "B") if m else None
        if unit is None:
            raise ValueError(
                f"{name}: {value[:_SIZE_CHARS]!r}{'...' if len(value) > _SIZE_CHARS else ''} is "
                "not a size: a number of bytes, or a number with a unit: "
                "B, kB, MB, GB, TB, PB (powers of 1000) or KiB, MiB, GiB, TiB, PiB "
                "(powers of 1024), e.g. '12GiB' or '80 GB'")
        nbytes = Fraction(m.group(1)) * unit
        if nbytes.denominator != 1:
            raise ValueError(f"{name}: {value!r} is not a whole number of bytes ({float(nbytes)})")
        return check_index(int(nbytes), name, 1)
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int or a size string such as '12GiB', "
                        f"got {type(value).__name__}")
    return check_index(value, name, 1)
