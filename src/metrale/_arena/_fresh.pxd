# What an arena's new memory starts with (see _fresh.pyx): for the modules that
# map it (_construct and _reserve: built or grown; _sleep: woken).
from libc.stdint cimport uint64_t, uintptr_t

from metrale._arena._arena_state cimport ArenaState
from metrale._backends._backend cimport Backend

# Zero the init_zero buffers and fill the "fill:VALUE" ones, whole, and wait:
# what a new arena, or a grown one, starts from.
cdef int init_fresh(ArenaState a) except -1
# What the wake contract of each of buffers `ids` (those woken) gives it
# (zeros, or its fill; nothing for "undefined"), less the slab byte ranges
# `spans` [(offset, bytes)] (the bytes copied back), then their debug guard
# bands: on the default stream, not waited for.
cdef int wake_fresh(ArenaState a, list spans, list ids) except -1
# Zero the (lo, hi) `ranges` from `base` (any order), in as few launches of the
# range kernel as hold them, those less than a granule `g` apart with none of
# the (lo, hi) `spared` ranges between as one (mapped memory between mapped
# ends): on the default stream, not waited for.
cdef int zero_spans(Backend be, uintptr_t base, list ranges, uint64_t g,
                    list spared=*) except -1
