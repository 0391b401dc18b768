# cython: language_level=3, binding=False
"""Sleep and wake of a reserved BufferArena (docs/stable-addresses.md): what
each buffer becomes while the device memory is given back (discarded, kept
as a pinned host copy, or offloaded to host memory mapped at its own
addresses), and the arena's pool with it; whole, or class by class (the
buffers' tags, the pool's "torch"), each class's chunks and host memory its
own, so that one sleeps and wakes while the others stay as they are.

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
from metrale._arena._offload cimport (Lane, Offload, granule_runs, lane_new, outside,
                                      sleep_lanes, wake_lanes)
from metrale._backends._backend cimport Backend
from metrale._base._common cimport buffer_ids
from metrale._arena._fresh cimport wake_fresh, zero_spans
from metrale._arena._pool cimport Pool
from metrale._base._life cimport mt_life_reshape_end, mt_life_set_asleep
from metrale._arena._reserve cimport begin, reserved
from metrale._arena._reservation cimport Reservation
from metrale._arena._sleep_state cimport TORCH_CLASS, SleepState

from metrale._base.errors import MetraleError
from metrale._sizing._spec import POOL_NAME as _POOL_NAME


@cython.binding(True)
def sleep(ArenaState self, keep=(), offload=(), discard=(), tags=None):
    """Give back the device memory; the pointers stay reserved.

    Each buffer goes as its wake contract says (``BufferSpec(wake=...)``,
    docs/stable-addresses.md): ``"keep"`` buffers are kept, ``"offload"``
    ones offloaded, every other one discarded, to wake zeroed (``"zero"``,
    the default), filled (``"fill:VALUE"``) or as the new memory is
    (``"undefined"``).  `keep`, `offload` and `discard` override the
    contract of the buffers they name for this sleep (a discarded
    ``"keep"`` or ``"offload"`` buffer wakes zeroed).  With `tags`, only
    those classes (``BufferSpec(tag=...)``; ``"torch"``: the pool) sleep;
    the others stay awake, their memory, views and bytes untouched, and
    each class wakes apart (``wake(tags=...)``).  Without, every class
    still awake sleeps.

    The device's pending work is waited for.  The buffers offloaded
    move to host memory mapped at their own addresses: their
    views (and every tensor made from them) stay valid, and work that
    touches only them (a CUDA graph replay) runs while the arena sleeps,
    over the host link.  The buffers kept are copied to host memory
    (pinned on CUDA) for `wake` to copy back.  Every other buffer is
    discarded: its addresses are unmapped.  Then every device chunk of the
    classes put to sleep is unmapped and released (no two classes' buffers
    share a granule: each class sleeps alone).  The host memory of both is
    made by the first sleep that needs it and reused by the next ones
    (`release` frees it).  Accessors keep returning the same pointers.
    While a class of buffers sleeps, the arena's operations (zeroing, step
    inputs, checksums) and new views of the sleeping buffers raise
    MetraleError; views of the awake classes' buffers can still be made,
    and a guard (`guard`) tells a pass whether a class it touches sleeps.
    `resize` of an arena asleep whole sets the limits `wake` maps for (of
    one partly asleep it raises).  `release` of a sleeping arena frees
    everything.

    The arena's pool (`open_pool`), the class ``"torch"``, sleeps with the
    buffers in the same pipeline (or alone: ``tags=["torch"]``): its memory
    is unmapped and its segments keep their addresses; their contents go
    as its contract says (``open_pool(wake=...)``: discarded to wake zeroed
    by default), or, with ``"torch"`` in `offload` (or a pool of contract
    ``"offload"`` and no ``"torch"`` in `discard`), are moved to host
    memory mapped at their own addresses as an offloaded buffer's are
    (tensors in the pool stay readable, graphs captured into it replay
    after `wake` without refilling them).  No segment can be taken from
    the moment the sleep begins until the pool wakes (torch's allocation is
    refused).  Discarded segments have no memory while the pool sleeps:
    nothing may touch them until it wakes.

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
    tags : str or iterable of str, optional
        The classes to put to sleep, each awake now (``"torch"``: the
        pool); None: every class awake now.  The buffers named above must
        be of these classes.

    Raises
    ------
    TypeError, ValueError
        `keep`, `offload`, `discard` or `tags` holds something other than a
        buffer name or a class of the arena (or ``"torch"`` for an arena
        with no pool), a buffer is in two of them, or one is of a class
        `tags` leaves out.
    BufferError
        A view of a buffer put to sleep, not offloaded, is alive; nothing
        changed.
    OutOfMemoryError
        Host memory could not be had; nothing changed.
    MetraleError
        The arena has no reservation or is released; every class (of
        `tags`: one of them, or the class of a buffer named) already
        sleeps; or the backend failed: a copy (nothing changed); mapping
        host memory at the buffers' or the pool's addresses (the classes
        are awake again, their kept and offloaded bytes restored, the
        others' as their contracts give them); a handle's release (they
        sleep; the handle is released again later); an unmap (they sleep
        with that chunk still mapped, `wake` works; on a backend that maps
        only where nothing is mapped, CUDA, a chunk under offloaded host
        memory wakes them again as for a failed mapping).
    """
    cdef ArenaState a = self
    cdef Backend be = a._gpu
    cdef Reservation r
    cdef SleepState st
    cdef Pool pool = None
    cdef Lane pooled = None
    cdef uint64_t want, seen, classes
    cdef int k
    reserved(a, "sleep")
    st = a._sleep_state
    want = _tags(a, tags, "sleep")
    named = _named(a, keep, offload, discard, want)
    seen = st.asleep
    classes = want if tags is not None else want & ~seen
    ids, off, pool_off = _contracts(a, named, classes)
    # views of the classes left awake, and of the buffers offloaded, stay
    begin(a, "sleep", off + st.ids_of(~classes))
    r = a._reservation
    try:
        _acting(a, st, seen, want, classes, tags is None, named, "sleep")
        be.quiesce()
        _host_for(a, r, st, off, ids)
        sids = st.ids_of(classes)
        moved = {i: a._layout.size[i] for i in off if a._layout.size[i]}
        copied = {i: a._layout.size[i] for i in ids if a._layout.size[i]}
        need = r.needed(&a._layout)
        lanes, spans = [], []
        for k in _bits(classes & st.classes):
            kid = [i for i in sids if st.rec[i].cls == k]
            moves = [(a._layout.offset[i], moved[i]) for i in kid if i in moved]
            keeps = [(a._layout.offset[i], copied[i], st.rec[i].host) for i in kid if i in copied]
            lanes.append(lane_new(st.offloads[k], r.part(k), a._base, moves, keeps, need))
            spans += moves + [(o, n) for o, n, _h in keeps]
        if classes >> TORCH_CLASS & 1:
            pool = a._pool
            pooled = pool.sleep_lane(pool_off)      # no segment taken from here on
            lanes.append(pooled)
        st.set_fates(sids, moved, copied)
        try:
            sleep_lanes(be, lanes, _fresh(a, spans, None, sids))
        finally:
            if pool is not None:
                pool.settled(pooled)
            # asleep, or (a failed copy or mapping) awake again: every lane alike
            _settle(a, st, seen | classes if (<Lane>lanes[0]).asleep else seen)
    finally:
        mt_life_reshape_end(a._life, sleeping(a))    # paused while a class sleeps
    return None


@cython.binding(True)
def prepare_sleep(ArenaState self, keep=(), offload=(), discard=(), tags=None):
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
    keep, offload, discard, tags : optional
        As `sleep` takes them, over the buffers' contracts (``"torch"``,
        the pool, allocates nothing ahead: its segments' host memory is
        made by the sleep); the classes must be awake.

    Returns
    -------
    int
        Bytes of host memory held for sleeps after this call (the kept
        copies' and the offloads', of every class).

    Raises
    ------
    ValueError, TypeError
        As `sleep`, for the names.
    OutOfMemoryError
        The host memory was refused; the arena is as it was, but offload
        host memory an earlier call made may have been given back (a
        larger offload replaces it whole): the next sleep makes it again.
    MetraleError
        The arena is not reserved, is shared, is released or in a reshape
        on another thread, or a class it would prepare sleeps.
    """
    cdef ArenaState a = self
    cdef Reservation r
    cdef SleepState st
    cdef uint64_t want, seen, classes
    reserved(a, "prepare_sleep")
    st = a._sleep_state
    want = _tags(a, tags, "prepare_sleep")
    named = _named(a, keep, offload, discard, want)
    seen = st.asleep
    classes = want if tags is not None else want & ~seen
    ids, off, _pool_off = _contracts(a, named, classes)
    begin(a, "prepare_sleep", list(range(len(a._buffers))))    # views stay: nothing moves
    r = a._reservation
    try:
        _acting(a, st, seen, want, classes, tags is None, named, "prepare_sleep")
        _host_for(a, r, st, off, ids)
        return st.host_keep_bytes() + st.host_offload_bytes()
    finally:
        mt_life_reshape_end(a._life, sleeping(a))


@cython.binding(True)
def wake(ArenaState self, tags=None):
    """Map device memory again at the same addresses after `sleep`.

    Gives each buffer what its wake contract says: copies back the buffers
    `sleep` offloaded (their host memory taken down from their addresses
    range by range: views of them stay valid) and those it kept (after a
    resize while asleep, up to the buffer's new size, the rest as its
    contract gives it);
    zeroes every other buffer (in as few launches of the range kernel as
    hold them), fills the ``"fill:VALUE"`` buffers and leaves the
    ``"undefined"`` ones as the new memory is.  The pool's segments are
    mapped again in the same pipeline, their contents copied back if the
    sleep offloaded them, else zeroed (or, for a pool opened with
    ``wake="undefined"``, left as the new memory is).  With `tags`, only
    those classes wake; the others sleep on.  Each class that wakes counts
    one more in its epoch (``Guard.epochs``).  A CUDA graph captured before
    the sleep replays bit-identically afterwards.  The device's work
    queued before the call is waited for; while it runs, offloaded memory
    is read safely from another thread only where the backend maps memory
    over memory (the host backend: device memory already holding the bytes
    replaces the host memory in one step); on CUDA start work that touches
    it after `wake` returns (as for `sleep`).

    Parameters
    ----------
    tags : str or iterable of str, optional
        The classes to wake, each asleep now (``"torch"``: the pool);
        None: every class asleep.

    Raises
    ------
    TypeError, ValueError
        `tags` holds something other than a class of the arena.
    OutOfMemoryError
        Physical memory was refused; the classes still sleep (wake again
        later).
    MetraleError
        The arena has no reservation, is released, or no class (of `tags`:
        one of them) sleeps; or the backend failed: the classes then still
        sleep.
    """
    cdef ArenaState a = self
    cdef SleepState st
    cdef Reservation r
    cdef Pool pool = None
    cdef Lane pooled = None
    cdef uint64_t want, seen, classes
    cdef int k
    reserved(a, "wake")
    st = a._sleep_state
    want = _tags(a, tags, "wake")
    seen = st.asleep
    classes = want if tags is not None else want & seen
    # every live view is of a class awake or of a buffer offloaded: all stay
    begin(a, "wake", list(range(a._layout.n)))
    try:
        _acting(a, st, seen, want, classes, tags is None, None, "wake")
        r = a._reservation
        wids = st.ids_of(classes)
        need = r.needed(&a._layout)
        lanes, spans = [], []
        for k in _bits(classes & st.classes):
            moves, keeps = st.to_move(&a._layout, [i for i in wids if st.rec[i].cls == k])
            lanes.append(lane_new(st.offloads[k], r.part(k), a._base, moves, keeps, need))
            spans += moves + [(o, n) for o, n, _h in keeps]
        if classes >> TORCH_CLASS & 1:
            pool = a._pool
            pooled = pool.wake_lane()
            lanes.append(pooled)
        try:
            wake_lanes(a._gpu, lanes, _fresh(a, spans, pooled, wids))
        finally:
            if pool is not None:
                pool.settled(pooled)
        _settle(a, st, seen & ~classes)
        st.set_fates(wids, {}, {})
        r.trim(&a._layout, a._base)     # what a failed sleep left, and the limits no longer need
    finally:
        mt_life_reshape_end(a._life, sleeping(a))    # paused while a class sleeps
    return None


# -- classes ------------------------------------------------------------------------------

cdef uint64_t _tags(ArenaState a, object tags, str what) except? 0:
    """The classes `tags` names, as a mask (None: every class, and the
    pool's where there is one).  Only str items are compared: no user code
    runs."""
    cdef uint64_t mask = 0
    order = list(a._buffers.classes)
    if tags is None:
        return ((<uint64_t>1 << len(order)) - 1) | \
            ((<uint64_t>1 << TORCH_CLASS) if a._pool is not None else 0)
    if isinstance(tags, str):
        tags = (tags,)
    try:
        tags = list(tags)
    except TypeError:
        raise TypeError(f"{what}: tags must be a class name or an iterable of them, got "
                        f"{type(tags).__name__}") from None
    if not tags:
        raise ValueError(f"{what}: tags is empty (None: every class)")
    for k, t in enumerate(tags):
        if type(t) is not str:
            raise TypeError(f"{what}: tags[{k}] must be a str, got {type(t).__name__}")
        if <str>t == _POOL_NAME:
            if a._pool is None:
                raise ValueError(f"{what}: tags: {_POOL_NAME!r} is the arena's pool, and it has "
                                 "none (open_pool)")
            mask |= <uint64_t>1 << TORCH_CLASS
        elif t in order:
            mask |= <uint64_t>1 << order.index(t)
        else:
            raise ValueError(f"{what}: tags: {t!r} is not a class of the arena "
                             f"({', '.join(order + ([_POOL_NAME] if a._pool is not None else []))})")
    return mask


cdef list _bits(uint64_t mask):
    return [k for k in range(64) if mask >> k & 1]


cdef str _class_names(ArenaState a, uint64_t mask):
    order = list(a._buffers.classes)
    return ", ".join(_POOL_NAME if k == TORCH_CLASS else order[k] for k in _bits(mask))


cdef int _acting(ArenaState a, SleepState st, uint64_t seen, uint64_t want, uint64_t classes,
                 bint every, tuple named, str what) except -1:
    """Refuse, inside the reshape, a sleep (`named`: its buffers, else a
    wake) of `classes` that the state does not allow: the classes changed
    since they were read; nothing to do; a class named already asleep
    (awake); a buffer named of a class already asleep."""
    cdef bint waking = what == "wake"
    if st.asleep != seen:
        raise MetraleError(f"{what}: another thread's sleep or wake ran meanwhile; call again")
    if not classes:
        raise MetraleError(f"{what}: the buffer arena is "
                           f"{'not sleeping' if waking else 'already sleeping'}")
    if not every:
        wrong = want & ~seen if waking else want & seen
        if wrong:
            raise MetraleError(f"{what}: {_class_names(a, wrong)} "
                               f"{'is not sleeping' if waking else 'already sleeps'}")
    if named is not None:
        late = [a._buffers.names[i] for xs in named[:3] for i in xs
                if seen >> st.rec[<int>i].cls & 1]
        if late:
            raise MetraleError(f"{what}: {', '.join(late)}: of a class already asleep")
        if (named[3] or named[4]) and seen >> TORCH_CLASS & 1:
            raise MetraleError(f"{what}: {_POOL_NAME!r}: the pool already sleeps")
    return 0


cdef int _settle(ArenaState a, SleepState st, uint64_t now) except -1:
    """The classes asleep now (epochs counted), each buffer's slot of the
    lifetime word marked with its class: the word, paused while a class
    sleeps, refuses new views of those buffers only."""
    cdef int i
    st.settle_classes(now)
    for i in range(st.n):
        mt_life_set_asleep(a._life, i, <int>(now >> st.rec[i].cls & 1))
    return 0


cdef int _host_for(ArenaState a, Reservation r, SleepState st, list off, list ids) except -1:
    """The host memory a sleep keeping `ids` and offloading `off` copies into
    (made where it is missing: the first time, or grown), each class's
    offloads in its own."""
    cdef Offload o
    if (off or ids) and not r.piece:
        # From the next wake on, device memory in the host memory's pieces:
        # a sleep unmaps each one as soon as its copy is done (mapping the
        # host memory at its addresses), while the next ones are still being
        # copied.
        r.piece = (<Offload>st.offloads[0]).piece
    for k in sorted({st.rec[<int>i].cls for i in off}):
        o = st.offloads[k]
        o.host_memory(granule_runs([(a._layout.offset[i], a._layout.size[i]) for i in off
                                    if st.rec[<int>i].cls == k], r.granule))
    st.keep_copies(&a._layout, ids)
    return 0


cdef tuple _named(ArenaState a, object keep, object offload, object discard, uint64_t want):
    """`sleep`'s and `prepare_sleep`'s names, converted and checked before
    any state changes: (kept ids, offloaded ids, discarded ids, whether the
    pool is offloaded, whether it is discarded), each buffer of a class in
    `want` and in one of them only."""
    cdef SleepState st = a._sleep_state
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
    for what, xs in (("keep", ids), ("offload", off), ("discard", gone)):
        out = [a._buffers.names[i] for i in xs if not (want >> st.rec[<int>i].cls & 1)]
        if out:
            raise ValueError(f"{what}: {', '.join(out)}: of a class that tags leaves out")
    if (pool_off or pool_gone) and not (want >> TORCH_CLASS & 1):
        raise ValueError(f"{'offload' if pool_off else 'discard'}: {_POOL_NAME!r}: tags leaves "
                         "the pool out")
    return ids, off, gone, pool_off, pool_gone


cdef tuple _contracts(ArenaState a, tuple named, uint64_t classes):
    """The buffers a sleep of `classes` keeps and offloads, and whether it
    offloads the pool: those `named`, and each other buffer of those
    classes as its wake contract says."""
    cdef SleepState st = a._sleep_state
    ids, off, gone, pool_off, pool_gone = named
    taken = set(ids) | set(off) | set(gone)
    groups = a._buffers.groups

    def by_contract(str group):
        return [i for i in (a._index[n] for n in groups[group])
                if i not in taken and classes >> st.rec[<int>i].cls & 1]
    ids = sorted(set(ids).union(by_contract("wake_keep")))
    off = sorted(set(off).union(by_contract("wake_offload")))
    pool_off = pool_off or (classes >> TORCH_CLASS & 1 and not pool_gone
                            and a._pool.wake == "offload")
    return ids, off, bool(pool_off)


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


# -- what a woken arena's new memory starts with --------------------------------------------

cdef object _fresh(ArenaState a, list spans, Lane pooled, list ids):
    """After the lanes' memory is back (woken, or a failed sleep undone): what
    a new arena holds, each of buffers `ids` as its contract gives it but for
    the bytes copied back (`spans`, (offset, bytes)); and with the wake's pool lane, of
    a pool whose contract is not "undefined", its segments but for the bytes
    copied back (a failed sleep leaves the pool's bytes as the failure left them:
    intact where their memory stayed, undefined where it was given back)."""
    def after():
        wake_fresh(a, spans, ids)
        if pooled is not None and (<Pool>pooled.owner).wake != "undefined":
            back = [(o, o + n) for o, n in pooled.moves]
            zero_spans(a._gpu, pooled.base, [part for o, n in pooled.need
                                             for part in outside(o, o + n, back)],
                       (<Pool>pooled.owner).granule)
    return after
