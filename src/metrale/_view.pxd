# ArenaView (see _view.pyx): made by the arena, counted in its lifetime word.
from libc.stdint cimport uint64_t

from metrale._core cimport mt_life

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

# The converted form of a view's dtype and shape arguments: every conversion
# that can run user code happens here, before the arena's state is read.
cdef tuple view_request(object dtype, object shape)
# A view of buffer `buf` (`nbytes` long at `ptr`) of `arena`: the caller has
# counted its export in `life`, then read `nbytes` and `ptr`; the view owns
# that export once returned (on an exception the caller undoes it).
cdef ArenaView make_view(object arena, mt_life *life, int buf, uint64_t nbytes, object ptr,
                         int dev_type, int dev_id, tuple request)
