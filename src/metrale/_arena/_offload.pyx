# cython: language_level=3, binding=False
"""The offload engine (docs/stable-addresses.md): device memory moved to host
memory mapped at its own addresses for a sleep, and back for the wake.

Two owners hold device memory that sleeps: a Reservation (the buffers'
chunks) and a Pool (its segments').  Each implements `Owner`, the protocol
the engine drives: the chunks mapped now, one chunk's unmap, memory for what
is needed.  Each has one `Offload`: the host memory its offloads move to,
made by the first one and reused, in pieces mapped at a staging range of
its own and, while asleep, at the owner's addresses too.  A sleep or a wake
hands the engine one `Lane` an owner (what it moves, what it copies to its
pinned copies, what it needs mapped) and the engine runs them in one
pipeline with one fault path.

Where the backend maps memory over memory of the other kind in one step
(the host backend), an offloaded address is never without memory: host
memory goes over the device memory once its bytes are copied, and device
memory already holding the bytes goes over the host memory on wake.  Where
it cannot (CUDA maps only where nothing is), each chunk is unmapped once
its copies are done and the host memory mapped where no chunk is left,
while the next chunks' copies run; work touching an offloaded buffer must
not run during the sleep or the wake (the device's work queued before them
is waited for: the documented rule).
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t

from metrale._backends._backend cimport Backend
from metrale._base._common cimport logger
from metrale._base._held cimport Held

from metrale._base.errors import MetraleError

cdef enum:
    # The most bytes of an offload's last host piece (whole granules, at least
    # one): on the H200, mapping 8 MiB of host memory at the buffers' addresses,
    # which follows the last copy, takes about 0.1 ms (bench/RESULTS.md).
    TAPER_BYTES = 8 << 20

cdef object _TOKEN = object()
cdef uint64_t _END = 0xFFFFFFFFFFFFFFFF


cdef class Owner:
    """The device memory an offload moves: a Reservation's or a Pool's."""

    cdef list mapped(self):
        raise NotImplementedError

    cdef object unmap_one(self, uintptr_t base, uint64_t offset):
        raise NotImplementedError

    cdef int commit_need(self, uintptr_t base, list need, uint64_t lo, uint64_t hi,
                         uintptr_t fill) except -1:
        raise NotImplementedError


# no_gc: it holds its backend and integers only; its owner closes it.
@cython.no_gc
@cython.final
cdef class Offload:
    """The host memory of one owner's offloads (made by a reserved arena)."""

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("Offload is made by a reserved BufferArena")
        self.hosted, self.at_base, self.orphans = Held(3), Held(3), Held(2)

    cdef int host_memory(self, list runs) except -1:
        cdef Backend be = self.gpu
        cdef uintptr_t stage
        cdef uint64_t h = 0, g = self.granule
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
                be.reserve(self.span, &stage)
            # no piece longer than `piece`, the last ones halving down to
            # TAPER_BYTES: a sleep maps each at the owner's addresses once its
            # copy is done, and the last one's mapping (about 9 ms a GB for host
            # memory on the H200) is what no copy overlaps
            for lo, n in tapered(cut(runs, self.piece), g, max(g, (TAPER_BYTES + g - 1) // g * g)):
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
                    be.unreserve(stage, self.span)
            except Exception as e:
                logger().warning("buffer arena: undoing host memory for an offload failed: %s", e)
            raise
        self.hosted.replace(made)
        self.stage = stage
        return 0

    cdef int _drop(self, list hosted) except -1:
        """Unmap from the staging range and release `hosted`; what fails
        stays in `hosted` (or, a release, in `orphans`), freed by close."""
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
                self.orphans.append((h, n))
        if first is not None:
            logger().warning("buffer arena: giving back host memory of an offload failed: %s",
                             first)
        return 0

    cdef list overlapping(self, list runs):
        return [e for e in self.hosted if any(e[0] < r + k and r < e[0] + e[1] for r, k in runs)]

    cdef int show(self, uintptr_t base, list entries) except -1:
        cdef Backend be = self.gpu
        self.base = base
        done = []
        try:
            for lo, n, h in entries:
                be.map_host(base + lo, n, h)
                done.append((lo, n, h))
        except BaseException:
            if be.maps_over():      # over device memory: a wake takes them down again
                self.at_base.extend(done)
            else:
                for lo, n, h in done:
                    be.unmap_host(base + lo, n)
            raise
        self.at_base.extend(done)
        return 0

    cdef uint64_t host_bytes(self):
        cdef uint64_t t = 0
        for h in self.hosted:
            t += <uint64_t>h[1]
        return t

    cdef bint holds(self):
        return bool(self.hosted or self.stage or self.at_base or self.orphans)

    cdef object close(self):
        cdef Backend be = self.gpu
        first = None
        try:
            if self.at_base:
                be.quiesce()
                for e in list(self.at_base):
                    be.unmap_host(self.base + <uintptr_t>e[0], e[1])
                    self.at_base.remove(e)
            hosted = list(self.hosted)
            self.hosted.clear()
            self._drop(hosted)
            for h, n in list(self.orphans):
                be.release_host(h, n)
                self.orphans.remove((h, n))
            if self.hosted:
                raise MetraleError("release: unmapping the host memory of an offload failed")
            if self.stage:
                be.unreserve(self.stage, self.span)
                self.stage = 0
        except Exception as e:
            first = e
        return first

    cdef void forget(self) noexcept:
        self.stage = 0
        self.hosted.clear()
        self.at_base.clear()
        self.orphans.clear()


cdef bint _covered(object hosted, uint64_t lo, uint64_t hi):
    """Whether the (sorted, disjoint) host pieces cover [lo, hi) together."""
    for o, k, _h in hosted:
        if o <= lo < o + k:
            lo = o + k
    return lo >= hi


@cython.final
cdef class Lane:
    """One owner's part of a sleep or a wake (made by the arena)."""

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("Lane is made by a reserved BufferArena")


cdef Offload offload_new(Backend gpu, uint64_t span):
    cdef Offload o = Offload.__new__(Offload, _TOKEN)
    cdef uint64_t g = gpu.granularity()
    o.gpu, o.span, o.granule = gpu, span, g
    # pieces of an eighth of the range: each one's mapping at the owner's
    # addresses overlaps the next ones' copies
    o.piece = max(g, (span // 8 + g - 1) // g * g)
    return o


cdef Lane lane_new(Offload engine, Owner owner, uintptr_t base, list moves, list keeps,
                   list need):
    cdef Lane L = Lane.__new__(Lane, _TOKEN)
    L.engine, L.owner, L.base = engine, owner, base
    L.moves, L.keeps, L.need = moves, keeps, need
    L.runs = granule_runs(moves, engine.granule)
    L._pending = []
    return L


# -- sleep ----------------------------------------------------------------------------------

cdef int sleep_lanes(Backend be, list lanes, object after) except -1:
    cdef Lane L
    steps = []                  # [lane, chunk (offset, bytes), event or 0]
    try:
        _copy_out(be, lanes, steps)
        for L in lanes:
            L._pending = L.engine.overlapping(L.runs)
        _swap_out(be, lanes, steps, after)
    finally:
        for s in steps:
            if s[2]:
                be.event_destroy(s[2])
    return 0


cdef int _copy_out(Backend be, list lanes, list steps) except -1:
    """Queue the copies out, chunk by chunk in address order: moved bytes to
    the staging range, kept ones to their copies (one address space with the
    device's), an event after each chunk's.  On failure the copies queued
    are waited for and nothing else changes."""
    cdef Lane L
    cdef uintptr_t ev = 0
    cdef uint64_t lo, hi, x, y
    cdef bint any_
    try:
        for L in lanes:
            for c in L.owner.mapped():
                lo, hi = c[0], c[0] + c[1]
                any_ = False
                for o, n in L.moves:
                    x, y = max(<uint64_t>o, lo), min(<uint64_t>(o + n), hi)
                    if x < y:
                        be.copy(L.engine.stage + x, L.base + x, y - x, 0)
                        any_ = True
                for o, n, host in L.keeps:
                    x, y = max(<uint64_t>o, lo), min(<uint64_t>(o + n), hi)
                    if x < y:
                        be.copy(<uintptr_t>host + (x - <uint64_t>o), L.base + x, y - x, 0)
                        any_ = True
                ev = 0
                if any_:
                    be.event_create(&ev)
                    steps.append([L, c, ev])
                    be.event_record(ev, 0)
                else:
                    steps.append([L, c, 0])
    except BaseException:
        be.quiesce()
        raise
    return 0


cdef int _swap_out(Backend be, list lanes, list steps, object after) except -1:
    """The second half of a sleep: each chunk unmapped and the host memory
    mapped at the owners' addresses.  Mapping over, once every copy is done:
    the host memory over the device memory, then the chunks unmapped (one
    left mapped by a failed unmap stays under the host memory: wake fills
    it again).  Otherwise, in the copies' order: the chunks nothing is
    copied from at once, each other one once its copies are done, and each
    host piece mapped as soon as no chunk is mapped under it.  A failed
    unmap or release does not stop the others (the first error follows, the
    lanes asleep); a failed mapping or wait, or a chunk left mapped under
    offloaded memory (not mapping over), wakes every lane again."""
    cdef Lane L
    cdef bint over = be.maps_over()
    first = None
    try:
        for L in lanes:
            L.asleep = True
        if over:
            for s in steps:
                if s[2]:
                    be.event_wait(s[2])
            for L in lanes:
                L.engine.show(L.base, L._pending)
                L._pending = []
            for s in steps:
                L = s[0]
                err = L.owner.unmap_one(L.base, s[1][0])
                first = first or err
        else:
            for s in [s for s in steps if not s[2]] + [s for s in steps if s[2]]:
                L = s[0]
                if s[2]:
                    be.event_wait(s[2])
                err = L.owner.unmap_one(L.base, s[1][0])
                first = first or err
                ready = _bare(L, L._pending)
                L.engine.show(L.base, ready)
                L._pending = [e for e in L._pending if e not in ready]
            for L in lanes:
                if L._pending:
                    raise first or MetraleError("sleep: a chunk is still mapped under offloaded "
                                                "memory")
    except BaseException:
        try:
            be.quiesce()        # every copy done: the staging range is whole
        except Exception:
            pass
        try:
            wake_lanes(be, lanes, after)    # awake again, the moved and kept bytes back
        except BaseException as e:
            logger().warning("buffer arena: waking again after a failed sleep failed (it "
                             "sleeps, its offloaded bytes held): %r", e)
        raise
    if first is not None:
        raise first
    return 0


cdef list _bare(Lane L, list entries):
    """The host pieces of `entries` under which no chunk of the lane is mapped."""
    chunks = L.owner.mapped()
    return [e for e in entries
            if not any(e[0] < c[0] + c[1] and c[0] < e[0] + e[1] for c in chunks)]


# -- wake -----------------------------------------------------------------------------------

cdef int wake_lanes(Backend be, list lanes, object after) except -1:
    cdef Lane L
    cdef uintptr_t side = 0
    cdef Py_ssize_t k
    cdef bint over = be.maps_over()
    done = [[] for _ in lanes]         # each lane's host pieces taken down from its addresses
    for L in lanes:
        L.asleep = True
    try:
        be.side_stream(&side)
        for L in lanes:
            if L.engine.at_base:
                be.quiesce()        # work reading the offloaded memory there is done
                break
        for k in range(len(lanes)):
            _back(be, lanes[k], side, over, done[k])
        if after is not None:
            after()
        be.sync(side)
        be.sync(0)
    except BaseException:
        try:
            be.quiesce()
        except Exception:
            pass
        for k in range(len(lanes)):
            _to_sleep(be, lanes[k], over, done[k])
        raise
    for L in lanes:
        L.asleep = False
    return 0


cdef int _back(Backend be, Lane L, uintptr_t side, bint over, list done) except -1:
    """One lane's device memory mapped again: range by range, each host
    piece at its addresses taken down and the memory under it mapped (over
    it, holding the staged bytes, where the backend maps over; else its
    moved bytes copied back on `side`, overlapping the next range's
    mapping); then the rest of its need mapped and its kept bytes queued."""
    cdef Offload eng = L.engine
    cdef uint64_t lo, n, x, y
    for e in sorted(eng.at_base):
        lo, n = e[0], e[1]
        if over:
            done.append(e)          # from here on something may cover part of it
            for c in L.owner.mapped():      # a chunk a failed unmap left under it
                x, y = max(<uint64_t>c[0], lo), min(<uint64_t>(c[0] + c[1]), lo + n)
                if x < y:
                    be.refill(L.base + x, y - x, eng.stage + x)
            L.owner.commit_need(L.base, L.need, lo, lo + n, eng.stage)
            be.unmap_host(L.base + lo, n)       # what no device memory covers now
            eng.at_base.remove(e)
        else:
            be.unmap_host(L.base + lo, n)
            eng.at_base.remove(e)
            done.append(e)
            L.owner.commit_need(L.base, L.need, lo, lo + n, 0)
            for o, m in L.moves:
                x, y = max(<uint64_t>o, lo), min(<uint64_t>(o + m), lo + n)
                if x < y:
                    be.copy(L.base + x, eng.stage + x, y - x, side)
    L.owner.commit_need(L.base, L.need, 0, _END, 0)
    if not over:
        # moved bytes no host piece at the owner's addresses held: a failed
        # sleep unmapped their chunk before mapping the host memory there
        for o, m in L.moves:
            for x, y in outside(o, o + m, [(e[0], e[0] + e[1]) for e in done]):
                be.copy(L.base + x, eng.stage + x, y - x, side)
    for o, m, host in L.keeps:
        be.copy_h2d(L.base + <uintptr_t>o, <void *><uintptr_t>host, m, side)
    return 0


cdef void _to_sleep(Backend be, Lane L, bint over, list done) noexcept:
    """After a failed wake: the lane asleep as before, its host memory at its
    addresses and its device memory given back (what the backend refuses is
    logged; a chunk left mapped stays, the next wake maps around it)."""
    cdef Offload eng = L.engine
    try:
        if over:
            for e in done:          # over whatever covers it now; once where still mapped
                be.map_host(L.base + <uintptr_t>e[0], e[1], e[2])
                if eng.at_base.find(tuple(e)) < 0:
                    eng.at_base.append(e)
        for c in L.owner.mapped():
            err = L.owner.unmap_one(L.base, c[0])
            if err is not None:
                logger().warning("buffer arena: unmapping after a failed wake failed: %s", err)
        if not over:
            eng.show(L.base, _bare(L, done))
    except BaseException as e:
        logger().warning("buffer arena: putting memory back to sleep after a failed wake "
                         "failed: %r", e)


# -- ranges ---------------------------------------------------------------------------------

cdef list outside(uint64_t lo, uint64_t hi, list ranges):
    out = []
    for x, y in sorted(ranges):
        if y <= lo or hi <= x:
            continue
        if x > lo:
            out.append((lo, x))
        lo = max(lo, y)
    if lo < hi:
        out.append((lo, hi))
    return out


cdef list granule_runs(list spans, uint64_t g):
    """The granules the (offset, bytes) `spans` touch, as merged (offset,
    bytes) runs in address order."""
    cdef uint64_t lo, hi
    parts = []
    for o, n in spans:
        if n:
            lo = <uint64_t>o // g * g
            hi = (<uint64_t>o + <uint64_t>n + g - 1) // g * g
            parts.append([lo, hi])
    parts.sort()
    out = []
    for lo, hi in parts:
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in out]


cdef list overlap(list a, list b):
    return [(max(x, y), min(x + m, y + k) - max(x, y))
            for x, m in a for y, k in b if max(x, y) < min(x + m, y + k)]


cdef list cut(list runs, uint64_t piece):
    out = []
    for lo, n in runs:
        while piece and n > piece:
            out.append((lo, piece))
            lo, n = lo + piece, n - piece
        out.append((lo, n))
    return out


cdef list tapered(list pieces, uint64_t granule, uint64_t least):
    out = list(pieces)
    if not out:
        return out
    lo, n = out.pop()
    while n > least:
        h = (n // 2 + granule - 1) // granule * granule    # the first half, in whole granules
        if h >= n:
            break
        out.append((lo, h))
        lo, n = lo + h, n - h
    out.append((lo, n))
    return out
