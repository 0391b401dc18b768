# cython: language_level=3, binding=False
"""The reference's debug checksum (``debug_buffer_checksum``): the probed
buffers (the set's ``groups["checksum"]``) copied to the host and summed as
float32 lanes (src/debug.c), one log record each.  BufferArena binds it from
here.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport free, malloc

from metrale._arena._arena_state cimport ArenaState
from metrale._base._common cimport as_stream, index_arg, logger
from metrale._base._core cimport MT_IN_CHECKSUM, mt_checksum_f32
from metrale._base._life cimport mt_life_leave


@cython.binding(True)
def debug_buffer_checksum(ArenaState self, gpu=None, stream=None, tag="", *, level=None):
    """Log sum, sum of squares and sum of |x| of the probed buffers (16 of
    `REFERENCE`).

    Each buffer of the set's ``groups["checksum"]`` is synchronized, copied to the
    host and read as float32 lanes (NaN and infinite lanes skipped); one
    record per buffer (WARNING, as the reference logs them, unless `level`
    says otherwise) goes to the ``metrale`` logger:
    ``METRALE_BUF_CKSUM[<tag>] <name> bytes=<n> sum=.. ssq=.. sabs=..``.
    A failed copy skips that buffer: a debugging aid never raises for it.

    Parameters
    ----------
    gpu : Backend, optional
        The arena's own backend; None (the default) means that one.
    stream : int or stream object, optional
        Synchronized before, and used for, the copies.
    tag : str, optional
        Label of the records (e.g. the layer and step).
    level : int, keyword-only, optional
        The logging level of the records (``logging.DEBUG`` ...); None (the
        default) is ``logging.WARNING``.

    Raises
    ------
    TypeError
        `tag` is not a str, or `level` not an int.
    MetraleError
        `gpu` is another backend or the arena is released.
    """
    cdef ArenaState a = self
    cdef double out[3]
    cdef void *host = NULL
    cdef uint64_t most = 0, n
    cdef uintptr_t s, base
    cdef int b
    cdef bint no_host = False
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str, got {type(tag).__name__}")
    lvl = 30 if level is None else index_arg(level, "level", 0, 0x7FFFFFFF)   # 30: WARNING
    s = as_stream(stream)
    records = []
    # The sums are taken while the arena is held, the records logged after it
    # is left: no logging handler runs while the slab is in use.
    a._enter(gpu)
    try:
        base = a._base
        try:
            a._gpu.sync(s)
        except Exception:
            pass
        names = a._buffers.names
        for b in range(a._layout.n):
            if a._layout.flags[b] & MT_IN_CHECKSUM and a._layout.size[b] > most:
                most = a._layout.size[b]
        if most:
            host = malloc(most)
            no_host = host == NULL
        for b in range(a._layout.n if host != NULL else 0):     # the set's order
            n = a._layout.size[b]
            if not a._layout.flags[b] & MT_IN_CHECKSUM or n == 0:
                continue
            try:
                a._gpu.d2h(host, base + a._layout.offset[b], n, s)
            except Exception:
                continue     # a failed copy skips that buffer: a debugging aid never raises
            with nogil:
                mt_checksum_f32(host, n, out)
            records.append((names[b], n, out[0], out[1], out[2]))
    finally:
        free(host)
        mt_life_leave(a._life)
    log = logger()
    if no_host:
        log.log(lvl, "METRALE_BUF_CKSUM[%s] skipped: no %d-byte host buffer", tag, most)
    for name, n, x, xx, ax in records:
        log.log(lvl, "METRALE_BUF_CKSUM[%s] %s bytes=%d sum=%.6f ssq=%.6f sabs=%.6f",
                tag, name, n, x, xx, ax)
    return None
