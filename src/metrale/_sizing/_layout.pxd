# The slab plan (see _layout.pyx), for the arena to place its buffers with.
from libc.stdint cimport uint64_t
from metrale._base._core cimport mt_layout

# Fill *L for `sizes` (a BufferSizes), with `guard` bytes of guard band after
# each live buffer (debug arenas; 0: none); ValueError when the slab does not
# fit 64 bits.
cdef int plan_into(mt_layout *L, object sizes, object max_batch_tokens, uint64_t guard=*) except -1
# Start *L for the buffer table of a BufferSet (its flags and alignments).
cdef int table_into(mt_layout *L, object buffers) except -1
# (flags, aligns) of a BufferSet's C table, made once per set.
cdef tuple c_table(object buffers)

cdef class SlabPlan:
    cdef mt_layout L
    cdef object buffer_set        # the BufferSet it places
    cdef object _sizes            # the BufferSizes it places
    cdef uint64_t gran            # a reserved plan's granularity (0 for a plain one)
