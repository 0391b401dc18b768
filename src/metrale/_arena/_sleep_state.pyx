# cython: language_level=3, binding=False
"""What a reserved arena's sleep holds (docs/stable-addresses.md): one record
per buffer (its class; discarded, kept with its pinned host copy, or
offloaded, and the bytes moved), the pinned copies, the classes asleep and
each one's wakes, and per class an `Offload` (_offload.pyx): the host memory
its buffers' offloads move to and the engine that moves them (a class sleeps
and wakes apart: its host memory is its own).

The host memory and the copies are made by the first sleep that needs them
and reused by the next ones; `close` (the arena's release) frees them.  The
records are C storage and the memory is `Held`: nothing here is a Python
object the cyclic collector could clear before the arena's finalizer frees
it.  The sleep and the wake themselves are _sleep.pyx's, run by the engine.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport calloc, free

from metrale._arena._offload cimport Offload, offload_new
from metrale._backends._backend cimport Backend
from metrale._base._core cimport mt_layout

from metrale._base.errors import OutOfMemoryError

cdef object _TOKEN = object()


# no_gc: it holds its backend, its Offload (no_gc too) and integers only; the
# arena's finalizer frees what it holds.
@cython.no_gc
@cython.final
cdef class SleepState:
    """The sleep of a reserved arena (made by the arena)."""

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("SleepState is made by a reserved BufferArena")

    def __dealloc__(self):
        free(self.rec)              # the copies are the arena's to free (close)
        self.rec = NULL

    cdef bint any_asleep(self) noexcept:
        return (self.asleep & self.classes) != 0

    cdef bint all_asleep(self) noexcept:
        return self.classes != 0 and (self.asleep & self.classes) == self.classes

    cdef uint64_t mask_of(self, object ids):
        cdef uint64_t m = 0
        for i in ids:
            m |= <uint64_t>1 << self.rec[<int>i].cls
        return m

    cdef list ids_of(self, uint64_t mask):
        return [i for i in range(self.n) if mask >> self.rec[i].cls & 1]

    cdef list with_fate(self, unsigned char fate):
        return [i for i in range(self.n) if self.rec[i].fate == fate]

    cdef int set_fates(self, list ids, dict offloaded, dict kept) except -1:
        for i in ids:
            self.rec[<int>i].fate = FATE_DISCARDED
            self.rec[<int>i].moved = 0
        for i, b in offloaded.items():
            self.rec[i].fate = FATE_OFFLOADED
            self.rec[i].moved = b
        for i, b in kept.items():
            self.rec[i].fate = FATE_KEPT
            self.rec[i].moved = b
        return 0

    cdef int keep_copies(self, const mt_layout *L, list ids) except -1:
        cdef Backend be = self.gpu
        cdef void *host = NULL
        cdef uint64_t n
        made = []
        try:
            for i in ids:
                n = L.size[<int>i]
                if n and (not self.rec[<int>i].host or self.rec[<int>i].capacity < n):
                    be.host_alloc(n, &host)
                    made.append((i, <uintptr_t>host, n))
        except BaseException:
            for _, p, _n in made:
                be.host_free(<void *><uintptr_t>p)
            raise
        for i, p, n in made:
            if self.rec[<int>i].host:
                be.host_free(<void *>self.rec[<int>i].host)
            self.rec[<int>i].host = p
            self.rec[<int>i].capacity = n
        return 0

    cdef tuple to_move(self, const mt_layout *L, list ids):
        cdef int i
        cdef uint64_t n
        moves, keeps = [], []
        for i in ids:
            n = min(self.rec[i].moved, L.size[i])
            if not n:
                continue
            if self.rec[i].fate == FATE_OFFLOADED:
                moves.append((L.offset[i], n))
            elif self.rec[i].fate == FATE_KEPT:
                keeps.append((L.offset[i], n, self.rec[i].host))
        return moves, keeps

    cdef uint64_t kept_bytes(self):
        return self._moved(FATE_KEPT)

    cdef uint64_t offloaded_bytes(self):
        return self._moved(FATE_OFFLOADED)

    cdef uint64_t _moved(self, unsigned char fate):
        cdef uint64_t t = 0
        cdef int i
        for i in range(self.n):
            if self.rec[i].fate == fate:
                t += self.rec[i].moved
        return t

    cdef uint64_t host_keep_bytes(self):
        cdef uint64_t t = 0
        cdef int i
        for i in range(self.n):
            if self.rec[i].host:
                t += self.rec[i].capacity
        return t

    cdef uint64_t host_offload_bytes(self):
        cdef uint64_t t = 0
        cdef Offload o
        for o in self.offloads:
            t += o.host_bytes()
        return t

    cdef Py_ssize_t host_handles(self):
        cdef Py_ssize_t t = 0
        cdef Offload o
        for o in self.offloads:
            t += len(o.hosted)
        return t

    cdef bint hosting(self):
        cdef Offload o
        for o in self.offloads:
            if o.at_base:
                return True
        return False

    cdef void forget(self) noexcept:
        cdef int i
        cdef Offload o
        for o in self.offloads:
            o.forget()
        for i in range(self.n):
            self.rec[i].host = 0
            self.rec[i].capacity = 0

    cdef void settle_classes(self, uint64_t now) noexcept:
        cdef uint64_t woke = self.asleep & ~now
        cdef int k
        for k in range(64):
            if woke >> k & 1:
                self.epoch[k] += 1
        self.asleep = now

    cdef void forget_class(self, int cls) noexcept:
        self.asleep &= ~(<uint64_t>1 << cls)

    cdef bint holds(self):
        cdef Offload o
        for o in self.offloads:
            if o.holds():
                return True
        return bool(self.host_keep_bytes())

    cdef object close(self):
        cdef Backend be = self.gpu
        cdef Offload o
        cdef int i
        first = None
        for o in self.offloads:         # every one is tried
            err = o.close()
            first = first or err
        for i in range(self.n):         # the copies of keep (nothing on the device uses them)
            if self.rec[i].host:
                be.host_free(<void *>self.rec[i].host)
                self.rec[i].host = 0
                self.rec[i].capacity = 0
        return first


cdef SleepState sleep_state_new(Backend gpu, int n, uint64_t stage_bytes, list classes):
    cdef SleepState s = SleepState.__new__(SleepState, _TOKEN)
    cdef int i, k = max(classes) + 1 if classes else 0
    s.gpu = gpu
    s.n = n
    s.classes = (<uint64_t>1 << k) - 1      # k <= 63 (BufferSet)
    # one engine per class: none reserves or allocates anything before its
    # class offloads
    s.offloads = tuple(offload_new(gpu, stage_bytes) for _ in range(k))
    s.rec = <SleepRecord *>calloc(n if n > 0 else 1, sizeof(SleepRecord))
    if s.rec == NULL:
        raise OutOfMemoryError("cannot allocate the arena's sleep records")
    for i in range(n):
        s.rec[i].cls = classes[i]
    return s
