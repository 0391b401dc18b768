"""Exact integer rounding shared by the sizing formulas.

Every size is computed with Python ints, so nothing is rounded through floats
and nothing overflows before the final check against 2**64 - 1.
"""

U64_MAX = (1 << 64) - 1


def cdiv(a, b):
    """The ceiling quotient of `a` / `b`, in exact integer arithmetic.

    Parameters
    ----------
    a : int
        The dividend.
    b : int
        The divisor; must be > 0.

    Returns
    -------
    int
        The smallest int q with q * b >= a.

    Raises
    ------
    ZeroDivisionError
        `b` is 0.
    """
    return -(-a // b)


def ceil_to(x, n):
    """`x` rounded up to a multiple of `n`.

    Parameters
    ----------
    x : int
        The value to round.
    n : int
        The multiple; must be > 0.

    Returns
    -------
    int
        The smallest multiple of `n` that is >= `x`.

    Raises
    ------
    ZeroDivisionError
        `n` is 0.
    """
    return -(-x // n) * n
