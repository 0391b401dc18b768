# The reserved memory of an arena (see _reservation.pyx): the physical chunks
# mapped in its reservation and what they are cut by, for the arena and the
# modules that reshape it (_reserve, _sleep, _peer).
from libc.stdint cimport uint64_t, uintptr_t

from metrale._arena._offload cimport Owner
from metrale._backends._backend cimport Backend
from metrale._base._core cimport mt_layout
from metrale._base._held cimport Held


# An Owner (_offload.pxd): the offload engine moves its chunks.
cdef class Reservation(Owner):
    cdef Backend gpu
    cdef uint64_t granule         # the backend's allocation granularity
    cdef bint shareable           # chunks created exportable (a shared arena's)
    cdef Held chunks              # [(offset, bytes, handle)] mapped now, sorted
    cdef Held orphans             # [(handle, bytes)] unmapped, whose release failed: retried
    cdef uint64_t piece           # chunks no longer than this (0: any), set by the first
                                  # sleep that keeps or offloads, so that later ones pipeline
    cdef uint64_t peak            # the most bytes ever committed (memory_stats)
    cdef uint64_t reshapes        # resizes so far (StepInputs made before one refuse)
    cdef object top_sizes         # BufferSizes of the reserved limits (each buffer's room)
    cdef object top_limits        # the reserved limits (max_batch_tokens, max_seq_len,
                                  # kv_block_size, max_batch_size), None when unrecorded
    cdef uintptr_t alloc          # the virtual reservation (0: none, or freed) ...
    cdef uintptr_t base           # ... the slab's base in it (chunk offsets are from here)
    cdef uint64_t nbytes          # ... and its bytes
    cdef tuple spans              # per class, [(lo, hi)] the granules of its buffers' rooms
    cdef list bounds              # where chunks are cut: every class's spans' ends (a chunk
                                  # holds one class: a class sleeps apart)

    # Each buffer's class (`cls`, indices; `names` for messages): the spans of
    # the rooms of each, whole granules; a granule that two classes' buffers
    # share is refused (ValueError), as it could sleep with neither alone.
    cdef int classify(self, const mt_layout *L, list cls, tuple names) except -1
    # The chunks of class `k` (its spans): an Owner the offload engine moves.
    cdef Owner part(self, int k)
    # Map what the layout `L` needs and is not mapped (no chunk longer than
    # `piece`); on failure what this call mapped is unmapped again.
    cdef int commit(self, const mt_layout *L, uintptr_t base) except -1
    # What `L` needs mapped: [(offset, bytes)] whole granules, sorted.
    cdef list needed(self, const mt_layout *L)
    # Unmap the chunks `L` no longer touches (the device waited for first).
    cdef int trim(self, const mt_layout *L, uintptr_t base) except -1
    # Give back all that `L` does not need (trim): each chunk it needs only
    # part of is replaced by new handles of just the needed granules (the
    # bytes copied out to host memory first and back in after), all or none:
    # on a failure every chunk is as before, bytes included; then the chunks
    # it does not need at all are unmapped.  The device is waited for first.
    cdef int refit(self, const mt_layout *L, uintptr_t base) except -1
    # refit's steps, each chunk replaced a list (see _reservation.pyx)
    cdef int _swap(self, list swaps, uintptr_t base, uintptr_t tmp) except -1
    cdef int _replace(self, list s, uintptr_t base, uintptr_t tmp) except -1
    cdef int _copy_in(self, list s, uintptr_t base, uintptr_t tmp, bint strict) except -1
    cdef void _restore(self, list s, uintptr_t base, uintptr_t tmp) noexcept
    cdef object _settle(self, list swaps)
    # Unmap `chunks` (some of ours) and release their handles; every one is
    # tried; returns the first error or None.
    cdef object unmap(self, uintptr_t base, object chunks)
    # Release again the handles whose release failed; those that fail stay.
    cdef object retry(self)
    # Bytes mapped now.
    cdef uint64_t committed(self)
    # Whether it holds a chunk or a handle.
    cdef bint holds(self)
    # The reservation made for it: `nbytes` at `alloc`, the chunks' offsets
    # counted from `base`.
    cdef void place(self, uintptr_t alloc, uintptr_t base, uint64_t nbytes) noexcept
    # Give back everything (the device waited for): every chunk unmapped and
    # released, the handles whose release failed released again, the
    # reservation freed; what fails stays for the next call: the first error,
    # or None.  `alloc` is 0 once the reservation is freed.
    cdef object close(self)
    # In a forked child: the device memory is the parent's; forget it all.
    cdef void forget(self) noexcept


cdef Reservation reservation_new(Backend gpu, bint shareable, object top_sizes,
                                 object top_limits)
