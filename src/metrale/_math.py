"""Exact integer rounding shared by the sizing formulas (ARENA.md §1.3)."""

U64_MAX = (1 << 64) - 1


def cdiv(a, b):
    """The ceiling quotient of a / b (b > 0)."""
    return -(-a // b)


def ceil_to(x, n):
    """x rounded up to a multiple of n."""
    return cdiv(x, n) * n
