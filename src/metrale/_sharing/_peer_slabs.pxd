# The peers' slabs mapped into this process (see _peer_slabs.pyx): its fields,
# for the arena's Peers (_arena/_peers.pxd), which holds one.
from libc.stdint cimport uintptr_t

from metrale._backends._backend cimport Backend
from metrale._base._core cimport mt_copy_run


cdef class PeerSlabs:
    cdef Backend _gpu
    # rank -> [base, reserved bytes, [(offset, length, handle), ...] mapped]:
    # an entry leaves the dict once its chunks are unmapped and its
    # reservation freed, so a failed close can be retried.
    cdef dict _slabs
    cdef list _orphans            # [(handle, bytes)] unmapped, whose release failed: retried
    cdef readonly Py_ssize_t copies_begun     # copy calls made (counted before each)

    cdef list _check_chunks(self, str what, list entry, list chunks)
    cdef int _import(self, list entry, list chunks, list fds, list order) except -1
    cdef int _unmap_rank(self, rank) except -1
    cdef int _check_runs(self, key, uintptr_t base, list chunks, list runs, mt_copy_run *checked,
                         Py_ssize_t *k) except -1
