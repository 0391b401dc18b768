# cython: language_level=3, binding=False
"""The reserved memory of an arena (docs/stable-addresses.md): the physical
chunks mapped in its one virtual reservation, their handles, and the handles
whose release failed.

Physical memory is mapped only for what the current sizes need, one handle
per run of adjacent missing granules (cut in pieces once a sleep kept or
offloaded something); a chunk is unmapped only whole.  What stands for
memory is `Held` (no Python object the collector could clear first), so the
arena's finalizer frees it in any collection order.  The arena and its
reshapes (_reserve: build and resize; _sleep; _peer) work on it; it knows
nothing of them.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport free, malloc

from metrale._backends._backend cimport Backend
from metrale._base._core cimport (MT_MAX_BUFFERS, mt_chunk_needed, mt_commit_gaps, mt_commit_needed,
                                  mt_layout, mt_range)
from metrale._base._held cimport Held
from metrale._backends._mapping cimport free_reservation, release_orphans, unmap_chunks

from metrale._base.errors import OutOfMemoryError

cdef object _TOKEN = object()


# no_gc: it holds its backend and integers only, and nothing that refers back
# to it; the arena's finalizer frees what it holds.
@cython.no_gc
@cython.final
cdef class Reservation:
    """The physical chunks of a reserved arena (made by the arena)."""

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("Reservation is made by a reserved BufferArena")
        self.chunks, self.orphans = Held(3), Held(2)

    cdef int commit(self, const mt_layout *L, uintptr_t base) except -1:
        cdef mt_range need[MT_MAX_BUFFERS]
        cdef mt_range *have = NULL
        cdef mt_range *gaps = NULL
        cdef int nneed, nhave = len(self.chunks), ngaps, i
        cdef uint64_t h = 0
        cdef Backend be = self.gpu
        added = []
        nneed = mt_commit_needed(L, self.granule, need)
        have = <mt_range *>malloc((nhave + 1) * sizeof(mt_range))
        gaps = <mt_range *>malloc((nneed + nhave + 1) * sizeof(mt_range))
        try:
            if have == NULL or gaps == NULL:
                raise OutOfMemoryError("cannot allocate the arena's mapping bookkeeping")
            for i in range(nhave):
                have[i].offset = self.chunks[i][0]
                have[i].length = self.chunks[i][1]
            ngaps = mt_commit_gaps(need, nneed, have, nhave, gaps)
            pieces = cut([(gaps[i].offset, gaps[i].length) for i in range(ngaps)], self.piece)
            try:
                for lo, n in pieces:
                    if self.shareable:
                        be.create_exportable(n, &h)
                    else:
                        be.create(n, &h)
                    try:
                        be.map(base + lo, n, h)
                    except BaseException:
                        be.release_handle(h, n)
                        raise
                    added.append((lo, n, h))
            except BaseException:
                self.chunks.extend(added)
                unmap_chunks(be, base, added, self.chunks, self.orphans)
                raise
            self.chunks.extend(added)
            self.chunks.sort()
            self.peak = max(self.peak, self.committed())
        finally:
            free(have)
            free(gaps)
        return 0

    cdef int trim(self, const mt_layout *L, uintptr_t base) except -1:
        cdef mt_range need[MT_MAX_BUFFERS]
        cdef int nneed = mt_commit_needed(L, self.granule, need)
        idle = [c for c in self.chunks if not mt_chunk_needed(need, nneed, c[0], c[1])]
        if idle:
            self.gpu.quiesce()
            err = self.unmap(base, idle)
            if err is not None:
                raise err
        return 0

    cdef object unmap(self, uintptr_t base, object chunks):
        return unmap_chunks(self.gpu, base, chunks, self.chunks, self.orphans)

    cdef object retry(self):
        return release_orphans(self.gpu, self.orphans)

    cdef uint64_t committed(self):
        cdef uint64_t n = 0
        for c in self.chunks:
            n += <uint64_t>c[1]
        return n

    cdef void forget(self) noexcept:
        self.chunks.clear()
        self.orphans.clear()

    cdef bint holds(self):
        return bool(self.chunks or self.orphans)

    cdef tuple close(self, uintptr_t base, uintptr_t alloc, size_t nbytes, bint others=False):
        return free_reservation(self.gpu, base, alloc, nbytes, self.chunks, self.orphans, False,
                                others)


cdef Reservation reservation_new(Backend gpu, bint shareable, object top_sizes,
                                 object top_limits):
    cdef Reservation r = Reservation.__new__(Reservation, _TOKEN)
    r.gpu = gpu
    r.granule = gpu.granularity()
    r.shareable = shareable
    r.top_sizes, r.top_limits = top_sizes, top_limits
    return r


cdef list cut(list runs, uint64_t piece):
    out = []
    for lo, n in runs:
        while piece and n > piece:
            out.append((lo, piece))
            lo, n = lo + piece, n - piece
        out.append((lo, n))
    return out
