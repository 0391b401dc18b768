# cython: language_level=3, binding=False
"""Sleep and wake of a reserved BufferArena (docs/stable-addresses.md): what
each buffer becomes while the device memory is given back (discarded, kept
as a pinned host copy, or offloaded to host memory mapped at its own
addresses), and the arena's pool with it.

The state is the arena's: each buffer's record and its pinned copies in its
SleepState (_sleep_state.pyx), the device chunks in its Reservation
(_reservation.pyx), the pool's in its Pool (_pool.pyx); the moving itself is
the offload engine's (_offload.pyx), which runs the buffers' lane and the
pool's in one pipeline; the reshape protocol is _reserve.pyx's.
BufferArena binds `sleep`, `wake` and `prepare_sleep` from here.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t

from metrale._arena._arena_state cimport ArenaState, sleeping
from metrale._arena._offload cimport (Lane, granule_runs, lane_new, outside, sleep_lanes,
                                      wake_lanes)
from metrale._backends._backend cimport Backend
from metrale._base._common cimport buffer_ids
from metrale._arena._fresh cimport wake_fresh, zero_spans
from metrale._arena._pool cimport Pool
from metrale._base._life cimport mt_life_reshape_end
from metrale._arena._reserve cimport begin
from metrale._arena._reservation cimport Reservation
from metrale._arena._sleep_state cimport FATE_OFFLOADED, SleepState

from metrale._base.errors import MetraleError
from metrale._sizing._spec import POOL_NAME as _POOL_NAME


@cython.binding(True)
def sleep(ArenaState self, keep=(), offload=(), discard=()):
    """Give back the device memory; the pointers stay reserved.

    Each buffer goes as its wake contract says (``BufferSpec(wake=...)``,
    docs/stable-addresses.md): ``"keep"`` buffers are kept, ``"offload"``
    ones offloaded, every other one discarded, to wake zeroed (``"zero"``,
    the default), filled (``"fill:VALUE"``) or as the new memory is
    (``"undefined"``).  `keep`, `offload` and `discard` override the
    contract of the buffers they name for this sleep (a discarded
    ``"keep"`` or ``"offload"`` buffer wakes zeroed).

    The device's pending work is waited for.  The buffers offloaded
    move to host memory mapped at their own addresses: their
    views (and every tensor made from them) stay valid, and work that
    touches only them (a CUDA graph replay) runs while the arena sleeps,
    over the host link.  The buffers kept are copied to host memory
    (pinned on CUDA) for `wake` to copy back.  Every other buffer is
    discarded: its addresses are unmapped.  Then every device chunk is
    unmapped and released.  The host memory of both is made by the first
    sleep that needs it and reused by the next ones (`release` frees
    it).  Accessors keep returning the same pointers; operations and new
    views raise MetraleError until `wake`; `resize` sets the limits
    `wake` maps for.  `release` of a sleeping arena frees everything.
    The arena's pool (`open_pool`) sleeps with it, in the same pipeline:
    its memory is unmapped and its segments keep their addresses; their
    contents go as its contract says (``open_pool(wake=...)``: discarded to
    wake zeroed by default), or, with ``"torch"`` in `offload` (or a pool
    of contract ``"offload"`` and no ``"torch"`` in `discard`), are moved
    to host memory mapped at their own addresses as an offloaded buffer's are
    (tensors in the pool stay readable, graphs captured into it replay
    after `wake` without refilling them).  No segment can be taken from
    the moment the sleep begins until `wake` (torch's allocation is
    refused).  Discarded segments have no memory while the arena sleeps:
    nothing may touch them until `wake`.

    While the sleep runs, an offloaded buffer or segment is read from
    another thread safely only on a backend that maps memory over memory
    (the host backend: its bytes read the same throughout).  On CUDA each
    chunk is unmapped before the host memory is mapped at its addresses:
    work queued before the call is waited for, but a kernel started on
    another stream during it may touch an address with nothing mapped (a
    device fault); start it after `sleep` returns.  The arena's own
    operations and new views from other threads are refused meanwhile
    (MetraleError).

    Parameters
    ----------
    keep : iterable of str, optional
        Buffers whose contents `wake` restores (copied out and back).
    offload : iterable of str, optional
        Buffers moved to host memory at their own addresses for the sleep,
        and back to device memory by `wake`; ``"torch"``: the pool's
        segments.
    discard : iterable of str, optional
        Buffers (of contract ``"keep"`` or ``"offload"``) discarded this
        time, to wake zeroed; ``"torch"``: the pool's segments, of a pool
        whose contract offloads them.

    Raises
    ------
    TypeError, ValueError
        `keep`, `offload` or `discard` holds something other than a buffer
        name (or, in `offload` or `discard`, ``"torch"`` for an arena with a
        pool), or a buffer is in two of them.
    BufferError
        A view of a buffer not offloaded is alive; nothing changed.
    OutOfMemoryError
        Host memory could not be had; nothing changed.
    MetraleError
        The arena has no reservation, already sleeps or is released; or
        the backend failed: a copy (nothing changed); mapping host memory
        at the buffers' or the pool's addresses (the arena and its pool are
        awake again, their kept and offloaded bytes restored, the others'
        contents undefined); a handle's release (the arena sleeps; the
        handle is released again later); an unmap (the arena sleeps with
        that chunk still mapped, `wake` works; on a backend that maps only
        where nothing is mapped, CUDA, a chunk under offloaded host memory
        wakes it again as for a failed mapping).
    """
    cdef ArenaState a = self
    cdef Backend be = a._gpu
    cdef Reservation r
    cdef SleepState st
    cdef Pool pool = None
    cdef Lane buffers, pooled = None
    cdef int i
    ids, off, pool_off = _kept_and_offloaded(a, keep, offload, discard)
    begin(a, "sleep", off)
    r, st = a._reservation, a._sleep_state
    try:
        if st.sleeping:
            raise MetraleError("sleep: the buffer arena is already sleeping")
        be.quiesce()
        _host_for(a, r, st, off, ids)
        moved = {i: a._layout.size[i] for i in off if a._layout.size[i]}
        copied = {i: a._layout.size[i] for i in ids if a._layout.size[i]}
        moves = [(a._layout.offset[i], n) for i, n in moved.items()]
        keeps = [(a._layout.offset[i], n, st.rec[i].host) for i, n in copied.items()]
        buffers = lane_new(st.offload, r, a._base, moves, keeps, r.needed(&a._layout))
        lanes = [buffers]
        if a._pool is not None and not a._pool.asleep():
            pool = a._pool
            pooled = pool.sleep_lane(pool_off)      # no segment taken from here on
            lanes.append(pooled)
        st.set_fates(moved, copied)
        spans = moves + [(o, n) for o, n, _h in keeps]
        try:
            sleep_lanes(be, lanes, _fresh(a, spans, None))
        finally:
            st.sleeping = buffers.asleep
            if pool is not None:
                pool.settled(pooled)
            st.settle_classes(a._pool is not None and a._pool.asleep())
    finally:
        mt_life_reshape_end(a._life, sleeping(a))    # paused while it sleeps
    return None


@cython.binding(True)
def prepare_sleep(ArenaState self, keep=(), offload=(), discard=()):
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
    keep, offload, discard : iterable of str, optional
        As `sleep` takes them, over the buffers' contracts (``"torch"``,
        the pool, allocates nothing ahead: its segments' host memory is
        made by the sleep).

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
    ids, off, _pool_off = _kept_and_offloaded(a, keep, offload, discard)
    begin(a, "prepare_sleep", list(range(len(a._buffers))))    # views stay: nothing moves
    r, st = a._reservation, a._sleep_state
    try:
        if st.sleeping:
            raise MetraleError("prepare_sleep: the buffer arena is sleeping")
        _host_for(a, r, st, off, ids)
        return st.host_keep_bytes() + st.offload.host_bytes()
    finally:
        mt_life_reshape_end(a._life, sleeping(a))


cdef int _host_for(ArenaState a, Reservation r, SleepState st, list off, list ids) except -1:
    """The host memory a sleep keeping `ids` and offloading `off` copies into
    (made where it is missing: the first time, or grown)."""
    if (off or ids) and not r.piece:
        # From the next wake on, device memory in the host memory's pieces:
        # a sleep unmaps each one as soon as its copy is done (mapping the
        # host memory at its addresses), while the next ones are still being
        # copied.
        r.piece = st.offload.piece
    st.offload.host_memory(granule_runs([(a._layout.offset[i], a._layout.size[i]) for i in off],
                                        r.granule))
    st.keep_copies(&a._layout, ids)
    return 0


cdef tuple _kept_and_offloaded(ArenaState a, object keep, object offload, object discard):
    """`sleep`'s and `prepare_sleep`'s names, checked, and each other buffer's
    wake contract: (kept ids, offloaded ids, whether the pool is offloaded).
    Converted before any state changes."""
    keep, in_keep = _pool_named(keep)
    if in_keep:
        raise ValueError(f"keep: {_POOL_NAME!r} (the arena's pool) is offloaded, not kept: "
                         f"sleep(offload=[{_POOL_NAME!r}])")
    offload, pool_off = _pool_named(offload)
    discard, pool_gone = _pool_named(discard)
    if (pool_off or pool_gone) and a._pool is None:
        raise ValueError(f"{'offload' if pool_off else 'discard'}: {_POOL_NAME!r} names the "
                         "arena's pool, and the arena has none (open_pool)")
    ids = buffer_ids(keep, "keep", a._buffers)
    off = buffer_ids(offload, "offload", a._buffers)
    gone = buffer_ids(discard, "discard", a._buffers)
    for x, y, xs, ys in (("keep", "offload", ids, off), ("keep", "discard", ids, gone),
                         ("offload", "discard", off, gone)):
        both = [a._buffers.names[i] for i in xs if i in ys]
        if both:
            raise ValueError(f"{x}, {y}: {', '.join(both)} in both (a buffer is kept, "
                             "offloaded or discarded)")
    if pool_off and pool_gone:
        raise ValueError(f"offload, discard: {_POOL_NAME!r} in both")
    named = set(ids) | set(off) | set(gone)
    groups = a._buffers.groups
    ids = sorted(set(ids).union(
        i for i in (a._index[n] for n in groups["wake_keep"]) if i not in named))
    off = sorted(set(off).union(
        i for i in (a._index[n] for n in groups["wake_offload"]) if i not in named))
    pool_off = pool_off or (a._pool is not None and not pool_gone and a._pool.wake == "offload")
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


@cython.binding(True)
def wake(ArenaState self):
    """Map device memory again at the same addresses after `sleep`.

    Gives each buffer what its wake contract says: copies back the buffers
    `sleep` offloaded (their host memory taken down from their addresses
    range by range: views of them stay valid) and those it kept (after a
    resize while asleep, up to the buffer's new size, the rest zeroed);
    zeroes every other buffer (in as few launches of the range kernel as
    hold them), fills the ``"fill:VALUE"`` buffers and leaves the
    ``"undefined"`` ones as the new memory is.  The pool's segments are
    mapped again in the same pipeline, their contents copied back if the
    sleep offloaded them, else zeroed (or, for a pool opened with
    ``wake="undefined"``, left as the new memory is).  A CUDA graph captured
    before the sleep replays bit-identically afterwards.  The device's
    work queued before the call is waited for; while it runs, offloaded
    memory is read safely from another thread only where the backend maps
    memory over memory (the host backend: device memory already holding
    the bytes replaces the host memory in one step); on CUDA start work
    that touches it after `wake` returns (as for `sleep`).

    Raises
    ------
    OutOfMemoryError
        Physical memory was refused; the arena still sleeps (wake again
        later).
    MetraleError
        The arena has no reservation, is not sleeping, is released, or
        the backend failed; the arena (and its pool) then still sleeps.
    """
    cdef ArenaState a = self
    cdef SleepState st = a._sleep_state
    cdef Reservation r
    cdef Pool pool = None
    cdef Lane buffers, pooled = None
    begin(a, "wake", st.with_fate(FATE_OFFLOADED) if st is not None else [])
    try:
        if not st.sleeping:
            raise MetraleError("wake: the buffer arena is not sleeping")
        r = a._reservation
        moves, keeps = st.to_move(&a._layout)
        buffers = lane_new(st.offload, r, a._base, moves, keeps, r.needed(&a._layout))
        lanes = [buffers]
        if a._pool is not None and a._pool.asleep():
            pool = a._pool
            pooled = pool.wake_lane()
            lanes.append(pooled)
        spans = moves + [(o, n) for o, n, _h in keeps]
        try:
            wake_lanes(a._gpu, lanes, _fresh(a, spans, pooled))
        finally:
            if pool is not None:
                pool.settled(pooled)
        st.sleeping = False
        st.settle_classes(a._pool is not None and a._pool.asleep())
        st.set_fates({}, {})
        r.trim(&a._layout, a._base)     # what a failed sleep left, and the limits no longer need
    finally:
        mt_life_reshape_end(a._life, sleeping(a))    # paused while it sleeps
    return None


# -- what a woken arena's new memory starts with --------------------------------------------

cdef object _fresh(ArenaState a, list spans, Lane pooled):
    """After the lanes' memory is back (woken, or a failed sleep undone): what
    a new arena holds, each buffer as its contract gives it but for the bytes
    copied back (`spans`, (offset, bytes)); and with the wake's pool lane, of
    a pool whose contract is not "undefined", its segments but for the bytes
    copied back (a failed sleep leaves the pool's bytes as the failure left them:
    intact where their memory stayed, undefined where it was given back)."""
    def after():
        wake_fresh(a, spans)
        if pooled is not None and (<Pool>pooled.owner).wake != "undefined":
            back = [(o, o + n) for o, n in pooled.moves]
            zero_spans(a._gpu, pooled.base, [part for o, n in pooled.need
                                             for part in outside(o, o + n, back)],
                       (<Pool>pooled.owner).granule)
    return after
