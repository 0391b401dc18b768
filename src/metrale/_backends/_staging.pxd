# The pinned host memory of one StepInputs (_staging.pyx): its fields, and
# what _step.pyx calls.
from libc.stdint cimport uint64_t

from metrale._backends._backend cimport Backend
from metrale._base._core cimport mt_life


cdef class _Staging:
    cdef Backend _gpu
    cdef mt_life *_life           # counts the views and the StepInputs' operations
    cdef unsigned char *_host     # host_alloc'ed through _gpu (NULL once freed)
    cdef uint64_t nbytes
    # Free the memory now (release(), no view alive); idempotent.
    cdef int _free(self) except -1


# A new staging of `gpu`, holding no memory yet (the caller host_allocs _host
# and sets nbytes).
cdef _Staging staging_new(Backend gpu)
# Export the staging as a 1-D byte buffer owned by `owner`, counted in `life`.
cdef int _export(Py_buffer *view, int flags, object owner, mt_life *life, unsigned char *host,
                 uint64_t nbytes) except -1
