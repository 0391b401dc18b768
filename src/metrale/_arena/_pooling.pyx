# cython: language_level=3, binding=False
"""The arena's pool (docs/torch.md): opening and closing it.  The pool's
own state and operations are metrale._arena._pool; sleep and wake take it
along (_sleep), release closes it (_arena_state)."""

cimport cython
from libc.stdint cimport uint64_t

from metrale._arena._arena_state cimport ArenaState, sleeping
from metrale._arena._pool cimport Pool, pool_new
from metrale._arena._sleep_state cimport TORCH_CLASS
from metrale._base._common cimport u64_arg
from metrale._base._core cimport MT_LIFE_FORKED, MT_LIFE_OK
from metrale._base._life cimport mt_life_enter, mt_life_forked, mt_life_leave, raise_life

from metrale._base.errors import MetraleError
from metrale._sizing._wake import POOL_WAKES as _POOL_WAKES


@cython.binding(True)
def open_pool(ArenaState self, nbytes, wake="zero"):
    """Reserve a pool of `nbytes` beside the buffers (docs/torch.md).

    The pool is a range of addresses of its own, out of which segments are
    handed out (``pool.alloc``; ``metrale.torch.pool`` makes it the
    allocator of a ``torch.cuda.MemPool``), backed by physical memory as
    they are taken, at the backend's allocation granularity.  It sleeps
    and wakes with the arena, which keeps its segments' addresses, and is
    closed by `release` (which refuses while segments are handed out).

    Parameters
    ----------
    nbytes : int
        The range's bytes (rounded up to the granularity): the most the
        pool's segments can hold at once.  ``metrale.fit`` can budget it
        (``torch_pool_bytes=``).
    wake : str, optional
        Its wake contract (docs/stable-addresses.md), what `wake` gives its
        segments after a sleep: ``"zero"`` (the default) zeros;
        ``"offload"``: their bytes (moved to host memory mapped at their
        addresses while asleep: every `sleep` offloads the pool unless it
        names ``"torch"`` in `discard`); ``"undefined"``: whatever the new
        memory holds (graphs that write before they read).

    Returns
    -------
    Pool

    Raises
    ------
    TypeError, ValueError
        `nbytes` is not a positive int, or `wake` not one of the pool's
        contracts.
    OutOfMemoryError
        The address range could not be reserved.
    MetraleError
        The arena is not reserved (``reserve=``), already has a pool,
        sleeps or is released.
    """
    cdef ArenaState a = self
    cdef Pool p
    # Converted before the arena is held (an __index__ is user code); at most
    # 2**62, more than any device's address space.
    cdef uint64_t n = u64_arg(nbytes, "nbytes", 1, <uint64_t>1 << 62)
    if type(wake) is not str:
        raise TypeError(f"open_pool: wake must be a str, got {type(wake).__name__}")
    if wake not in _POOL_WAKES:
        raise ValueError(f"open_pool: wake must be one of {', '.join(map(repr, _POOL_WAKES))} "
                         f"(a pool's bytes have no element type to fill), got {wake!r}")
    rc = mt_life_enter(a._life)
    if rc != MT_LIFE_OK:
        raise_life(rc, "the buffer arena", "open_pool")
    try:
        if a._reservation is None:
            raise MetraleError("open_pool: a pool lives in a reserved arena's address space: "
                               "make the arena with reserve= (docs/stable-addresses.md)")
        if a._pool is not None:
            raise MetraleError("open_pool: the arena already has a pool (arena.pool)")
        if sleeping(a):
            raise MetraleError("open_pool: the buffer arena is sleeping")
        p = pool_new(a._gpu, n)
        p.wake = wake
        a._pool = p
        return p
    finally:
        mt_life_leave(a._life)


@cython.binding(True)
def pool(ArenaState self):
    """The arena's pool (`open_pool`), or None."""
    return self._pool


@cython.binding(True)
def close_pool(ArenaState self):
    """Close the arena's pool: unmap its memory and free its range.

    Raises
    ------
    MetraleError
        Segments are still handed out (torch holds them: its tensors, the
        graphs captured into the pool, the MemPool), or the backend failed
        (what it could not free stays; call again).
    """
    cdef ArenaState a = self
    if a._pool is None:
        return None
    if mt_life_forked(a._life):         # the pool goes with the arena's release alone
        raise_life(MT_LIFE_FORKED, "the buffer arena", "close_pool")
    err = a._pool.close()
    if a._pool.closed:
        a._pool = None
        if a._sleep_state is not None:
            a._sleep_state.forget_class(TORCH_CLASS)
    if err is not None:
        raise err
    return None
