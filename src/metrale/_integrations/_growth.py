"""How an arena's buffers grow with max_batch_tokens near a given M (what
``metrale fit --explain`` shows): each buffer's bytes at both ends of a span
of M.  Pure Python over the sizes; metrale.fitting publishes it.
"""

from .._base._common import check_index
from .._base._math import U64_MAX
from .._sizing.sizes import BufferSizes

__all__ = ["growth", "growth_span"]


def growth(config, max_batch_tokens, max_seq_len, kv_block_size, max_batch_size, *,
           tp_size=1, env=None, target=None, buffers=None):
    """How each buffer grows with max_batch_tokens near a given M.

    The bytes each buffer gains per token from ``M // 2`` to ``M`` (from 1
    to 2 when M is 1), largest first: which buffers dominate the arena's
    growth, what ``metrale fit --explain`` shows.  Averaged over that span
    because many sizes grow in steps of 16 tokens (GEMM tiles) or stop
    growing at a cap (``logits`` at the verify rows).

    Parameters
    ----------
    config : ModelConfig
        The model's shape.
    max_batch_tokens : int
        M (>= 1).
    max_seq_len, kv_block_size, max_batch_size, tp_size, env, target, buffers
        As `BufferSizes.from_config` takes them (`buffers`: the set, None
        for `REFERENCE`).

    Returns
    -------
    list of (str, int, int)
        ``(buffer, bytes at the span's start, bytes at its end)`` for every
        buffer that grows over the span ``growth_span(max_batch_tokens)``,
        the fastest-growing first (ties in canonical order).

    Raises
    ------
    TypeError, ValueError
        As `BufferSizes.from_config`.
    """
    lo, hi = growth_span(max_batch_tokens)
    a, b = (BufferSizes.from_config(config, m, max_seq_len, kv_block_size, max_batch_size,
                                    target=target, env=env, tp_size=tp_size, buffers=buffers)
            for m in (lo, hi))
    rows = [(n, a[n], b[n]) for n in b if b[n] > a[n]]
    rows.sort(key=lambda r: r[1] - r[2])        # stable: equal growth keeps the set's order
    return rows


def growth_span(max_batch_tokens):
    """The span of max_batch_tokens `growth` measures over near M.

    Parameters
    ----------
    max_batch_tokens : int
        M (>= 1).

    Returns
    -------
    tuple of (int, int)
        ``(M // 2, M)``, or ``(1, 2)`` for M = 1.

    Raises
    ------
    TypeError, ValueError
        `max_batch_tokens` is not an int >= 1 (below 2**64 - 1).
    """
    m = check_index(max_batch_tokens, "max_batch_tokens", 1, U64_MAX - 1)
    return (1, 2) if m == 1 else (m // 2, m)
