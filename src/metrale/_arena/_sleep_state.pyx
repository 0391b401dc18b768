# cython: language_level=3, binding=False
"""What a reserved arena's sleep holds (docs/stable-addresses.md): one record
per buffer (discarded, kept with its pinned host copy, or offloaded, and the
bytes moved), and the host memory of its offloads, mapped at a staging range
and, while asleep, at the buffers' own addresses too.

The host memory and the copies are made by the first sleep that needs them
and reused by the next ones; `close` (the arena's release) frees them.  The
records are C storage and the memory is `Held`: nothing here is a Python
object the cyclic collector could clear before the arena's finalizer frees
it.  The sleep and the wake themselves (the copies, the remap) are _sleep.pyx's.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport calloc, free

from metrale._backends._backend cimport Backend
from metrale._base._common cimport logger
from metrale._base._core cimport mt_layout
from metrale._base._held cimport Held
from metrale._arena._reservation cimport cut, tapered

from metrale._base.errors import MetraleError, OutOfMemoryError

cdef enum:
    # The most bytes of an offload's last host piece (whole granules, at least
    # one): on the H200, mapping 8 MiB of host memory at the buffers' addresses,
    # which follows the last copy, takes about 0.1 ms (bench/RESULTS.md).
    TAPER_BYTES = 8 << 20

cdef object _TOKEN = object()


# no_gc: it holds its backend and integers only; the arena's finalizer frees
# what it holds.
@cython.no_gc
@cython.final
cdef class SleepState:
    """The sleep of a reserved arena (made by the arena)."""

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("SleepState is made by a reserved BufferArena")
        self.hosted, self.at_base, self.host_orphans = Held(3), Held(3), Held(2)

    def __dealloc__(self):
        free(self.rec)              # the copies are the arena's to free (close)
        self.rec = NULL

    cdef list with_fate(self, unsigned char fate):
        return [i for i in range(self.n) if self.rec[i].fate == fate]

    cdef int set_fates(self, dict offloaded, dict kept) except -1:
        cdef int i
        for i in range(self.n):
            self.rec[i].fate = FATE_DISCARDED
            self.rec[i].moved = 0
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

    cdef int host_memory(self, list runs, uint64_t piece, uint64_t granule) except -1:
        cdef Backend be = self.gpu
        cdef uintptr_t stage
        cdef uint64_t h = 0
        if all(_covered(self.hosted, lo, lo + n) for lo, n in runs):
            return 0
        old = list(self.hosted)
        self.hosted.clear()
        self._drop(old)
        if self.hosted:
            raise MetraleError("sleep: unmapping the host memory of an earlier offload failed")
        stage = self.stage
        made = []
        try:
            if not stage:
                be.reserve(self.stage_bytes, &stage)
            # no handle longer than the arena's pieces, the last ones halving down
            # to TAPER_BYTES: a sleep maps each at its buffers' addresses once its
            # copy is done, and the last one's mapping (about 9 ms a GB for host
            # memory on the H200) is what no copy overlaps
            pieces = cut(runs, piece)
            if granule:
                pieces = tapered(pieces, granule,
                                 max(granule, (TAPER_BYTES + granule - 1) // granule * granule))
            for lo, n in pieces:
                be.create_host(n, &h)
                try:
                    be.map_host(stage + lo, n, h)
                except BaseException:
                    be.release_host(h, n)
                    raise
                made.append((lo, n, h))
        except BaseException:
            try:
                for lo, n, h in made:
                    be.unmap_host(stage + lo, n)
                    be.release_host(h, n)
                if stage and not self.stage:
                    be.unreserve(stage, self.stage_bytes)
            except Exception as e:
                logger().warning("buffer arena: undoing host memory for offloaded buffers "
                                 "failed: %s", e)
            raise
        self.hosted.replace(made)
        self.stage = stage
        return 0

    cdef int _drop(self, list hosted) except -1:
        """Unmap from the staging range and release `hosted`; what fails
        stays in `hosted` (or, a release, in `host_orphans`), freed by close."""
        cdef Backend be = self.gpu
        first = None
        for lo, n, h in hosted:
            try:
                be.unmap_host(self.stage + lo, n)
            except Exception as e:
                first = first or e
                self.hosted.append((lo, n, h))
                continue
            try:
                be.release_host(h, n)
            except Exception as e:
                first = first or e
                self.host_orphans.append((h, n))
        if first is not None:
            logger().warning("buffer arena: giving back host memory of offloaded buffers "
                             "failed: %s", first)
        return 0

    cdef list overlapping(self, list runs):
        return [e for e in self.hosted if any(e[0] < r + k and r < e[0] + e[1] for r, k in runs)]

    cdef int map_at(self, uintptr_t base, list entries) except -1:
        cdef Backend be = self.gpu
        done = []
        try:
            for lo, n, h in entries:
                be.map_host(base + lo, n, h)
                done.append((lo, n, h))
        except BaseException:
            for lo, n, h in done:
                be.unmap_host(base + lo, n)
            raise
        self.at_base.extend(done)
        return 0

    cdef int unmap_at(self, uintptr_t base) except -1:
        cdef Backend be = self.gpu
        if not self.at_base:
            return 0
        be.quiesce()
        done = []
        try:
            for lo, n, h in self.at_base:
                be.unmap_host(base + lo, n)
                done.append((lo, n, h))
        except BaseException:
            for lo, n, h in done:
                be.map_host(base + lo, n, h)
            raise
        self.at_base.clear()
        return 0

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
        for h in self.hosted:
            t += <uint64_t>h[1]
        return t

    cdef void forget(self) noexcept:
        cdef int i
        self.stage = 0
        self.hosted.clear()
        self.at_base.clear()
        self.host_orphans.clear()
        for i in range(self.n):
            self.rec[i].host = 0
            self.rec[i].capacity = 0

    cdef bint holds(self):
        return bool(self.hosted or self.stage or self.at_base or self.host_orphans
                    or self.host_keep_bytes())

    cdef object close(self, uintptr_t base):
        cdef Backend be = self.gpu
        cdef int i
        first = None
        try:
            self.unmap_at(base)
            hosted = list(self.hosted)
            self.hosted.clear()
            self._drop(hosted)
            for h, n in list(self.host_orphans):
                be.release_host(h, n)
                self.host_orphans.remove((h, n))
            if self.hosted:
                raise MetraleError("release: unmapping host memory of offloaded buffers failed")
            if self.stage:
                be.unreserve(self.stage, self.stage_bytes)
                self.stage = 0
        except Exception as e:
            first = e
        for i in range(self.n):         # the copies of keep (nothing on the device uses them)
            if self.rec[i].host:
                be.host_free(<void *>self.rec[i].host)
                self.rec[i].host = 0
                self.rec[i].capacity = 0
        return first


cdef bint _covered(object hosted, uint64_t lo, uint64_t hi):
    """Whether the (sorted, disjoint) host handles cover [lo, hi) together."""
    for o, k, _h in hosted:
        if o <= lo < o + k:
            lo = o + k
    return lo >= hi


cdef SleepState sleep_state_new(Backend gpu, int n, uint64_t stage_bytes):
    cdef SleepState s = SleepState.__new__(SleepState, _TOKEN)
    s.gpu = gpu
    s.n = n
    s.stage_bytes = stage_bytes
    s.rec = <SleepRecord *>calloc(n if n > 0 else 1, sizeof(SleepRecord))
    if s.rec == NULL:
        raise OutOfMemoryError("cannot allocate the arena's sleep records")
    return s
