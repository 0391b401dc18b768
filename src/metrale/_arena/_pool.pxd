# The torch pool of an arena (see _pool.pyx): segments handed out of a range
# the arena reserves beside its buffers, for the arena (sleep, release,
# memory_stats) and metrale.torch.
from libc.stdint cimport uint64_t, uintptr_t

from metrale._arena._sleep_state cimport SleepState
from metrale._backends._backend cimport Backend
from metrale._base._core cimport mt_pool, mt_pool_ops


cdef class Pool:
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
    cdef SleepState host          # host memory of an offloading sleep (made by the first one,
                                  # reused, freed by close), or None
    cdef list moved               # [(offset, bytes)] the offloading sleep now moved, or []
    cdef bint offloaded           # the sleep now (or the last) offloaded the segments
    cdef unsigned long fork_gen   # the process's fork generation when made (_life)

    cdef int _start(self, str call) except -1
    cdef void _end(self) noexcept
    # Free the C pool once it is closed and no call is inside it.
    cdef void _free_if_idle(self) noexcept
    cdef object _failure(self, int rc, int err, str call, uint64_t n=*)

    # Sleep, in two steps (the device waited for first; all or nothing):
    # unmap everything, keeping the segments; with `offload`, their contents
    # move to host memory mapped at their own addresses.  `stage` copies the
    # segments out for an offload, refusing allocations from then on (the
    # runs copied), `sleep_staged` unmaps and maps the host memory there.
    cdef list stage(self, bint offload)
    # Take allocations again after `stage` when no `sleep_staged` follows.
    cdef void unhold(self) noexcept
    cdef int sleep_staged(self, bint offload, list runs) except -1
    # Map the segments' pages again (an offload's contents copied back);
    # all or nothing.
    cdef int wake(self) except -1
    cdef void _undo_sleep(self) noexcept
    cdef list _runs(self)
    cdef int _copy(self, list runs, bint back) except -1
    cdef bint asleep(self)
    # Segments handed out now.
    cdef uint64_t segments_held(self)
    # Unbind the slot, unmap and release everything, free the range:
    # (first error or None, whether it is closed).  Refused while segments
    # are handed out unless `force`.
    cdef tuple close(self, bint force)
    # In a process forked from the pool's: give back this process's copy of
    # the range (host memory; a GPU's is the parent's: nothing), touching
    # neither the C pool nor its lock (a parent thread may have held it).
    cdef void close_inherited(self) noexcept
    cdef bint inherited(self)


# A pool of `nbytes` (rounded up to the granularity) in a range reserved on `gpu`.
cdef Pool pool_new(Backend gpu, uint64_t nbytes)
