# cython: language_level=3, binding=False
"""Sleep and wake of a reserved BufferArena (docs/stable-addresses.md): what
each buffer becomes while the device memory is given back (discarded, kept
as a pinned host copy, or offloaded to host memory mapped at its own
addresses), and the pipelined copy and remap of an offload.

The state is the arena's: each buffer's record and the host memory in its
SleepState (_sleep_state.pyx), the device chunks in its Reservation
(_reservation.pyx); the reshape protocol is _reserve.pyx's.  BufferArena
binds `sleep`, `wake` and `prepare_sleep` from here.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t

from metrale._arena._arena_state cimport ArenaState, sleeping
from metrale._backends._backend cimport Backend
from metrale._base._common cimport buffer_ids, logger
from metrale._base._core cimport (MT_IN_ZERO_ALL, MT_MAX_BUFFERS, MT_MAX_RANGES, mt_group_ranges,
                                  mt_range)
from metrale._arena._debug cimport refill_guards
from metrale._arena._pool cimport Pool
from metrale._base._life cimport mt_life_reshape_end
from metrale._arena._reserve cimport begin
from metrale._arena._reservation cimport Reservation
from metrale._arena._sleep_state cimport FATE_KEPT, FATE_OFFLOADED, SleepState

from metrale._base.errors import MetraleError
from metrale._sizing._spec import POOL_NAME as _POOL_NAME


@cython.binding(True)
def sleep(ArenaState self, keep=(), offload=()):
    """Give back the device memory; the pointers stay reserved.

    The device's pending work is waited for.  The buffers named in
    `offload` move to host memory mapped at their own addresses: their
    views (and every tensor made from them) stay valid, and work that
    touches only them (a CUDA graph replay) runs while the arena sleeps,
    over the host link.  The buffers named in `keep` are copied to host
    memory (pinned on CUDA) for `wake` to copy back.  Every other buffer
    is discarded: its addresses are unmapped.  Then every device chunk is
    unmapped and released.  The host memory of both is made by the first
    sleep that needs it and reused by the next ones (`release` frees
    it).  Accessors keep returning the same pointers; operations and new
    views raise MetraleError until `wake`; `resize` sets the limits
    `wake` maps for.  `release` of a sleeping arena frees everything.
    The arena's pool (`open_pool`) sleeps with it: its memory is
    unmapped and its segments keep their addresses; their contents are
    discarded, or, with ``"torch"`` in `offload`, moved to host memory
    mapped at their own addresses as an offloaded buffer's are (tensors
    in the pool stay readable, graphs captured into it replay after
    `wake` without refilling them).  No segment can be taken from the
    moment the sleep begins until `wake` (torch's allocation is refused).
    Discarded segments have no memory while the arena sleeps: nothing
    may touch them until `wake`.

    Parameters
    ----------
    keep : iterable of str, optional
        Buffers whose contents `wake` restores (copied out and back).
    offload : iterable of str, optional
        Buffers moved to host memory at their own addresses for the sleep,
        and back to device memory by `wake`; ``"torch"``: the pool's
        segments.

    Raises
    ------
    TypeError, ValueError
        `keep` or `offload` holds something other than a buffer name (or,
        in `offload`, ``"torch"`` for an arena with a pool), or a buffer is
        in both.
    BufferError
        A view of a buffer not offloaded is alive; nothing changed.
    OutOfMemoryError
        Host memory could not be had; nothing changed.
    MetraleError
        The arena has no reservation, already sleeps or is released; or
        the backend failed: a copy (nothing changed), mapping the host
        memory at the buffers' addresses (the arena is awake again, its
        kept and offloaded buffers restored, the others' contents
        undefined), a handle's release (the arena sleeps; the handle is
        released again later), an unmap (the arena then sleeps with that
        chunk still mapped, `wake` works; or, where the chunk lies under an
        offloaded buffer's host memory, it is awake again as for a failed
        mapping); the pool's unmap or the mapping of its host memory (the
        arena sleeps, the pool awake with its segments' contents: `wake`
        works).
    """
    cdef ArenaState a = self
    cdef Backend be = a._gpu
    cdef Reservation r
    cdef SleepState st
    cdef Pool pool
    ids, off, pool_off = _kept_and_offloaded(a, keep, offload)
    begin(a, "sleep", off)
    r, st = a._reservation, a._sleep_state
    try:
        if st.sleeping:
            raise MetraleError("sleep: the buffer arena is already sleeping")
        be.quiesce()
        # The pool's offload copied out first (nothing else changes), its
        # memory given back once the buffers sleep: if the buffers' part
        # fails awake, the pool is untouched; if the pool's part fails, the
        # arena sleeps with the pool awake (wake works).  A pool already
        # asleep (a failed undo) sleeps on, for wake.
        pool = a._pool if a._pool is not None and not a._pool.asleep() else None
        staged = pool.stage(pool_off) if pool is not None else None
        err = None
        try:
            _sleep_buffers(a, r, st, off, ids)
        except BaseException as e:
            err = e
        if pool is not None and st.sleeping:
            try:
                pool.sleep_staged(pool_off, staged)
            except BaseException as e:
                err = err or e
        elif pool is not None:
            pool.unhold()               # awake: it takes allocations again
        if err is not None:
            raise err
    finally:
        mt_life_reshape_end(a._life, sleeping(a))    # paused while it sleeps
    return None


@cython.binding(True)
def prepare_sleep(ArenaState self, keep=(), offload=()):
    """Make, ahead of time, the host memory a later ``sleep(keep, offload)`` needs.

    The first sleep that keeps or offloads buffers allocates their host
    memory (pinned copies for `keep`, host memory mappable at the
    buffers' addresses for `offload`): a one-time cost that grows with the
    bytes (hundreds of milliseconds for gigabytes on an H200).  A
    latency-sensitive engine pays it here, at start-up; a later sleep
    naming these buffers (or fewer, at limits no larger) then allocates
    nothing.  The arena stays awake; nothing is copied.  The memory is
    kept until `release` (a later, larger sleep replaces it).

    Parameters
    ----------
    keep, offload : iterable of str, optional
        As `sleep` takes them (``"torch"``, the pool, allocates nothing
        ahead: its segments' host memory is made by the sleep).

    Returns
    -------
    int
        Bytes of host memory held for sleeps after this call (the kept
        copies' and the offloads').

    Raises
    ------
    ValueError, TypeError
        As `sleep`, for the names.
    OutOfMemoryError
        The host memory was refused; the arena is as it was, but offload
        host memory an earlier call made may have been given back (a
        larger offload replaces it whole): the next sleep makes it again.
    MetraleError
        The arena is not reserved, is shared, sleeps, is released or in a
        reshape on another thread.
    """
    cdef ArenaState a = self
    cdef Reservation r
    cdef SleepState st
    ids, off, _pool_off = _kept_and_offloaded(a, keep, offload)
    begin(a, "prepare_sleep", list(range(len(a._buffers))))    # views stay: nothing moves
    r, st = a._reservation, a._sleep_state
    try:
        if st.sleeping:
            raise MetraleError("prepare_sleep: the buffer arena is sleeping")
        _host_for(a, r, st, off, ids)
        return st.host_keep_bytes() + st.host_offload_bytes()
    finally:
        mt_life_reshape_end(a._life, sleeping(a))


cdef int _host_for(ArenaState a, Reservation r, SleepState st, list off, list ids) except -1:
    """The host memory a sleep keeping `ids` and offloading `off` copies into
    (made where it is missing: the first time, or grown)."""
    if (off or ids) and not r.piece:
        # Host memory, and from the next wake on device memory, in pieces
        # of an eighth of the slab (the last host piece tapered down to
        # 8 MiB, as the device memory that wake maps range by range under
        # it): a sleep unmaps the pieces it copies nothing from at
        # once, and each other one (remapping an offloaded one at its
        # addresses) as soon as its copy is done, while the next ones are
        # still being copied.
        r.piece = max(r.granule, (a._layout.slab_bytes // 8 + r.granule - 1)
                      // r.granule * r.granule)
    runs = _runs(a, off)
    st.host_memory(runs, r.piece, r.granule)
    st.keep_copies(&a._layout, ids)
    return 0


cdef tuple _kept_and_offloaded(ArenaState a, object keep, object offload):
    """`sleep`'s and `prepare_sleep`'s names, checked: (kept ids, offloaded
    ids, whether the pool is offloaded).  Converted before any state changes."""
    keep, in_keep = _pool_named(keep)
    if in_keep:
        raise ValueError(f"keep: {_POOL_NAME!r} (the arena's pool) is offloaded, not kept: "
                         f"sleep(offload=[{_POOL_NAME!r}])")
    offload, pool_off = _pool_named(offload)
    if pool_off and a._pool is None:
        raise ValueError(f"offload: {_POOL_NAME!r} names the arena's pool, and the arena has "
                         "none (open_pool)")
    ids = buffer_ids(keep, "keep", a._buffers)
    off = buffer_ids(offload, "offload", a._buffers)
    both = [a._buffers.names[i] for i in ids if i in off]
    if both:
        raise ValueError(f"keep, offload: {', '.join(both)} in both (a buffer is kept or "
                         "offloaded)")
    return ids, off, pool_off


cdef tuple _pool_named(object names):
    """`names` without the pool's name (a list, or `names` itself when it is
    not iterable: buffer_ids says so), and whether it was there.  Only str
    items are compared: no user code runs."""
    if isinstance(names, str):
        names = (names,)
    try:
        names = list(names)
    except TypeError:
        return names, False
    rest = [n for n in names if not (type(n) is str and <str>n == _POOL_NAME)]
    return rest, len(rest) != len(names)


cdef int _sleep_buffers(ArenaState a, Reservation r, SleepState st, list off, list ids) except -1:
    """The buffers' part of `sleep`, after the device's work was waited for."""
    cdef Backend be = a._gpu
    _host_for(a, r, st, off, ids)
    runs = _runs(a, off)
    chunks = sorted(r.chunks)
    events = []
    try:
        moved, copied = _copy_out(a, off, ids, chunks, events)
        st.set_fates(moved, copied)
        st.sleeping = True
        _remap(a, chunks, events, st.overlapping(runs))
    finally:
        for ev in events:
            if ev:
                be.event_destroy(ev)
    return 0


cdef tuple _copy_out(ArenaState a, list off, list ids, list chunks, list events):
    """Queue the copies out, chunk by chunk in address order: the offloaded
    buffers' bytes to their host memory (at the staging range), the kept
    ones' to their pinned buffers (one address space with the device's),
    with an event after each chunk's (0 for a chunk nothing is copied
    from).  Returns (offloaded, kept): buffer id -> bytes.  On failure the
    copies queued are waited for and nothing else is changed."""
    cdef Backend be = a._gpu
    cdef SleepState st = a._sleep_state
    cdef uintptr_t ev = 0
    cdef uint64_t lo, hi, o, n, x, y
    host = {i: st.rec[<int>i].host for i in ids}
    try:
        for c in chunks:
            lo, hi = c[0], c[0] + c[1]
            ev = 0
            for i in off + ids:
                o, n = a._layout.offset[i], a._layout.size[i]
                x, y = max(o, lo), min(o + n, hi)
                if x < y:
                    dst = st.stage + x if i in off else host[i] + (x - o)
                    be.copy(dst, a._base + x, y - x, 0)
                    ev = 1
            if ev:
                be.event_create(&ev)
                events.append(ev)
                be.event_record(ev, 0)
            else:
                events.append(0)
    except BaseException:
        be.quiesce()
        raise
    return ({i: a._layout.size[i] for i in off if a._layout.size[i]},
            {i: a._layout.size[i] for i in ids if a._layout.size[i]})


cdef int _remap(ArenaState a, list chunks, list events, list entries) except -1:
    """The second half of a sleep: the chunks nothing is copied from
    unmapped at once, each other one once its copies are done, and each
    host handle in `entries` mapped at the buffers' own addresses as soon as
    no chunk is mapped under it (the copies of the next chunks run
    meanwhile).  A failed unmap or handle release does not stop the others;
    the first error follows once every chunk was tried, the arena asleep: a
    chunk that could not be unmapped stays mapped, a handle that could not
    be released is released again later.  An offloaded buffer is never left
    without memory: a failed mapping, a failed wait, or a chunk left mapped
    under offloaded memory wakes the arena again (the error follows)."""
    cdef Backend be = a._gpu
    cdef Reservation r = a._reservation
    cdef SleepState st = a._sleep_state
    first = None
    pending = list(entries)
    order = [k for k in range(len(chunks)) if not events[k]] + \
        [k for k in range(len(chunks)) if events[k]]
    try:
        for k in order:
            if events[k]:
                be.event_wait(events[k])
            err = r.unmap(a._base, [chunks[k]])
            first = first or err
            ready = _bare(a, pending)
            st.map_at(a._base, ready)
            pending = [e for e in pending if e not in ready]
        if pending:         # a chunk left mapped under offloaded memory
            raise first or MetraleError("sleep: a chunk is still mapped under offloaded memory")
    except BaseException:
        be.quiesce()            # every copy done: the staging range is whole
        st.unmap_at(a._base)
        try:
            _restore(a)         # awake again: the kept and offloaded buffers back
        except BaseException:
            st.map_at(a._base, _bare(a, entries))     # asleep, the offloaded buffers held
            raise
        st.sleeping = False
        raise
    if first is not None:
        raise first
    return 0


cdef list _bare(ArenaState a, list entries):
    """The host handles of `entries` under which no chunk is mapped."""
    return [e for e in entries
            if not any(e[0] < c[0] + c[1] and c[0] < e[0] + e[1]
                       for c in a._reservation.chunks)]


@cython.binding(True)
def wake(ArenaState self):
    """Map device memory again at the same addresses after `sleep`.

    Zeroes the zero_all set (one fused operation) and norm_unit_w (the
    buffers filled with zeros at construction), then copies back the
    buffers `sleep` offloaded (their host memory unmapped from their
    addresses first: views of them stay valid) and those it kept (a kept
    or offloaded buffer of the zero_all set gets its contents; after a
    resize while asleep, up to the buffer's new size); every other
    buffer's contents are undefined (fresh memory).  The pool's segments
    are mapped again first, their contents copied back if the sleep
    offloaded them, else undefined.  A CUDA graph captured before the
    sleep replays bit-identically afterwards.

    Raises
    ------
    OutOfMemoryError
        Physical memory was refused; the arena still sleeps (wake again
        later).
    MetraleError
        The arena has no reservation, is not sleeping, is released, or
        the backend failed; the arena then still sleeps.
    """
    cdef ArenaState a = self
    cdef SleepState st = a._sleep_state
    begin(a, "wake", st.with_fate(FATE_OFFLOADED) if st is not None else [])
    try:
        if not st.sleeping:
            raise MetraleError("wake: the buffer arena is not sleeping")
        if a._pool is not None:
            a._pool.wake()      # all or nothing: the arena still sleeps if it fails
        try:
            _restore(a)         # asleep as before if it fails
        except BaseException:
            _pool_back_to_sleep(a)
            raise
        st.sleeping = False
        st.set_fates({}, {})
        a._reservation.trim(&a._layout, a._base)    # what a failed sleep left, and the limits
                                                    # no longer need
    finally:
        mt_life_reshape_end(a._life, sleeping(a))    # paused while it sleeps
    return None


cdef void _pool_back_to_sleep(ArenaState a) noexcept:
    """After a failed wake of the buffers: the pool sleeps again, as the arena."""
    if a._pool is None:
        return
    try:
        a._gpu.quiesce()
        a._pool.sleep_staged(a._pool.offloaded, a._pool.stage(a._pool.offloaded))
    except Exception as e:
        logger().warning("buffer arena: putting the pool back to sleep after a failed wake "
                         "failed (it stays awake): %s", e)


# -- what a sleep keeps and offloads --------------------------------------------------------

cdef int _restore(ArenaState a) except -1:
    """Device memory for the current sizes, zeroed as when new, with the kept
    and offloaded buffers copied back; on failure the arena is asleep as
    before (the chunks unmapped again, the offloaded buffers' host memory
    mapped at their addresses again) and the error propagates.

    Range by range: each host handle mapped at the buffers' addresses is
    unmapped (slow for host memory: about 2 ms a GB on the H200), the device
    memory under it mapped and its offloaded bytes queued for copy back
    from the staging range, so each range's copy runs while the next one is
    unmapped; then the rest is mapped and the kept copies queued.  The
    copies run on the backend's side stream while the zeroing, which spares
    their bytes, runs on the default one: they overlap."""
    cdef Backend be = a._gpu
    cdef Reservation r = a._reservation
    cdef SleepState st = a._sleep_state
    cdef uint64_t n, o, x, y
    cdef uintptr_t side = 0
    cdef int i
    moved = []                  # (buffer id, offset, bytes to restore)
    for i in range(st.n):       # up to the current size (a resize while asleep)
        if st.rec[i].fate == FATE_KEPT or st.rec[i].fate == FATE_OFFLOADED:
            n = min(st.rec[i].moved, a._layout.size[i])
            if n:
                moved.append((i, a._layout.offset[i], n))
    entries = sorted(st.at_base)
    undone = []                 # host handles unmapped from the buffers' addresses
    try:
        be.side_stream(&side)
        if entries:
            be.quiesce()        # work reading the offloaded buffers there is done
        copied = []
        for e in entries:
            lo, size, _h = e
            be.unmap_host(a._base + lo, size)
            st.at_base.remove(e)
            undone.append(e)
            r.commit(&a._layout, a._base, lo, lo + size)
            for i, o, n in moved:
                x, y = max(o, <uint64_t>lo), min(o + n, <uint64_t>(lo + size))
                if x < y and st.rec[i].fate == FATE_OFFLOADED:
                    be.copy(a._base + x, st.stage + x, y - x, side)
            copied.append((lo, lo + size))
        r.commit(&a._layout, a._base)
        for i, o, n in moved:
            if st.rec[i].fate == FATE_KEPT:
                be.copy_h2d(a._base + o, <void *>st.rec[i].host, n, side)
                continue
            for x, y in _outside(o, o + n, copied):     # grown past its host memory's ranges
                be.copy(a._base + x, st.stage + x, y - x, side)
        _zero_fresh_but(a, [(o, o + n) for _i, o, n in moved])
        be.sync(side)
        be.sync(0)
        refill_guards(a)
    except BaseException:
        try:
            be.quiesce()
        except Exception:
            pass
        r.unmap(a._base, r.chunks)
        if undone:
            try:
                st.map_at(a._base, _bare(a, undone))    # asleep as before
            except Exception as e:
                logger().warning("buffer arena: mapping the offloaded buffers' host memory "
                                 "again after a failed wake failed: %s", e)
        raise
    return 0


cdef list _outside(uint64_t lo, uint64_t hi, list ranges):
    """The parts of [lo, hi) outside `ranges` (any order, overlapping or not)."""
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


cdef int _zero_fresh_but(ArenaState a, list spans) except -1:
    """What a new arena starts zeroed (the zero_all set with its padding, and
    the init_zero buffers), less the slab byte ranges `spans`: in as few
    launches of the range kernel as hold them, on the default stream, not
    waited for."""
    cdef mt_range r[MT_MAX_BUFFERS]
    cdef mt_range batch[MT_MAX_RANGES]
    cdef int i, k = 0, m = mt_group_ranges(&a._layout, MT_IN_ZERO_ALL, r)
    cdef Backend be = a._gpu
    want = [(r[i].offset, r[i].offset + r[i].length) for i in range(m)]
    for name in a._buffers.groups["init_zero"]:
        i = a._index[name]
        if a._layout.size[i]:
            want.append((a._layout.offset[i], a._layout.offset[i] + a._layout.size[i]))
    want = [part for x, y in want for part in _outside(x, y, spans)]    # the spans cut out
    for x, y in sorted(want):
        if y > x:
            batch[k].offset, batch[k].length = x, y - x
            k += 1
            if k == MT_MAX_RANGES:
                be.zero_ranges(a._base, batch, k, 0)
                k = 0
    if k:
        be.zero_ranges(a._base, batch, k, 0)
    return 0


cdef list _runs(ArenaState a, list ids):
    """The granules the buffers `ids` occupy at their current sizes, as
    merged (offset, bytes) runs."""
    cdef uint64_t g = a._reservation.granule, lo, hi
    spans = []
    for i in ids:
        if a._layout.size[i]:
            lo = a._layout.offset[i] // g * g
            hi = (a._layout.offset[i] + a._layout.size[i] + g - 1) // g * g
            spans.append([lo, hi])
    spans.sort()
    out = []
    for lo, hi in spans:
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in out]
