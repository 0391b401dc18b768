# cython: language_level=3, binding=False
"""Reserved memory of a BufferArena (docs/stable-addresses.md): building it,
the reshape protocol (`begin`), resize and trim; sleep and wake, the other
reshapes, are _sleep.pyx's.  Its state, the physical chunks, is the arena's
Reservation (_reservation.pyx).

The arena is one virtual reservation; each buffer a granularity-aligned
sub-range sized for the reserved limits (the C core's reserved layout).
BufferArena binds `resize`, `trim`, `committed_bytes`, `is_reserved` and
`is_sleeping` from here.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memset

from metrale._arena._arena_state cimport ArenaState, sleeping
from metrale._arena._fresh cimport init_fresh
from metrale._arena._offload cimport Offload
from metrale._backends._backend cimport Backend
from metrale._base._common cimport index_arg, limit_arg, limit_tuple, logger, u64_arg
from metrale._base._core cimport (
    MT_ERR_OVERFLOW, MT_LIFE_EXPORTED, MT_LIFE_OK, MT_MAX_BUFFERS, MT_OK,
    MT_WAIT_OPERATIONS, mt_layout_base, mt_layout_plan_reserved, mt_layout_resize)
from metrale._base._life cimport (
    mt_life_exports, mt_life_reshape_begin, mt_life_reshape_end, raise_life, wait_life)
from metrale._arena._debug cimport refill_guards
from metrale._sizing._layout cimport table_into
from metrale._arena._reservation cimport Reservation, reservation_new
from metrale._arena._sleep_state cimport sleep_state_new

from metrale._base.errors import MetraleError, OutOfMemoryError
from metrale._sizing.sizes import BufferSizes, DecodeMetaLayout

cdef tuple _LIMITS = ("max_batch_tokens", "max_seq_len", "kv_block_size", "max_batch_size")


# -- building ---------------------------------------------------------------------------

cdef int build(ArenaState a, object sizes, object top_sizes, bint shareable) except -1:
    """Lay `a` out for `sizes` inside a reservation sized for `top_sizes`,
    reserve it and map what `sizes` need (exportable chunks when
    `shareable`); on failure nothing is left."""
    cdef uint64_t cur[MT_MAX_BUFFERS]
    cdef uint64_t top[MT_MAX_BUFFERS]
    cdef uintptr_t base = 0
    cdef Backend be = a._gpu
    cdef Reservation r
    cdef int rc, i
    if not isinstance(top_sizes, BufferSizes) or top_sizes.buffers != sizes.buffers:
        raise TypeError(f"reserve_sizes must be a BufferSizes of the same buffer set, got "
                        f"{type(top_sizes).__name__}")
    names, values, tops = sizes.buffers.names, sizes.as_tuple(), top_sizes.as_tuple()
    for i in range(len(values)):
        if values[i] > tops[i]:
            raise ValueError(f"{names[i]}: {values[i]} bytes exceed its reserved "
                             f"{tops[i]} bytes")
        cur[i] = values[i]
        top[i] = tops[i]
    r = reservation_new(be, shareable, top_sizes,
                        limit_tuple(top_sizes.limits) if top_sizes.limits is not None else None)
    table_into(&a._layout, sizes.buffers)
    rc = mt_layout_plan_reserved(&a._layout, cur, top, u64_arg(a._max_tokens, "max_batch_tokens", 1),
                                 r.granule, a._debug.guard_bytes if a._debug is not None else 0)
    if rc == MT_ERR_OVERFLOW:
        raise ValueError("the reservation of these sizes exceeds 2^64 - 1 bytes")
    if rc != MT_OK:
        raise ValueError(f"granularity {r.granule} of {be!r} is not a power of two >= 256")
    order = list(a._buffers.classes)
    cls = [order.index(a._buffers[n].tag) for n in names]
    r.classify(&a._layout, cls, names)
    a._reservation = r
    a._sleep_state = sleep_state_new(be, a._layout.n, a._layout.slab_bytes, cls)
    if any(a._buffers[n].wake == "offload" for n in names):
        # Mapped in the pieces its offloading sleep moves (what its first sleep
        # sets for the wakes after it): the first sleep pipelines as the later
        # ones, and an export's chunks are mapped while the first ones copy.
        r.piece = (<Offload>a._sleep_state.offloads[0]).piece
    a._set_bytes(values)
    if a._layout.slab_bytes:
        try:
            be.reserve(a._layout.slab_bytes, &base)
        except OutOfMemoryError as e:
            raise OutOfMemoryError(f"buffer arena: cannot reserve {a._layout.slab_bytes} bytes "
                                   f"of address space: {e}") from e
        a._alloc = base
        a._base = mt_layout_base(&a._layout, base)
        r.place(a._alloc, a._base, a._layout.slab_bytes)
        try:
            r.commit(&a._layout, a._base)
            zero_fresh(a)
            refill_guards(a)
        except BaseException:
            r.close()
            if not r.alloc:
                a._base = a._alloc = 0
            raise
    a._set_ptrs(a._pointers(True))
    logger().info("buffer arena for max_batch_tokens=%d: %.1f MiB mapped of a %.1f MiB "
                  "reservation (total_bytes() %.1f MiB; %d buffers)", a._max_tokens,
                  r.committed() / 1048576.0, a._layout.slab_bytes / 1048576.0,
                  sizes.total_bytes() / 1048576.0, len(sizes))
    return 0


cdef int zero_fresh(ArenaState a) except -1:
    """Zero the init_zero buffers (norm_unit_w) and fill the fill buffers, and
    wait: what a new arena, or a grown one, starts from (a woken arena's is
    _fresh.wake_fresh, which spares the bytes the wake copies back)."""
    init_fresh(a)
    return 0


@cython.binding(True)
def committed_bytes(ArenaState self):
    """Bytes of physical memory backing the arena now.

    For an unreserved arena the slab (0 once freed); for a reserved one the
    mapped chunks: each buffer's size at the current limits rounded up to
    the allocation granularity, plus what a shrink kept of the chunks
    still partly needed (a chunk is unmapped only whole; `trim` gives it
    back); 0 while sleeping or once released.

    Returns
    -------
    int
    """
    if self._reservation is not None:
        return self._reservation.committed()
    return self._layout.slab_bytes if self._base else 0


@cython.binding(True)
def is_reserved(ArenaState self):
    """Whether the arena was built with a reservation (stable addresses).

    Returns
    -------
    bool
    """
    return self._reservation is not None


@cython.binding(True)
def is_sleeping(ArenaState self):
    """Whether `sleep` has given the memory of a class of the arena's buffers back
    (``memory_stats()["classes_asleep"]`` names them).

    Returns
    -------
    bool
    """
    return sleeping(self)


# -- reshapes -------------------------------------------------------------------------------

cdef int reserved(ArenaState a, str what) except -1:
    if a._reservation is None:
        raise MetraleError(f"{what}: the arena has no reservation (build it with reserve=...)")
    return 0


cdef int begin(ArenaState a, str what, object views_ok=None) except -1:
    """Start a reshape: refused (nothing changed) unless the arena is
    reserved, not shared, and nothing else holds it (live views only of the
    buffers in `views_ok`, ids whose memory the reshape leaves in place);
    then wait for the operations in flight.  Every argument is converted
    before this: no user code runs while a reshape holds the arena."""
    cdef unsigned char ok[MT_MAX_BUFFERS]
    cdef unsigned char *okp = NULL
    reserved(a, what)
    if a._peers is not None:
        pins = ", ".join(f"{p.kind}: {p.count}" for p in a.pins() if p.kind != "view")
        raise MetraleError(f"{what}: the arena is shared with its tensor-parallel peers"
                           f"{f' ({pins})' if pins else ''}, "
                           "whose mappings keep its pages and would go stale; release it and "
                           "build it again on every rank (docs/tensor-parallel.md)")
    if views_ok is not None:
        memset(ok, 0, sizeof(ok))
        for i in views_ok:
            ok[<int>i] = 1
        okp = ok
    rc = mt_life_reshape_begin(a._life, okp)
    if rc == MT_LIFE_EXPORTED and what == "wake" and not sleeping(a):
        # a live view means it is awake: say that, not BufferError
        raise MetraleError("wake: the buffer arena is not sleeping")
    if rc == MT_LIFE_EXPORTED and views_ok is not None:
        names = a._buffers.names
        held = ", ".join(f"{names[i]} ({mt_life_exports(a._life, i)})" for i in range(len(names))
                         if mt_life_exports(a._life, i) and i not in views_ok)
        raise BufferError(f"{what}: views of buffers whose memory it gives back or moves are "
                          f"alive: {held or 'being dropped right now'}; drop them first "
                          "(views of offloaded buffers, and of buffers a resize does not "
                          "shrink, may stay: docs/stable-addresses.md)")
    if rc != MT_LIFE_OK:
        raise_life(rc, "the buffer arena", what, a._exported())
    try:
        wait_life(a._life, MT_WAIT_OPERATIONS)
    except BaseException:       # interrupted: as if it had not begun
        mt_life_reshape_end(a._life, sleeping(a))
        raise
    a._reservation.retry()
    return 0


@cython.binding(True)
def resize(ArenaState self, max_batch_tokens=None, max_seq_len=None, kv_block_size=None,
           max_batch_size=None, *, sizes=None):
    """Change the limits of a reserved arena without moving a pointer.

    Growing maps physical memory at the tail of each buffer that grew
    (first, so that a refused mapping leaves the arena as it was);
    then the chunks no buffer needs any more are unmapped and released.
    Every pointer stays where it is; `sizes`, the ``*_bytes``
    accessors, `buffers` and the zeroing helpers follow the new limits.
    A CUDA graph captured before a growth replays correctly after it.
    Views of buffers the resize does not shrink stay valid (a view of
    one it shrinks refuses it).  The device's pending work is waited for
    before anything is unmapped.

    What stays mapped after a shrink: every chunk (one physical handle,
    mapped as one range when the memory was mapped) of which any granule
    is still needed, whole, with its bytes; only the chunks no buffer
    touches any more go.  A shrink back from a growth therefore gives
    back exactly the growth (its chunks are the tails), while an arena
    shrunk below the limits it was built at keeps its first chunks:
    `trim` gives that memory back (copying the bytes still needed into
    new chunks of just the needed granules).  On a sleeping arena resize
    only sets the limits, and `wake` maps exactly what they need.
    Other threads' operations on the arena are waited for; those that
    start meanwhile raise MetraleError.

    Parameters
    ----------
    max_batch_tokens, max_seq_len, kv_block_size, max_batch_size : int, optional
        The new limits; None keeps the current one.  Each must be <= its
        reserved limit.
    sizes : BufferSizes, optional
        For an arena built by `from_sizes`: the new sizes (each <= its
        reserved size); then only `max_batch_tokens` and
        `max_batch_size` may be given with it.

    Raises
    ------
    ValueError
        A limit above its reserved limit (named), or a size above its
        reserved size.
    TypeError
        Both limits and `sizes` given, or a wrong type.
    BufferError
        A view of a buffer the resize shrinks is alive; nothing changed.
    OutOfMemoryError
        A physical allocation or mapping was refused; the arena is as
        before.
    MetraleError
        The arena has no reservation or is released, or the backend
        failed.
    """
    cdef uint64_t cur[MT_MAX_BUFFERS]
    cdef uint64_t old[MT_MAX_BUFFERS]
    cdef ArenaState a = self
    cdef Reservation r = a._reservation
    cdef int i, n = a._layout.n
    if r is None:
        raise MetraleError("resize: the arena has no reservation (build it with reserve=...)")
    if sizes is not None:
        if max_seq_len is not None or kv_block_size is not None:
            raise TypeError("resize: give either limits or sizes= (with max_batch_tokens "
                            "and max_batch_size), not both")
        if not isinstance(sizes, BufferSizes):
            raise TypeError(f"sizes must be a BufferSizes, got {type(sizes).__name__}")
        if sizes.buffers != a._buffers:
            raise ValueError("resize: sizes are for another buffer set than the arena's")
        lim = sizes.limits
        if lim is not None:         # limits recorded: derived, and a mismatch refused
            if lim.tp_size != a._tp:
                raise ValueError(f"resize: sizes for tp_size={lim.tp_size}, the arena's are "
                                 f"for tp_size={a._tp}")
            mbt = limit_arg(max_batch_tokens, "max_batch_tokens", 1, lim)
            mbs = limit_arg(max_batch_size, "max_batch_size", 0, lim)
            limits = limit_tuple(lim)
        else:
            mbt = a._max_tokens if max_batch_tokens is None else \
                index_arg(max_batch_tokens, "max_batch_tokens", 1)
            mbs = a._max_seqs if max_batch_size is None else index_arg(max_batch_size, "max_batch_size")
            limits = None
        new_sizes = sizes
    else:
        if a._model is None:
            raise MetraleError("resize: this arena was built by from_sizes; pass sizes=")
        given = (max_batch_tokens, max_seq_len, kv_block_size, max_batch_size)
        if a._limits is None and None in given:
            raise TypeError("resize: the current limits are unknown (the last resize was "
                            "given sizes= that record none): give all four")
        limits = tuple(a._limits[k] if given[k] is None else
                       index_arg(given[k], _LIMITS[k], 1 if k in (0, 3) else 0) for k in range(4))
        for k in range(4):
            if limits[k] > r.top_limits[k]:
                raise ValueError(f"resize: {_LIMITS[k]}={limits[k]} exceeds the reserved "
                                 f"{_LIMITS[k]}={r.top_limits[k]}")
        mbt, mbs = limits[0], limits[3]
        new_sizes = BufferSizes.from_config(a._model, *limits, target=a._gpu.target(),
                                            env=a._sizes.levers(), tp_size=a._tp,
                                            buffers=a._buffers)
    decode_meta = DecodeMetaLayout.for_max_batch_size(mbs)
    names, values, tops = a._buffers.names, new_sizes.as_tuple(), r.top_sizes.as_tuple()
    for i in range(n):
        if values[i] > tops[i]:
            raise ValueError(f"resize: {names[i]} needs {values[i]} bytes, above "
                             f"its reserved {tops[i]} bytes")
        cur[i] = values[i]
    # a view of a buffer that keeps at least its size keeps its memory
    begin(a, "resize", [i for i in range(n) if cur[i] >= a._layout.size[i]])
    try:
        if sleeping(a) and not a._sleep_state.all_asleep():
            raise MetraleError("resize: some classes of the arena sleep and others are awake; "
                               "wake them, or put the others to sleep, first")
        for i in range(n):
            old[i] = a._layout.size[i]
        old_mbt = a._layout.max_batch_tokens
        init_grew = False
        for x in a._buffers.groups["init_zero"] + a._buffers.groups["wake_fill"]:
            i = a._index[x]
            init_grew = init_grew or cur[i] > old[i]
        if mt_layout_resize(&a._layout, cur, mbt, r.granule) != MT_OK:
            raise ValueError("resize: a size exceeds its reserved room")
        if not sleeping(a):         # asleep: wake maps for the new limits
            try:
                r.commit(&a._layout, a._base)   # grow first: on failure the arena is as before
                if init_grew:
                    zero_fresh(a)
                refill_guards(a)    # the bands after the buffers' new ends
            except BaseException:
                mt_layout_resize(&a._layout, old, old_mbt, r.granule)
                try:
                    r.trim(&a._layout, a._base)     # what the growth mapped goes back too
                except Exception as e:
                    logger().warning("buffer arena: unmapping after a failed resize failed: %s", e)
                raise
        a._sizes = new_sizes
        a._set_bytes(values)
        a._max_tokens = mbt
        a._decode_meta = decode_meta
        a._max_seqs = mbs
        r.reshapes += 1
        a._moe_cache = {}
        a._limits = limits          # None for sizes that record none
        if not sleeping(a):
            r.trim(&a._layout, a._base)     # then give back what is no longer needed
    finally:
        mt_life_reshape_end(a._life, sleeping(a))    # paused while it sleeps
    return None


@cython.binding(True)
def trim(ArenaState self):
    """Give back the physical memory the current limits do not need.

    After a shrink (`resize`) the chunks still partly needed stay mapped
    whole: an arena built at larger limits keeps them.  `trim` replaces
    each such chunk by new physical memory for just the granules the
    current sizes need (each buffer's size rounded up to the allocation
    granularity, with its guard band on a debug arena), copying those bytes
    through host memory (pinned on CUDA), and unmaps the chunks no buffer
    needs at all; afterwards `committed_bytes` is exactly what the limits
    need, as after `sleep`, `resize`, `wake`.  Every pointer stays where it
    is and every buffer keeps its bytes, so views and CUDA graphs stay
    valid; the bytes past a buffer's current size are not kept.  While it
    runs, physical memory grows by the needed part of the chunks it
    replaces (the old ones go last), and nothing may touch the arena's
    memory (through views, tensors or kernels): the device's pending work
    is waited for first, other threads' operations on the arena are waited
    for, and those that start meanwhile raise MetraleError.  An arena with
    nothing to give back is left alone (no backend call).  A sleeping arena
    holds nothing trim could give back (`wake` maps exactly what the limits
    need): it returns 0.  The arena's pool (`open_pool`) is not touched.

    Returns
    -------
    int
        The bytes given back (``committed_bytes`` before minus after).

    Raises
    ------
    OutOfMemoryError
        The host copy, a physical allocation or a mapping was refused; the
        arena is as before (its chunks, its bytes, nothing leaked).
    MetraleError
        The arena has no reservation, is released, is shared with
        tensor-parallel peers, or is called from inside one of its
        operations; or the backend failed: a copy or an unmap before the
        swap leaves the arena as before; a handle whose release is refused
        afterwards is kept and released again later (the arena is trimmed).
    """
    cdef ArenaState a = self
    cdef Reservation r = a._reservation
    if r is None:
        raise MetraleError("trim: the arena has no reservation (build it with reserve=...)")
    # every view stays valid: no address moves and the bytes are copied back
    begin(a, "trim", range(a._layout.n))
    try:
        if sleeping(a):
            return 0
        before = r.committed()
        r.refit(&a._layout, a._base)
        return before - r.committed()
    finally:
        mt_life_reshape_end(a._life, sleeping(a))
