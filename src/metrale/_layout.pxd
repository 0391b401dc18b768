# The slab plan (see _layout.pyx), for the arena to place its buffers with.
from metrale._core cimport mt_layout

# Fill *L for `sizes` (a BufferSizes); ValueError when the slab does not fit 64 bits.
cdef int plan_into(mt_layout *L, object sizes, object max_batch_tokens) except -1

cdef class SlabPlan:
    cdef mt_layout L
