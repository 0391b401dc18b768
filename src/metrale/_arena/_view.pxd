# ArenaView (see _view.pyx): made by the arena, counted in its lifetime word.
from libc.stdint cimport uint64_t

from metrale._arena._arena_state cimport ArenaState
from metrale._base._core cimport mt_life

cdef class ArenaView:
    cdef readonly object arena
    cdef readonly str name
    cdef readonly str dtype
    cdef readonly tuple shape
    cdef readonly object ptr
    cdef readonly object nbytes
    cdef str _typestr
    cdef int _dev_type, _dev_id, _code, _bits, _buf
    cdef mt_life *_life           # the arena's, once this view is counted in it

# Each buffer's element type name by id in a BufferSet (its spec's; None where
# untyped).
cdef tuple buffer_dtypes(object buffers)

# The spec's shape of buffer `name` at the arena's limits, or None (1-D).
cdef object own_shape(ArenaState a, str name)
