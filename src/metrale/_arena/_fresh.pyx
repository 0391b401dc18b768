# cython: language_level=3, binding=False
"""What an arena's new memory starts with (docs/stable-addresses.md): a new or
grown arena its init_zero buffers zeroed and its ``"fill:VALUE"`` buffers
filled; a woken one what each buffer's wake contract gives it (zeros by
default, its fill, nothing for ``"undefined"``), spared where the wake copies
bytes back.  The contracts are the buffer set's (metrale/_sizing/_wake.py).
"""

from libc.stdint cimport uint64_t, uintptr_t

from metrale._arena._arena_state cimport ArenaState
from metrale._arena._debug cimport fill_spans, refill_guards
from metrale._arena._offload cimport outside
from metrale._backends._backend cimport Backend
from metrale._base._core cimport MT_MAX_RANGES, mt_range

from metrale._sizing._wake import fills_of as _fills_of


cdef int init_fresh(ArenaState a) except -1:
    cdef Py_ssize_t i
    cdef Backend be = a._gpu
    cdef bint some = False
    for name in a._buffers.groups["init_zero"]:
        i = a._index[name]
        if a._layout.size[i]:
            be.memset(a._base + a._layout.offset[i], a._layout.size[i], 0)
            some = True
    fills = _fills(a, [])
    if fills:
        fill_spans(be, a._base, fills, 0)
    if some or fills:
        be.sync(0)
    return 0


cdef list _fills(ArenaState a, list spans, object ids=None):
    """(offset, bytes, pattern) of the fill buffers (of `ids`, where given) at
    their sizes, less `spans` ((lo, hi) slab ranges)."""
    cdef Py_ssize_t i
    out = []
    for name, pattern in _fills_of(a._buffers):
        i = a._index[name]
        if ids is not None and i not in ids:
            continue
        for x, y in outside(a._layout.offset[i], a._layout.offset[i] + a._layout.size[i], spans):
            if y > x:
                out.append((x, y - x, pattern))
    return out


cdef int wake_fresh(ArenaState a, list spans, list ids) except -1:
    cdef Py_ssize_t i
    cdef uint64_t g = a._reservation.granule
    cdef Backend be = a._gpu
    cut = [(o, o + n) for o, n in spans]
    spare = set(a._buffers.groups["wake_fill"]) | set(a._buffers.groups["wake_undefined"])
    names = a._buffers.names
    woken = set(ids)
    want, kept = [], list(cut)
    for i in range(len(names)):
        lo, hi = a._layout.offset[i], a._layout.offset[i] + a._layout.size[i]
        if i not in woken or names[i] in spare:
            kept.append((lo, hi))       # not zeroed, nor merged over
        elif hi > lo:
            want.extend(outside(lo, hi, cut))
    zero_spans(be, a._base, want, g, kept)
    fills = _fills(a, cut, woken)
    if fills:
        fill_spans(be, a._base, fills, 0)
    refill_guards(a, ids)
    return 0


cdef int zero_spans(Backend be, uintptr_t base, list ranges, uint64_t g,
                    list spared=None) except -1:
    cdef mt_range batch[MT_MAX_RANGES]
    cdef int k = 0
    # Ranges less than a granule apart and with nothing spared between are
    # zeroed as one (the bytes between are no one's): both ends are mapped,
    # so the granules between are.
    sparing = sorted(spared) if spared is not None else []
    merged = []
    for x, y in sorted(ranges):
        if merged and x - merged[-1][1] < g and not _between(sparing, merged[-1][1], x):
            merged[-1][1] = max(merged[-1][1], y)
        elif y > x:
            merged.append([x, y])
    for x, y in merged:
        batch[k].offset, batch[k].length = x, y - x
        k += 1
        if k == MT_MAX_RANGES:
            be.zero_ranges(base, batch, k, 0)
            k = 0
    if k:
        be.zero_ranges(base, batch, k, 0)
    return 0


cdef bint _between(list spared, uint64_t lo, uint64_t hi):
    """Whether one of the sorted (lo, hi) `spared` ranges meets [lo, hi)."""
    for x, y in spared:
        if x >= hi:
            return False
        if y > lo and x < hi:
            return True
    return False
