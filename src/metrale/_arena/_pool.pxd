# The torch pool of an arena (see _pool.pyx): segments handed out of a range
# the arena reserves beside its buffers, for the arena (sleep, release,
# memory_stats) and metrale.torch.
from libc.stdint cimport uint64_t, uintptr_t

from metrale._arena._offload cimport Lane, Offload, Owner
from metrale._backends._backend cimport Backend
from metrale._base._core cimport mt_pool, mt_pool_ops


# An Owner (_offload.pxd): the offload engine moves its chunks.
cdef class Pool(Owner):
    cdef mt_pool *_p              # the C pool (src/pool.c); NULL once closed
    cdef Backend gpu
    cdef mt_pool_ops ops          # the backend's, without the GIL, or this object's methods
    cdef bint direct              # ops are the backend's (no GIL): torch may call the pool
    cdef uintptr_t base           # the reserved range
    cdef readonly uint64_t nbytes
    cdef uint64_t granule
    cdef readonly int slot        # the torch allocator slot bound to it, or -1
    cdef bint retire              # the slot was handed to torch: it stays taken when unbound
    cdef object error             # what a backend method raised inside the last operation
    cdef int busy                 # calls inside the C pool without the GIL now
    cdef bint dead                # closed: the last call out frees the C pool
    cdef Offload host             # host memory of its offloads (made by the first one, reused,
                                  # freed by close) and the engine that moves them
    cdef list moved               # [(offset, bytes)] the offloading sleep now moved, or []
    cdef uintptr_t fill           # commit_need over host memory: new chunks hold the bytes
                                  # at fill + offset (the host backend's operations), or 0
    cdef unsigned long fork_gen   # the process's fork generation when made (_life)
    cdef readonly str wake        # its wake contract (open_pool): "zero", "offload", "undefined"

    cdef int _start(self, str call) except -1
    cdef void _end(self) noexcept
    # Free the C pool once it is closed and no call is inside it.
    cdef void _free_if_idle(self) noexcept
    cdef object _failure(self, int rc, int err, str call, uint64_t n=*)

    # Its part of the arena's sleep (the engine's lane; every chunk goes, the
    # segments stay): with `offload` their bytes move to host memory mapped at
    # their addresses (made here the first time); and of its wake (the
    # segments' pages mapped again, an offload's bytes back).  No segment is
    # taken from then on until `settled` says how the call ended: asleep, or
    # awake (allocations taken again).
    cdef Lane sleep_lane(self, bint offload)
    cdef Lane wake_lane(self)
    cdef void settled(self, Lane lane) noexcept
    cdef void _hold(self, bint on) noexcept
    cdef list _runs(self)
    cdef list _ranges(self, bint segments, str call)
    cdef bint asleep(self)
    # Segments handed out now.
    cdef uint64_t segments_held(self)
    # Unbind the slot, unmap and release everything, free the range; what
    # fails stays for the next call: the first error, or None (`closed` then
    # says it is).  Refused while segments are handed out (torch's memory
    # stays mapped, leaked, rather than unmapped under a graph that may replay).
    cdef object close(self)
    # In a process forked from the pool's: give back this process's copy of
    # the range (host memory; a GPU's is the parent's: nothing), touching
    # neither the C pool nor its lock (a parent thread may have held it).
    cdef void close_inherited(self) noexcept
    cdef bint inherited(self)


# A pool of `nbytes` (rounded up to the granularity) in a range reserved on `gpu`.
cdef Pool pool_new(Backend gpu, uint64_t nbytes)
