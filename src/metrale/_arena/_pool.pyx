# cython: language_level=3, binding=False
"""The pool of an arena (docs/torch.md): memory for torch beside the buffers.

A range beside the buffers, out of which the C pool (src/pool.c) hands out
segments (torch's, through `metrale.torch`), mapped on demand; freed pages
stay mapped until `trim`; sleep and wake (the offload engine's, through the
Owner protocol) keep the segments' addresses.  On CUDA the device operations
are driver calls without the GIL (torch calls from any thread); elsewhere
the backend's own methods, with the GIL.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport free, malloc

from metrale._arena._offload cimport Lane, Owner, granule_runs, lane_new, offload_new, overlap
from metrale._backends._backend cimport Backend
from metrale._base._common cimport logger, u64_arg
from metrale._base._life cimport mt_fork_generation, raise_life
from metrale._base._core cimport (
    MT_ERR_NOMEM, MT_LIFE_FORKED, MT_OK, MT_POOL_ASLEEP, MT_POOL_DEVICE, MT_POOL_FOREIGN,
    MT_POOL_FULL, MT_POOL_IN_USE, MT_POOL_SIZE, mt_pool_alloc, mt_pool_bind, mt_pool_chunks,
    mt_pool_close, mt_pool_commit, mt_pool_free, mt_pool_get_stats, mt_pool_hold, mt_pool_new,
    mt_pool_release, mt_pool_segments, mt_pool_set_asleep, mt_pool_slot_alloc, mt_pool_slot_free,
    mt_pool_stats, mt_pool_stray_calls, mt_pool_trim, mt_pool_unbind, mt_pool_unmap_chunk,
    mt_pool_unretire, mt_range)

from metrale._base.errors import MetraleError, OutOfMemoryError

cdef object _TOKEN = object()


# -- the backend's own methods as the pool's operations (with the GIL): each
# keeps what the backend raised, for _failure, and returns 1 ----------------------------

cdef int _create(void *ctx, uint64_t n, uint64_t *handle) noexcept with gil:
    try:
        (<Pool>ctx).gpu.create(n, handle)
    except BaseException as e:
        (<Pool>ctx).error = e
        return 1
    return 0


cdef int _release(void *ctx, uint64_t handle, uint64_t n) noexcept with gil:
    try:
        (<Pool>ctx).gpu.release_handle(handle, n)
    except BaseException as e:
        (<Pool>ctx).error = e
        return 1
    return 0


cdef int _map(void *ctx, uint64_t at, uint64_t n, uint64_t handle) noexcept with gil:
    cdef Pool p = <Pool>ctx
    try:
        if p.fill:          # a wake's, over the host memory there, holding its bytes
            p.gpu.map_filled(at, n, handle, p.fill + (at - p.base))
        else:
            p.gpu.map(at, n, handle)
    except BaseException as e:
        p.error = e
        return 1
    return 0


cdef int _unmap(void *ctx, uint64_t at, uint64_t n) noexcept with gil:
    try:
        (<Pool>ctx).gpu.unmap(at, n)
    except BaseException as e:
        (<Pool>ctx).error = e
        return 1
    return 0


# no_gc: it holds its backend and plain values only; the arena closes it.
@cython.no_gc
@cython.final
cdef class Pool(Owner):
    """Pool()
--

The pool of a reserved arena: segments of its own range (made by
    ``BufferArena.open_pool``; ``metrale.torch.pool`` serves torch from it),
    whose addresses never move: a segment keeps its address through sleep and wake.

    Attributes
    ----------
    nbytes : int
        The range's bytes (a multiple of the granularity).
    slot : int
        The torch allocator slot bound to the pool (`allocator`), or -1.
    wake : str
        Its wake contract (``open_pool(wake=...)``).
    """

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("Pool is made by BufferArena.open_pool")
        self.slot = -1
        self.moved = []

    def __dealloc__(self):
        # One dropped unclosed keeps what it maps (torch may still use it).
        if self._p != NULL and self.dead:
            mt_pool_free(self._p)

    cdef int _start(self, str call) except -1:
        if self._p == NULL or self.dead:
            raise MetraleError(f"pool.{call}: the pool is closed (its arena was released)")
        if self.inherited():        # before the C pool's lock, which a parent thread may hold
            raise_life(MT_LIFE_FORKED, "the arena's pool", f"pool.{call}")
        self.error = None
        self.busy += 1
        return 0

    cdef void _end(self) noexcept:
        self.busy -= 1
        self._free_if_idle()

    cdef void _free_if_idle(self) noexcept:
        if self.dead and self.busy == 0 and self._p != NULL:
            mt_pool_free(self._p)
            self._p = NULL

    cdef object _failure(self, int rc, int err, str call, uint64_t n=0):
        """The exception for the C pool's result `rc` of `call`."""
        cdef mt_pool_stats s
        if rc == MT_POOL_FULL or rc == MT_POOL_ASLEEP:
            with nogil:
                mt_pool_get_stats(self._p, &s)
            figures = (f"{s.in_use:,} of {s.reserved:,} bytes in {s.segments} segments, "
                       f"{s.committed:,} mapped")
            if rc == MT_POOL_ASLEEP:
                return MetraleError(f"pool.{call}: the pool sleeps with its arena ({figures})")
            return OutOfMemoryError(f"pool.{call}({n:,} bytes): no run of free pages that long "
                                    f"in the pool ({figures}); open a larger pool")
        if rc == MT_ERR_NOMEM:
            return MemoryError()
        if rc == MT_POOL_DEVICE:
            if self.error is not None:
                e, self.error = self.error, None
                return e
            return self.gpu.pool_error(err, call)
        if rc == MT_POOL_IN_USE:
            return MetraleError(f"pool.{call}: torch still holds {self.segments_held()} segments")
        return MetraleError(f"pool.{call}: the C pool returned {rc}")

    def alloc(self, nbytes):
        """A segment of at least `nbytes` (whole pages of the granularity).

        Parameters
        ----------
        nbytes : int
            At least 1 (torch's allocator asks for no empty segment; one
            page for a zero-byte ask would be a size silently not asked).

        Returns
        -------
        int
            Its address, a multiple of the granularity.

        Raises
        ------
        ValueError
            `nbytes` is 0 or negative.
        OutOfMemoryError
            No run of free pages is long enough, or physical memory was
            refused; nothing stays mapped.
        MetraleError
            The pool sleeps or is closed.
        """
        cdef uint64_t n = u64_arg(nbytes, "nbytes"), out = 0
        cdef int rc, err = 0
        if n == 0:
            raise ValueError("nbytes: 0; a segment holds at least one byte")
        self._start("alloc")
        try:
            with nogil:
                rc = mt_pool_alloc(self._p, n, &out, &err)
            if rc != MT_OK:
                raise self._failure(rc, err, "alloc", n)
        finally:
            self._end()
        return out

    def free(self, ptr, nbytes=0):
        """Give a segment back; its pages stay mapped for the next one.

        Parameters
        ----------
        ptr : int
            Where `alloc` put it.
        nbytes : int, optional
            Its size as `alloc` was asked for it, exactly (0: not checked).

        Raises
        ------
        ValueError
            `ptr` is not a segment of this pool, or `nbytes` is not the size
            it was asked for; nothing changes.
        """
        cdef uint64_t p = u64_arg(ptr, "ptr"), n = u64_arg(nbytes, "nbytes")
        cdef int rc
        self._start("free")
        try:
            with nogil:
                rc = mt_pool_release(self._p, p, n)
        finally:
            self._end()
        if rc == MT_POOL_SIZE:
            raise ValueError(f"nbytes: {n} is not the size the segment at {p:#x} was asked "
                             "for (pass that size, or 0)")
        if rc != MT_OK:
            raise ValueError(f"ptr: {p:#x} is not a segment of this pool")

    def trim(self):
        """Unmap the physical memory no segment touches (the range stays).

        The device's pending work is waited for first.

        Returns
        -------
        int
            Bytes unmapped.
        """
        cdef uint64_t gone = 0
        cdef int rc, err = 0
        self._start("trim")
        try:
            self.gpu.quiesce()
            with nogil:
                rc = mt_pool_trim(self._p, &gone, &err)
            if rc != MT_OK:
                raise self._failure(rc, err, "trim")
        finally:
            self._end()
        return gone

    def stats(self):
        """The pool's figures.

        Returns
        -------
        dict
            ``reserved``, ``committed`` (mapped now), ``in_use`` (in
            segments), ``peak_committed``, ``peak_in_use``, ``segments``,
            ``chunks`` (physical handles mapped), ``orphans``, ``creates``
            (handles ever made), ``allocs``, ``frees``, ``refused``,
            ``asleep``, ``offloaded`` (bytes of segments an offloading
            sleep holds on the host now) and ``host_bytes`` (the host
            memory held for offloads: made by the first, reused).
        """
        cdef mt_pool_stats s
        self._start("stats")
        try:
            with nogil:
                mt_pool_get_stats(self._p, &s)
        finally:
            self._end()
        return {"reserved": s.reserved, "committed": s.committed, "in_use": s.in_use,
                "peak_committed": s.peak_committed, "peak_in_use": s.peak_in_use,
                "segments": s.segments, "chunks": s.chunks, "orphans": s.orphans,
                "creates": s.creates, "allocs": s.allocs, "frees": s.frees, "refused": s.refused,
                "asleep": bool(s.asleep), "offloaded": sum(n for _, n in self.moved),
                "host_bytes": self.host.host_bytes()}

    def segments(self):
        """The segments handed out: ``[(ptr, bytes)]`` in address order."""
        return [(self.base + o, n) for o, n in self._ranges(True, "segments")]

    def chunks(self):
        """The physical memory mapped: ``[(offset, bytes)]`` from `base`."""
        return self._ranges(False, "chunks")

    cdef list _ranges(self, bint segments, str call):
        """The segments' or the chunks' (offset, bytes), read under the C
        pool's lock (again if more came meanwhile)."""
        cdef uint64_t n, k
        cdef mt_range *out = NULL
        self._start(call)
        try:
            while True:
                with nogil:
                    n = mt_pool_segments(self._p, NULL, 0) if segments else \
                        mt_pool_chunks(self._p, NULL, 0)
                out = <mt_range *>malloc((n + 1) * sizeof(mt_range))
                if out == NULL:
                    raise MemoryError()
                with nogil:
                    k = mt_pool_segments(self._p, out, n) if segments else \
                        mt_pool_chunks(self._p, out, n)
                if k <= n:
                    return [(out[i].offset, out[i].length) for i in range(k)]
                free(out)
                out = NULL
        finally:
            free(out)
            self._end()

    @property
    def base(self):
        """Where the pool's range starts."""
        return self.base

    @property
    def granularity(self):
        """The page: every segment is a whole number of them."""
        return self.granule

    @property
    def closed(self):
        """Whether the pool is closed (its arena released it)."""
        return self._p == NULL or self.dead

    def allocator(self):
        """The pool's pair of C functions for torch's pluggable allocator.

        Binds a slot (src/pool.c) to the pool, once: torch calls
        ``alloc(size, device, stream)`` and ``free(ptr, size, device,
        stream)`` at these addresses, from any thread.

        Returns
        -------
        tuple of (int, int)

        Raises
        ------
        MetraleError
            The backend's operations need the GIL (not CUDA), or every slot
            is taken.
        """
        cdef int slot
        self._start("allocator")
        try:
            if not self.direct:
                raise MetraleError(f"pool.allocator: a pool on {type(self.gpu).__name__} "
                                   "cannot serve torch (its operations need the GIL): "
                                   "torch's memory is CUDA memory")
            if self.slot < 0:
                with nogil:
                    slot = mt_pool_bind(self._p)
                if slot < 0:
                    raise MetraleError("pool.allocator: every slot of torch allocators is "
                                       "taken (64 per process; a slot comes back when its "
                                       "torch MemPool is gone)")
                self.slot = slot
                self.retire = True
        finally:
            self._end()
        return mt_pool_slot_alloc(self.slot), mt_pool_slot_free(self.slot)

    def __repr__(self):
        if self.closed:
            return "Pool(closed)"
        if self.inherited():
            return "Pool(inherited across fork())"
        s = self.stats()
        return (f"Pool(base={self.base:#x}, reserved={s['reserved']:,}, "
                f"committed={s['committed']:,}, in_use={s['in_use']:,}, "
                f"segments={s['segments']}{', asleep' if s['asleep'] else ''})")

    # -- for the arena: its part of a sleep and a wake, through the engine ------------------
    cdef void _hold(self, bint on) noexcept:
        if self._p != NULL and not self.dead:
            with nogil:
                mt_pool_hold(self._p, on)

    cdef Lane sleep_lane(self, bint offload):
        self._start("sleep")
        # No segment is taken from here on (one taken after the copy would lose its memory).
        self._hold(True)
        try:
            need = self._runs()
            moves = need if offload else []
            if moves:
                self.host.host_memory(moves)    # made once, reused
            return lane_new(self.host, self, self.base, moves, [], need)
        except BaseException:
            self._hold(False)
            raise
        finally:
            self._end()

    cdef Lane wake_lane(self):
        self._start("wake")
        try:
            self._hold(True)        # nothing taken, nothing trimmed until the bytes are back
            need = self._runs()     # a segment freed while asleep is not mapped again
            return lane_new(self.host, self, self.base, overlap(self.moved, need), [], need)
        finally:
            self._end()

    cdef void settled(self, Lane lane) noexcept:
        cdef int asleep = lane.asleep
        self.moved = lane.moves if asleep else []
        if self._p != NULL and not self.dead:
            with nogil:     # asleep: allocations refused as such
                mt_pool_set_asleep(self._p, asleep)
        self._hold(False)

    # -- the Owner protocol (_offload.pxd) ----------------------------------------------------
    cdef list mapped(self):
        return self._ranges(False, "sleep")

    cdef object unmap_one(self, uintptr_t base, uint64_t offset):
        cdef int rc, gone = 0, err = 0
        self._start("sleep")
        try:
            with nogil:
                rc = mt_pool_unmap_chunk(self._p, offset, &gone, &err)
            if rc == MT_OK or rc == MT_POOL_FOREIGN:
                return None
            return self._failure(rc, err, "sleep")
        finally:
            self._end()

    cdef int commit_need(self, uintptr_t base, list need, uint64_t lo, uint64_t hi,
                         uintptr_t fill) except -1:
        cdef int rc, err = 0
        cdef uint64_t x, y
        if fill and self.direct:
            raise MetraleError("pool: the backend maps only where nothing is mapped")
        self._start("wake")
        self.fill = fill                # the host operations (_map) read it
        try:
            for o, n in need:
                x, y = max(<uint64_t>o, lo), min(<uint64_t>(o + n), hi)
                if x < y:
                    with nogil:
                        rc = mt_pool_commit(self._p, x, y - x, &err)
                    if rc != MT_OK:
                        raise self._failure(rc, err, "wake")
        finally:
            self.fill = 0
            self._end()
        return 0

    cdef list _runs(self):
        """The segments as merged (offset, bytes) runs from `base`."""
        return granule_runs(self._ranges(True, "sleep"), self.granule)

    cdef bint inherited(self):
        return mt_fork_generation() != self.fork_gen

    cdef void close_inherited(self) noexcept:
        cdef Backend be = self.gpu
        if self.dead:
            return
        self.dead, self._p = True, NULL     # the C pool's memory is left: its lock may be held
        self.slot = -1
        if be.device_type != 1:             # a GPU's memory is the parent's
            return
        try:
            self.host.close()       # this process's copy of an offload's host memory
            be.unreserve(self.base, self.nbytes)    # every page mapped in the range with it
        except Exception as e:
            logger().warning("buffer arena: giving back a forked child's copy of the pool "
                             "failed: %s", e)
        self.base = 0

    cdef bint asleep(self):
        cdef mt_pool_stats s
        if self._p == NULL or self.dead or self.inherited():
            return False
        with nogil:
            mt_pool_get_stats(self._p, &s)
        return s.asleep != 0

    cdef uint64_t segments_held(self):
        cdef mt_pool_stats s
        if self._p == NULL or self.dead or self.inherited():
            return 0
        with nogil:
            mt_pool_get_stats(self._p, &s)
        return s.segments

    cdef object close(self):
        cdef int rc, err = 0
        if self._p == NULL or self.dead:
            return None
        if self.inherited():
            self.close_inherited()
            return None
        if self.segments_held():
            return MetraleError(f"torch still holds {self.segments_held()} segments of the "
                                "arena's pool")
        if self.slot >= 0:
            with nogil:     # waits for torch's calls in progress
                mt_pool_unbind(self.slot, self.retire)
            self.slot = -1
        self.error = None
        self.busy += 1
        try:
            e = self.host.close()       # an offload's host memory
            if e is not None:
                return e
            self.moved = []
            with nogil:
                rc = mt_pool_close(self._p, 0, &err)
            if rc != MT_OK:
                return self._failure(rc, err, "close")
            if self.base:
                self.gpu.unreserve(self.base, self.nbytes)
                self.base = 0
        except Exception as e:
            return e
        finally:
            self.busy -= 1
        self.dead = True
        self._free_if_idle()
        return None


cdef Pool pool_new(Backend gpu, uint64_t nbytes):
    cdef uint64_t g = gpu.granularity()
    cdef uint64_t n = (nbytes + g - 1) // g * g      # nbytes <= 2**62 (open_pool)
    cdef uintptr_t at = 0
    cdef Pool p = Pool.__new__(Pool, _TOKEN)
    p.gpu, p.granule, p.nbytes = gpu, g, n
    p.fork_gen = mt_fork_generation()
    p.host = offload_new(gpu, n)        # nothing made until an offload needs it
    p.direct = gpu.pool_ops(&p.ops) == 1
    if not p.direct:
        p.ops.ctx = <void *>p            # borrowed: the pool outlives its C pool
        p.ops.create, p.ops.release, p.ops.map, p.ops.unmap = _create, _release, _map, _unmap
    gpu.reserve(n, &at)
    p._p = mt_pool_new(at, n // g, g, &p.ops)
    if p._p == NULL:
        gpu.unreserve(at, n)
        raise MemoryError()
    p.base = at
    return p


def unretire(int slot):
    """Give a slot back once the torch allocator made of it is gone.

    Parameters
    ----------
    slot : int
        ``Pool.slot`` of the pool the allocator was made for.
    """
    mt_pool_unretire(slot)


def stray_calls():
    """Calls of torch's allocator functions that found no pool or freed a
    pointer not the pool's (tests)."""
    return mt_pool_stray_calls()
