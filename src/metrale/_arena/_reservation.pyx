# cython: language_level=3, binding=False
"""The reserved memory of an arena (docs/stable-addresses.md): the physical
chunks mapped in its one virtual reservation, their handles, and the handles
whose release failed.

Physical memory is mapped only for what the current sizes need, one handle
per run of adjacent missing granules (cut in pieces once a sleep kept or
offloaded something); a chunk is unmapped only whole, or replaced by new
handles of just the granules still needed (`refit`, for trim).  What stands for
memory is `Held` (no Python object the collector could clear first), so the
arena's finalizer frees it in any collection order.  The arena and its
reshapes (_reserve: build, resize and trim; _sleep; _peer) work on it; it knows
nothing of them.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport free, malloc

from metrale._arena._offload cimport Owner, cut, overlap
from metrale._backends._backend cimport Backend
from metrale._base._core cimport (MT_MAX_BUFFERS, mt_chunk_needed, mt_commit_gaps, mt_commit_needed,
                                  mt_layout, mt_range)
from metrale._base._held cimport Held
from metrale._backends._mapping cimport free_reservation, release_orphans, unmap_chunks
from metrale._base._common cimport logger

from metrale._base.errors import OutOfMemoryError

cdef object _TOKEN = object()

# A chunk `refit` replaces is a list: the old chunk (offset, bytes, handle);
# the runs it still needs [(offset, bytes, offset in the host copy)]; the
# handles made for them [(offset, bytes, handle, offset in the host copy)];
# those of them mapped now; whether the old chunk still is.
cdef enum:
    OLD, RUNS, MADE, MAPPED, OLD_MAPPED


# no_gc: it holds its backend and integers only, and nothing that refers back
# to it; the arena's finalizer frees what it holds.
@cython.no_gc
@cython.final
cdef class Reservation(Owner):
    """The physical chunks of a reserved arena (made by the arena)."""

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("Reservation is made by a reserved BufferArena")
        self.chunks, self.orphans = Held(3), Held(2)

    cdef int classify(self, const mt_layout *L, list cls, tuple names) except -1:
        cdef uint64_t g = self.granule, lo, hi
        cdef int i, b
        spans = [[] for _ in range(max(cls) + 1 if cls else 0)]
        last = None                     # (hi, class, buffer) of the last room
        for i in range(L.n):
            b = L.order[i]
            if not L.room[b]:
                continue
            lo = L.offset[b] // g * g
            hi = (L.offset[b] + L.room[b] + g - 1) // g * g
            if last is not None and lo < last[0] and last[1] != cls[b]:
                raise ValueError(f"{names[last[2]]} and {names[b]} share a granule of the "
                                 "reservation and are of different classes (tags), which "
                                 "could then sleep apart: give them one tag (the step inputs, "
                                 "and the scratch after them, share granules)")
            k = spans[cls[b]]
            if k and k[-1][1] >= lo:
                k[-1] = (k[-1][0], max(k[-1][1], hi))
            else:
                k.append((lo, hi))
            last = (hi, cls[b], b)
        self.spans = tuple(spans)
        self.bounds = sorted({x for k in spans for run in k for x in run})
        return 0

    cdef Owner part(self, int k):
        cdef Part p = Part.__new__(Part, _TOKEN)
        p.r, p.spans = self, self.spans[k]
        return p

    cdef int commit(self, const mt_layout *L, uintptr_t base) except -1:
        return self.commit_need(base, self.needed(L), 0, 0xFFFFFFFFFFFFFFFF, 0)

    cdef list needed(self, const mt_layout *L):
        cdef mt_range need[MT_MAX_BUFFERS]
        cdef int i, n = mt_commit_needed(L, self.granule, need)
        return [(need[i].offset, need[i].length) for i in range(n)]

    # -- the Owner protocol (_offload.pxd) --------------------------------------------------
    cdef list mapped(self):
        return [(c[0], c[1]) for c in self.chunks]

    cdef object unmap_one(self, uintptr_t base, uint64_t offset):
        for c in self.chunks:
            if c[0] == offset:
                return self.unmap(base, [c])
        return None

    cdef int commit_need(self, uintptr_t base, list need, uint64_t lo, uint64_t hi,
                         uintptr_t fill) except -1:
        # [lo, hi): only what is needed there (a wake maps device memory range
        # by range, as each one's host memory is taken down)
        cdef mt_range *want = NULL
        cdef mt_range *have = NULL
        cdef mt_range *gaps = NULL
        cdef int nneed = len(need), nhave = len(self.chunks), ngaps, i
        cdef uint64_t h = 0
        cdef Backend be = self.gpu
        added = []
        want = <mt_range *>malloc((nneed + 1) * sizeof(mt_range))
        have = <mt_range *>malloc((nhave + 1) * sizeof(mt_range))
        gaps = <mt_range *>malloc((nneed + nhave + 1) * sizeof(mt_range))
        try:
            if want == NULL or have == NULL or gaps == NULL:
                raise OutOfMemoryError("cannot allocate the arena's mapping bookkeeping")
            for i in range(nneed):
                want[i].offset, want[i].length = need[i]
            for i in range(nhave):
                have[i].offset = self.chunks[i][0]
                have[i].length = self.chunks[i][1]
            ngaps = mt_commit_gaps(want, nneed, have, nhave, gaps)
            window = []
            for i in range(ngaps):
                x, y = max(gaps[i].offset, lo), min(gaps[i].offset + gaps[i].length, hi)
                if x < y:
                    window.append((x, y - x))
            pieces = cut(_split(window, self.bounds), self.piece)
            try:
                for at, n in pieces:
                    if self.shareable:
                        be.create_exportable(n, &h)
                    else:
                        be.create(n, &h)
                    try:
                        if fill:        # over the host memory there, holding its bytes
                            be.map_filled(base + at, n, h, fill + at)
                        else:
                            be.map(base + at, n, h)
                    except BaseException:
                        be.release_handle(h, n)
                        raise
                    added.append((at, n, h))
            except BaseException:
                self.chunks.extend(added)
                unmap_chunks(be, base, added, self.chunks, self.orphans)
                raise
            self.chunks.extend(added)
            self.chunks.sort()
            self.peak = max(self.peak, self.committed())
        finally:
            free(want)
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

    cdef int refit(self, const mt_layout *L, uintptr_t base) except -1:
        cdef mt_range need[MT_MAX_BUFFERS]
        cdef int nneed = mt_commit_needed(L, self.granule, need), i
        cdef uint64_t lo, hi, total = 0
        cdef Backend be = self.gpu
        cdef void *tmp = NULL
        swaps, idle = [], []
        for c in self.chunks:
            parts = []
            for i in range(nneed):
                lo = max(need[i].offset, <uint64_t>c[0])
                hi = min(need[i].offset + need[i].length, <uint64_t>c[0] + <uint64_t>c[1])
                if lo < hi:
                    parts.append((lo, hi - lo))
            kept = sum(n for _, n in parts)
            if not parts:
                idle.append(c)
            elif kept < c[1]:
                runs = []
                for lo, n in cut(parts, self.piece):
                    runs.append((lo, n, total))     # (offset, bytes, where in the host copy)
                    total += n
                swaps.append([c, runs, [], [], True])
        if swaps:
            # room for every row the bookkeeping may add, before anything
            # changes: no allocation can fail once memory has moved
            nruns = 0
            for sw in swaps:
                nruns += len(sw[RUNS])
            self.chunks._room(len(self.chunks) + nruns)
            self.orphans._room(len(self.orphans) + len(swaps) + nruns)
            be.host_alloc(total, &tmp)
            try:
                err = None
                try:
                    self._swap(swaps, base, <uintptr_t>tmp)
                finally:
                    err = self._settle(swaps)
                if err is not None:
                    raise err
            finally:
                be.host_free(tmp)
        if idle:
            be.quiesce()
            err = self.unmap(base, idle)
            if err is not None:
                raise err
        return 0

    cdef int _swap(self, list swaps, uintptr_t base, uintptr_t tmp) except -1:
        """Copy out, make the new handles, then replace chunk by chunk; on a
        failure every chunk replaced is put back (its bytes copied in again)
        and the error raised.  _settle does the bookkeeping either way."""
        cdef Backend be = self.gpu
        cdef uint64_t h = 0
        cdef list s
        cdef Py_ssize_t k
        be.quiesce()                    # the device's work on these bytes is done
        for s in swaps:
            for lo, n, at in s[RUNS]:
                be.d2h(<void *>(tmp + <uintptr_t>at), base + <uintptr_t>lo, n, 0)
        for s in swaps:
            for lo, n, at in s[RUNS]:
                if self.shareable:
                    be.create_exportable(n, &h)
                else:
                    be.create(n, &h)
                s[MADE].append((lo, n, h, at))
        for k in range(len(swaps)):
            try:
                self._replace(swaps[k], base, tmp)
            except BaseException:
                for s in reversed(swaps[:k + 1]):
                    self._restore(s, base, tmp)
                raise
        return 0

    cdef int _replace(self, list s, uintptr_t base, uintptr_t tmp) except -1:
        cdef Backend be = self.gpu
        be.unmap(base + <uintptr_t>s[OLD][0], s[OLD][1])
        s[OLD_MAPPED] = False
        for lo, n, h, at in s[MADE]:
            be.map(base + <uintptr_t>lo, n, h)
            s[MAPPED].append((lo, n, h, at))
        self._copy_in(s, base, tmp, True)
        return 0

    cdef int _copy_in(self, list s, uintptr_t base, uintptr_t tmp, bint strict) except -1:
        """The bytes of `s` back from the host copy, into whatever is mapped
        there now (not strict: a failure is logged, the others still go)."""
        cdef Backend be = self.gpu
        for lo, n, h, at in s[MADE]:
            if not s[OLD_MAPPED] and (lo, n, h, at) not in s[MAPPED]:
                continue                # unmapped: nothing may be written there
            try:
                be.h2d(base + <uintptr_t>lo, <void *>(tmp + <uintptr_t>at), n, 0)
            except Exception as e:
                if strict:
                    raise
                logger().error("buffer arena: trim: copying %d bytes back at offset %d failed "
                               "(%s); they are lost", n, lo, e)
        return 0

    cdef void _restore(self, list s, uintptr_t base, uintptr_t tmp) noexcept:
        """Put the old chunk of `s` back, with the bytes (the host backend's
        pages go with a mapping; a CUDA handle still holds them).  Where a
        second failure prevents it, map the new handles instead: either way
        the bytes come back from the host copy and every address is mapped."""
        cdef Backend be = self.gpu
        try:
            if s[OLD_MAPPED]:
                return
            for run in reversed(list(s[MAPPED])):
                try:
                    be.unmap(base + <uintptr_t>run[0], run[1])
                    s[MAPPED].remove(run)
                except Exception as e:
                    logger().error("buffer arena: trim: unmapping a new chunk to undo it failed: %s",
                                   e)
            if not s[MAPPED]:
                try:
                    be.map(base + <uintptr_t>s[OLD][0], s[OLD][1], s[OLD][2])
                    s[OLD_MAPPED] = True
                except Exception as e:
                    logger().error("buffer arena: trim: mapping a chunk again failed: %s", e)
            if not s[OLD_MAPPED]:     # forward instead: the new handles, at their places
                for run in s[MADE]:
                    if run not in s[MAPPED]:
                        try:
                            be.map(base + <uintptr_t>run[0], run[1], run[2])
                            s[MAPPED].append(run)
                        except Exception as e:
                            logger().error("buffer arena: trim: %d bytes at offset %d are left "
                                           "unmapped: %s", run[1], run[0], e)
            self._copy_in(s, base, tmp, False)
        except BaseException as e:      # a MemoryError of the bookkeeping: say it, go on
            logger().error("buffer arena: trim: undoing a chunk failed: %r", e)

    cdef object _settle(self, list swaps):
        """Record what each swap left mapped and release the handles left
        unmapped (kept, to be released again, where that fails): the first
        error or None."""
        cdef Backend be = self.gpu
        cdef list s
        first = None
        for s in swaps:
            if not s[OLD_MAPPED]:
                self.chunks.remove(s[OLD])
                e = _release(be, s[OLD][2], s[OLD][1], self.orphans)
                first = first or e
            for lo, n, h, at in s[MADE]:
                if (lo, n, h, at) in s[MAPPED]:
                    self.chunks.append((lo, n, h))
                else:
                    e = _release(be, h, n, self.orphans)
                    first = first or e
        try:
            self.chunks.sort()
        except MemoryError:
            pass                        # every row is held, unsorted: commit sorts again
        return first

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

    cdef void place(self, uintptr_t alloc, uintptr_t base, uint64_t nbytes) noexcept:
        self.alloc, self.base, self.nbytes = alloc, base, nbytes

    cdef object close(self):
        err, freed = free_reservation(self.gpu, self.base, self.alloc, self.nbytes, self.chunks,
                                      self.orphans)
        if freed:
            self.alloc = self.base = 0
        return err


# no_gc: it holds its Reservation (which holds no Part) and integers.
@cython.no_gc
@cython.final
cdef class Part(Owner):
    """The chunks of one class of a Reservation (made by it)."""
    cdef Reservation r
    cdef list spans                 # [(lo, hi)] sorted: the class's granules

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("Part is made by a Reservation")

    cdef list mapped(self):
        return [(c[0], c[1]) for c in self.r.chunks if _within(self.spans, c[0])]

    cdef object unmap_one(self, uintptr_t base, uint64_t offset):
        return self.r.unmap_one(base, offset)

    cdef int commit_need(self, uintptr_t base, list need, uint64_t lo, uint64_t hi,
                         uintptr_t fill) except -1:
        return self.r.commit_need(base, overlap(need, [(x, y - x) for x, y in self.spans]),
                                  lo, hi, fill)


cdef bint _within(list spans, uint64_t at):
    for x, y in spans:
        if x <= at < y:
            return True
    return False


cdef list _split(list window, list bounds):
    """The (offset, bytes) `window` cut at each of `bounds` inside a run."""
    out = []
    for x, n in window:
        for b in bounds:
            if x < b < x + n:
                out.append((x, b - x))
                n -= b - x
                x = b
        out.append((x, n))
    return out


cdef object _release(Backend be, uint64_t h, size_t n, Held orphans):
    try:
        be.release_handle(h, n)
    except Exception as e:
        orphans.append((h, n))
        logger().warning("releasing a %d-byte physical handle failed (%s); it is kept and "
                         "released again later", n, e)
        return e
    return None


cdef Reservation reservation_new(Backend gpu, bint shareable, object top_sizes,
                                 object top_limits):
    cdef Reservation r = Reservation.__new__(Reservation, _TOKEN)
    r.gpu = gpu
    r.granule = gpu.granularity()
    r.shareable = shareable
    r.top_sizes, r.top_limits = top_sizes, top_limits
    r.spans, r.bounds = (), []
    return r
