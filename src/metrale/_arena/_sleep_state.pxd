# What a reserved arena's sleep holds (see _sleep_state.pyx): one record per
# buffer, the classes asleep, and the host memory of each class's offloads; for
# the arena and for the modules that put it to sleep and wake it (_sleep) or
# report it (_summary, _guard).
from libc.stdint cimport uint64_t, uintptr_t

from metrale._arena._offload cimport Offload
from metrale._backends._backend cimport Backend
from metrale._base._core cimport mt_layout

# A buffer's fate in the sleep now (the last one, once awake: wake forgets it).
cdef enum:
    FATE_DISCARDED = 0            # its addresses unmapped: contents undefined on wake
    FATE_KEPT = 1                 # copied to its pinned host copy, copied back by wake
    FATE_OFFLOADED = 2            # moved to host memory mapped at its own addresses

# One buffer's record, as vLLM's AllocationData is one allocation's.
cdef struct SleepRecord:
    unsigned char fate
    unsigned char cls             # its class (BufferSet.classes order)
    uintptr_t host                # its pinned copy for keep (made once, reused; 0: none)
    uint64_t capacity             # the copy's bytes
    uint64_t moved                # bytes this sleep copied out (kept) or moved (offloaded)


# The pool's class in the masks below (the buffers' classes are bits 0 .. 62,
# in the order of BufferSet.classes).
cdef enum:
    TORCH_CLASS = 63


cdef class SleepState:
    cdef Backend gpu
    cdef uint64_t asleep          # the classes asleep now, a bit each (a guard tests it)
    cdef uint64_t classes         # the set's classes (bits 0 .. n - 1)
    cdef uint64_t epoch[64]       # each class's wakes so far
    cdef int n                    # buffers (records)
    cdef SleepRecord *rec
    cdef tuple offloads           # per class, the host memory of its buffers' offloads
                                  # (made once, reused, freed by close) and the engine
                                  # that moves them: Offload (a tuple: nothing to clear)

    # Whether a class of buffers sleeps (the arena's operations are refused);
    # whether every one does (the arena sleeps whole: resize sets the limits).
    cdef bint any_asleep(self) noexcept
    cdef bint all_asleep(self) noexcept
    # The classes' bits of buffer `ids`.
    cdef uint64_t mask_of(self, object ids)
    # The buffer ids of the classes in `mask`, in order.
    cdef list ids_of(self, uint64_t mask)
    # The buffer ids with this fate, in order.
    cdef list with_fate(self, unsigned char fate)
    # A sleep's fates for buffers `ids`: `offloaded` and `kept` map buffer ids
    # to the bytes moved, the other ones of `ids` are discarded.
    cdef int set_fates(self, list ids, dict offloaded, dict kept) except -1
    # A pinned host copy for each of `ids` at its size in `L`: the one it has
    # when large enough, else a new one (the old freed once the new is made).
    cdef int keep_copies(self, const mt_layout *L, list ids) except -1
    # Each kept or offloaded buffer of `ids`'s bytes to move at the current
    # sizes (up to what the sleep moved): (moves [(offset, bytes)], keeps
    # [(offset, bytes, host copy)]) for the engine's lane.
    cdef tuple to_move(self, const mt_layout *L, list ids)
    cdef uint64_t _moved(self, unsigned char fate)
    cdef uint64_t kept_bytes(self)
    cdef uint64_t host_keep_bytes(self)
    cdef uint64_t offloaded_bytes(self)
    cdef uint64_t host_offload_bytes(self)
    cdef Py_ssize_t host_handles(self)
    # Whether host memory of an offload is mapped at the arena's addresses.
    cdef bint hosting(self)
    # Whether it holds host memory, a host handle or a copy.
    cdef bint holds(self)
    # Free all of it (the offload's host memory unmapped and released, the
    # copies freed); what fails stays for the next call: the first error, or
    # None.
    cdef object close(self)
    # In a forked child: the memory is the parent's; forget it all.
    cdef void forget(self) noexcept
    # The classes asleep now that a sleep or a wake ended; each one that
    # woke counted in its epoch.
    cdef void settle_classes(self, uint64_t now) noexcept
    # A class that is gone (a closed pool) no longer sleeps; it did not wake,
    # so its epoch stays.
    cdef void forget_class(self, int cls) noexcept


# `classes`: each buffer's class (an index into BufferSet.classes, < 63).
cdef SleepState sleep_state_new(Backend gpu, int n, uint64_t stage_bytes, list classes)
