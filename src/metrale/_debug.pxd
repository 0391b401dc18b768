# Debug arenas (see _debug.pyx): the operations BufferArena runs on its slab.
from libc.stdint cimport uint64_t, uintptr_t
from metrale._backend cimport Backend
from metrale._core cimport mt_layout

cdef int fill_guards(Backend be, const mt_layout *L, uintptr_t base, uintptr_t stream) except -1
cdef list check_guards(Backend be, const mt_layout *L, uintptr_t base, uintptr_t stream)
cdef int poison_rows(Backend be, const mt_layout *L, uintptr_t base, uint64_t tokens,
                     uintptr_t stream) except -1
cdef list find_nonfinite(Backend be, const mt_layout *L, uintptr_t base, uint64_t tokens,
                         uintptr_t stream)
cdef dict fingerprint(Backend be, const mt_layout *L, uintptr_t base, list ids, uintptr_t stream)
