# cython: language_level=3, binding=False
"""The carve of the row-wise BF16 weight slab (the reference's
``take_ssm_rowwise_w_bf16``): slices of the ``ssm_rowwise_w_bf16`` buffer
handed out by one atomic cursor step each (src/cursor.c), at model load.
BufferArena binds it from here.
"""

cimport cython
from cpython.long cimport PyLong_FromSize_t
from libc.stdint cimport uint64_t

from metrale._arena._arena_state cimport ArenaState
from metrale._base._common cimport u64_arg
from metrale._base._core cimport MT_LIFE_OK, MT_LIFE_RELEASED, mt_cursor_take
from metrale._base._life cimport mt_life_enter, mt_life_leave, raise_life

from metrale._base.errors import MetraleError


@cython.binding(True)
def take_ssm_rowwise_w_bf16(ArenaState self, nbytes):
    """Carve the next `nbytes` of the row-wise BF16 weight slab.

    One atomic cursor step: concurrent callers get disjoint slices; once
    a carve has overrun the slab every later one fails too.

    Parameters
    ----------
    nbytes : int
        Bytes to carve (0 .. 2**64 - 1).

    Returns
    -------
    int
        Device pointer of the slice.

    Raises
    ------
    MetraleError
        The slab is absent (no METRALE_FP8_ROWWISE=1, or released) or
        exhausted.
    """
    cdef uint64_t base = 0, want, size = 0
    cdef int rc = MT_LIFE_RELEASED
    cdef int b = self._index.get("ssm_rowwise_w_bf16", -1)
    want = u64_arg(nbytes, "bytes")
    if b >= 0:
        size = self._layout.size[b]
    if size:
        rc = mt_life_enter(self._life)
    if rc != MT_LIFE_OK:
        _no_carve(rc, want)
    try:
        if mt_cursor_take(self._cursor, want, size, &base) != 0:
            _no_carve(MT_LIFE_OK, want, base, size)
        return PyLong_FromSize_t(self._base + self._layout.offset[b] + base)
    finally:
        mt_life_leave(self._life)


cdef int _no_carve(int rc, uint64_t want, uint64_t base=0, uint64_t size=0) except -1:
    """Refuse a carve of `want` bytes: the arena's state `rc` (released: the
    slab is absent), or the slab exhausted (rc OK) at `base` of `size`."""
    if rc == MT_LIFE_OK:
        raise MetraleError(
            f"row-wise BF16 weight slab exhausted: cannot carve {want} bytes at offset "
            f"{base} of a {size}-byte slab; the slab is sized for num_ssm_layers x "
            "(in_proj_qkvz + out_proj), so this is a sizing bug")
    if rc != MT_LIFE_RELEASED:
        raise_life(rc, "the buffer arena", "take_ssm_rowwise_w_bf16")
    raise MetraleError(
        f"row-wise BF16 weight slab is absent: cannot carve {want} bytes; the arena was "
        "sized without METRALE_FP8_ROWWISE=1, its buffer set lacks the slab, or it has "
        "been released. The weight loader and this slab read the same lever, so they "
        "cannot legitimately disagree")
