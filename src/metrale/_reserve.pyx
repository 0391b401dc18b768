# cython: language_level=3, binding=False
"""Reserved memory of a BufferArena (docs/stable-addresses.md): building it,
committing and trimming physical chunks, and the three reshapes (resize,
sleep, wake) that change what backs the reservation while every pointer
stays where it is.

The arena is one virtual reservation; each buffer a granularity-aligned
sub-range sized for the reserved limits (the C core's reserved layout).
Physical memory is mapped only for the current sizes, one handle per run of
adjacent missing granules; a chunk is unmapped only whole.  BufferArena
forwards `resize`, `sleep`, `wake` and `committed_bytes` here.
"""

from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from metrale._arena cimport BufferArena, init_zero
from metrale._backend cimport Backend
from metrale._common cimport buffer_ids, index_arg, limit_arg, limit_tuple, logger, u64_arg
from metrale._core cimport (
    MT_ERR_OVERFLOW, MT_IN_ZERO_ALL, MT_LIFE_EXPORTED, MT_LIFE_OK, MT_MAX_BUFFERS, MT_OK,
    MT_WAIT_OPERATIONS, mt_chunk_needed, mt_commit_gaps, mt_commit_needed, mt_group_ranges,
    mt_layout_base, mt_layout_plan_reserved, mt_layout_resize, mt_range)
from metrale._life cimport (
    mt_life_exports, mt_life_reshape_begin, mt_life_reshape_end, raise_life, wait_life)
from metrale._debug cimport refill_guards
from metrale._layout cimport table_into
from metrale._mapping cimport free_reservation, release_orphans, unmap_chunks

from metrale.errors import MetraleError, OutOfMemoryError
from metrale.sizes import BufferSizes, DecodeMetaLayout

cdef tuple _LIMITS = ("max_batch_tokens", "max_seq_len", "kv_block_size", "max_batch_size")


# -- building ---------------------------------------------------------------------------

cdef int build(BufferArena a, object sizes, object top_sizes) except -1:
    """Lay `a` out for `sizes` inside a reservation sized for `top_sizes`,
    reserve it and map what `sizes` need; on failure nothing is left."""
    cdef uint64_t cur[MT_MAX_BUFFERS]
    cdef uint64_t top[MT_MAX_BUFFERS]
    cdef uintptr_t base = 0
    cdef Backend be = a._gpu
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
    a._granule = be.granularity()
    table_into(&a._layout, sizes.buffers)
    rc = mt_layout_plan_reserved(&a._layout, cur, top, u64_arg(a._max_tokens, "max_batch_tokens", 1),
                                 a._granule, a._debug.guard_bytes if a._debug is not None else 0)
    if rc == MT_ERR_OVERFLOW:
        raise ValueError("the reservation of these sizes exceeds 2^64 - 1 bytes")
    if rc != MT_OK:
        raise ValueError(f"granularity {a._granule} of {be!r} is not a power of two >= 256")
    a._reserved = True
    a._top_sizes = top_sizes
    a._set_bytes(values)
    if a._layout.slab_bytes:
        try:
            be.reserve(a._layout.slab_bytes, &base)
        except OutOfMemoryError as e:
            raise OutOfMemoryError(f"buffer arena: cannot reserve {a._layout.slab_bytes} bytes "
                                   f"of address space: {e}") from e
        a._alloc = base
        a._base = mt_layout_base(&a._layout, base)
        try:
            commit(a)
            zero_fresh(a, False)
            refill_guards(a)
        except BaseException:
            err, freed = free_reservation(be, a._base, a._alloc, a._layout.slab_bytes, a._chunks,
                                          a._orphans, a._kept)
            if freed:
                a._base = a._alloc = 0
            raise
    a._set_ptrs(a._pointers(True))
    logger().info("buffer arena for max_batch_tokens=%d: %.1f MiB mapped of a %.1f MiB "
                  "reservation (total_bytes() %.1f MiB; %d buffers)", a._max_tokens,
                  committed(a) / 1048576.0, a._layout.slab_bytes / 1048576.0,
                  sizes.total_bytes() / 1048576.0, len(sizes))
    return 0


def _build(BufferArena a, sizes, top_sizes):
    """`build`, for BufferArena.from_sizes (which cannot cimport this module)."""
    build(a, sizes, top_sizes)


# -- physical memory ------------------------------------------------------------------------

cdef int commit(BufferArena a) except -1:
    """Map what the current sizes need and is not mapped: one physical handle
    per run of adjacent missing granules.  On failure the chunks this call
    mapped are unmapped again and the error propagates."""
    cdef mt_range need[MT_MAX_BUFFERS]
    cdef mt_range *have = NULL
    cdef mt_range *gaps = NULL
    cdef int nneed, nhave = len(a._chunks), ngaps, i
    cdef uint64_t h = 0
    cdef Backend be = a._gpu
    added = []
    nneed = mt_commit_needed(&a._layout, a._granule, need)
    have = <mt_range *>malloc((nhave + 1) * sizeof(mt_range))
    gaps = <mt_range *>malloc((nneed + nhave + 1) * sizeof(mt_range))
    try:
        if have == NULL or gaps == NULL:
            raise OutOfMemoryError("cannot allocate the arena's mapping bookkeeping")
        for i in range(nhave):
            have[i].offset = a._chunks[i][0]
            have[i].length = a._chunks[i][1]
        ngaps = mt_commit_gaps(need, nneed, have, nhave, gaps)
        pieces = []
        for i in range(ngaps):      # no chunk longer than _piece (0: any)
            lo, n = gaps[i].offset, gaps[i].length
            while a._piece and n > a._piece:
                pieces.append((lo, a._piece))
                lo, n = lo + a._piece, n - a._piece
            pieces.append((lo, n))
        try:
            for lo, n in pieces:
                if a._shareable:
                    be.create_exportable(n, &h)
                else:
                    be.create(n, &h)
                try:
                    be.map(a._base + lo, n, h)
                except BaseException:
                    be.release_handle(h, n)
                    raise
                added.append((lo, n, h))
        except BaseException:
            a._chunks.extend(added)
            unmap_chunks(be, a._base, added, a._chunks, a._orphans)
            raise
        a._chunks.extend(added)
        a._chunks.sort()
        a._peak = max(a._peak, committed(a))
    finally:
        free(have)
        free(gaps)
    return 0


cdef int trim(BufferArena a) except -1:
    """Unmap the chunks the current sizes no longer touch (the device's work
    waited for first)."""
    cdef mt_range need[MT_MAX_BUFFERS]
    cdef int nneed = mt_commit_needed(&a._layout, a._granule, need)
    idle = [c for c in a._chunks if not mt_chunk_needed(need, nneed, c[0], c[1])]
    if idle:
        a._gpu.quiesce()
        err = unmap_chunks(a._gpu, a._base, idle, a._chunks, a._orphans)
        if err is not None:
            raise err
    return 0


cdef int zero_fresh(BufferArena a, bint whole) except -1:
    """Zero the buffers filled with zeros at construction (norm_unit_w; and,
    when `whole`, the zero_all set, in one fused operation): what a new or
    woken arena starts from."""
    cdef mt_range r[MT_MAX_BUFFERS]
    cdef int n
    cdef Backend be = a._gpu
    if whole:
        n = mt_group_ranges(&a._layout, MT_IN_ZERO_ALL, r)
        if n:
            be.zero_ranges(a._base, r, n, 0)
    init_zero(a)
    be.sync(0)
    return 0


cdef uint64_t committed(BufferArena a):
    cdef uint64_t n = 0
    for c in a._chunks:
        n += <uint64_t>c[1]
    return n


def _arena_committed_bytes(BufferArena a):
    """Bytes of physical memory backing the arena now.

    For an unreserved arena the slab (0 once freed); for a reserved one the
    mapped chunks: each buffer's size at the current limits rounded up to
    the allocation granularity, plus any chunk a shrink kept because part
    of it is still needed (a chunk is unmapped only whole); 0 while
    sleeping or once released.

    Returns
    -------
    int
    """
    if a._reserved:
        return committed(a)
    return a._layout.slab_bytes if a._base else 0


def _arena_is_reserved(BufferArena a):
    """Whether the arena was built with a reservation (stable addresses).

    Returns
    -------
    bool
    """
    return bool(a._reserved)


def _arena_is_sleeping(BufferArena a):
    """Whether `sleep` has given the arena's physical memory back.

    Returns
    -------
    bool
    """
    return bool(a._sleeping)


# -- reshapes -------------------------------------------------------------------------------

cdef int begin(BufferArena a, str what, object views_ok=None) except -1:
    """Start a reshape: refused (nothing changed) unless the arena is
    reserved, not shared, and nothing else holds it (live views only of the
    buffers in `views_ok`, ids whose memory the reshape leaves in place);
    then wait for the operations in flight.  Every argument is converted
    before this: no user code runs while a reshape holds the arena."""
    cdef unsigned char ok[MT_MAX_BUFFERS]
    cdef unsigned char *okp = NULL
    if not a._reserved:
        raise MetraleError(f"{what}: the arena has no reservation (build it with reserve=...)")
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
    if rc == MT_LIFE_EXPORTED and what == "wake" and not a._sleeping:
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
        mt_life_reshape_end(a._life, a._sleeping)
        raise
    release_orphans(a._gpu, a._orphans)
    return 0


def _arena_resize(BufferArena a, max_batch_tokens=None, max_seq_len=None, kv_block_size=None,
                  max_batch_size=None, *, sizes=None):
    """Change the limits of a reserved arena without moving a pointer.

    Growing maps physical memory at the tail of each buffer that grew
    (first, so that a refused mapping leaves the arena as it was);
    then the chunks no buffer needs any more are unmapped and released.
    Every pointer stays where it is; `sizes`, the ``*_bytes``
    accessors, `buffers` and the zeroing helpers follow the new limits.
    A CUDA graph captured before a growth replays correctly after it.
    Views of buffers the resize does not shrink stay valid (a view of
    one it shrinks refuses it).  The device's pending work is waited for before anything is
    unmapped.  A chunk is unmapped only whole, so a shrink keeps the
    chunks still partly needed; on a sleeping arena resize only sets
    the limits, and `wake` maps exactly what they need (sleep, resize,
    wake gives back everything a shrink keeps).  Other threads'
    operations on the arena are waited for; those that start meanwhile
    raise MetraleError.

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
    cdef int i, n = a._layout.n
    if not a._reserved:
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
            if limits[k] > a._top_limits[k]:
                raise ValueError(f"resize: {_LIMITS[k]}={limits[k]} exceeds the reserved "
                                 f"{_LIMITS[k]}={a._top_limits[k]}")
        mbt, mbs = limits[0], limits[3]
        new_sizes = BufferSizes.from_config(a._model, *limits, target=a._gpu.target(),
                                            env=a._sizes.levers(), tp_size=a._tp,
                                            buffers=a._buffers)
    decode_meta = DecodeMetaLayout.for_max_batch_size(mbs)
    names, values, tops = a._buffers.names, new_sizes.as_tuple(), a._top_sizes.as_tuple()
    for i in range(n):
        if values[i] > tops[i]:
            raise ValueError(f"resize: {names[i]} needs {values[i]} bytes, above "
                             f"its reserved {tops[i]} bytes")
        cur[i] = values[i]
    # a view of a buffer that keeps at least its size keeps its memory
    begin(a, "resize", [i for i in range(n) if cur[i] >= a._layout.size[i]])
    try:
        for i in range(n):
            old[i] = a._layout.size[i]
        old_mbt = a._layout.max_batch_tokens
        init_grew = False
        for x in a._buffers.groups["init_zero"]:
            i = a._index[x]
            init_grew = init_grew or cur[i] > old[i]
        if mt_layout_resize(&a._layout, cur, mbt, a._granule) != MT_OK:
            raise ValueError("resize: a size exceeds its reserved room")
        if not a._sleeping:         # asleep: wake maps for the new limits
            try:
                commit(a)           # grow first: on failure the arena is as before
                if init_grew:
                    zero_fresh(a, False)
                refill_guards(a)    # the bands after the buffers' new ends
            except BaseException:
                mt_layout_resize(&a._layout, old, old_mbt, a._granule)
                try:
                    trim(a)         # what the growth mapped goes back too
                except Exception as e:
                    logger().warning("buffer arena: unmapping after a failed resize failed: %s", e)
                raise
        a._sizes = new_sizes
        a._set_bytes(values)
        a._max_tokens = mbt
        a._decode_meta = decode_meta
        a._max_seqs = mbs
        a._reshapes += 1
        a._moe_cache = {}
        a._limits = limits          # None for sizes that record none
        if not a._sleeping:
            trim(a)                 # then give back what is no longer needed
    finally:
        mt_life_reshape_end(a._life, a._sleeping)    # paused while it sleeps
    return None


def _arena_sleep(BufferArena a, keep=(), offload=()):
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

    Parameters
    ----------
    keep : iterable of str, optional
        Buffers whose contents `wake` restores (copied out and back).
    offload : iterable of str, optional
        Buffers moved to host memory at their own addresses for the sleep,
        and back to device memory by `wake`.

    Raises
    ------
    TypeError, ValueError
        `keep` or `offload` holds something other than a buffer name, or a
        buffer is in both.
    BufferError
        A view of a buffer not offloaded is alive; nothing changed.
    OutOfMemoryError
        Host memory could not be had; nothing changed.
    MetraleError
        The arena has no reservation, already sleeps or is released; or
        the backend failed: a copy (nothing changed), mapping the host
        memory at the buffers' addresses (the arena is awake again, its
        kept and offloaded buffers restored, the others' contents
        undefined), an unmap (the arena then sleeps with that chunk still
        mapped; `wake` works).
    """
    cdef Backend be = a._gpu
    cdef uint64_t n
    ids = buffer_ids(keep, "keep", a._buffers)
    off = buffer_ids(offload, "offload", a._buffers)
    both = [a._buffers.names[i] for i in ids if i in off]
    if both:
        raise ValueError(f"keep, offload: {', '.join(both)} in both (a buffer is kept or "
                         "offloaded)")
    begin(a, "sleep", off)
    try:
        if a._sleeping:
            raise MetraleError("sleep: the buffer arena is already sleeping")
        be.quiesce()
        if off and not a._piece:
            # Host memory, and from the next wake on device memory, in pieces
            # of an eighth of the slab: a sleep remaps each piece while the
            # next one is still being copied out.
            a._piece = max(a._granule, (a._layout.slab_bytes // 8 + a._granule - 1)
                           // a._granule * a._granule)
        runs = _runs(a, off)
        _host_memory(a, runs)
        _keep_buffers(a, ids)
        chunks = sorted(a._chunks)
        events = []
        try:
            copied = {}
            for i, p, cap in a._kept:
                n = a._layout.size[i]
                if n and i in ids:
                    be.d2h(<void *><uintptr_t>p, a._base + a._layout.offset[i], n, 0)
                    copied[i] = n
            moved = _copy_out(a, off, chunks, events)
            a._offloaded, a._keeping = moved, copied
            a._sleeping = True
            _remap(a, chunks, events, _overlapping(a, runs))
        finally:
            for ev in events:
                be.event_destroy(ev)
    finally:
        mt_life_reshape_end(a._life, a._sleeping)    # paused while it sleeps
    return None


cdef dict _copy_out(BufferArena a, list off, list chunks, list events):
    """Queue the copies of the offloaded buffers to their host memory (at the
    staging range), chunk by chunk in address order, with an event after
    each chunk's: buffer id -> bytes.  On failure nothing is changed but
    the staging copy (the copies queued are waited for)."""
    cdef Backend be = a._gpu
    cdef uintptr_t ev = 0
    cdef uint64_t lo, hi, o, n, x, y
    if not off:
        return {}
    try:
        for c in chunks:
            lo, hi = c[0], c[0] + c[1]
            for i in off:
                o, n = a._layout.offset[i], a._layout.size[i]
                x, y = max(o, lo), min(o + n, hi)
                if x < y:
                    be.copy(a._stage + x, a._base + x, y - x, 0)
            be.event_create(&ev)
            events.append(ev)
            be.event_record(ev, 0)
    except BaseException:
        be.quiesce()
        raise
    return {i: a._layout.size[i] for i in off if a._layout.size[i]}


cdef int _remap(BufferArena a, list chunks, list events, list entries) except -1:
    """The second half of a sleep: each chunk unmapped once its copies are
    done, and each host handle in `entries` mapped at the buffers' own
    addresses as soon as no chunk is mapped under it (the copy of the next
    chunk runs meanwhile).  A failed mapping wakes the arena again (the
    error follows); a failed unmap leaves it asleep with that chunk mapped."""
    cdef Backend be = a._gpu
    pending = list(entries)
    if not events:              # nothing offloaded: every chunk at once
        err = unmap_chunks(be, a._base, a._chunks, a._chunks, a._orphans)
        if err is not None:
            raise err
        return 0
    for k in range(len(chunks)):
        be.event_wait(events[k])
        err = unmap_chunks(be, a._base, [chunks[k]], a._chunks, a._orphans)
        if err is not None:
            be.quiesce()
            raise err
        ready = [e for e in pending
                 if not any(e[0] < c[0] + c[1] and c[0] < e[0] + e[1] for c in a._chunks)]
        try:
            for e in ready:
                be.map_host(a._base + e[0], e[1], e[2])
                a._at_base.append(e)
                pending.remove(e)
        except BaseException:
            be.quiesce()            # every copy done: the staging range is whole
            _unmap_hosted(a)
            _restore(a)             # awake again: the kept and offloaded buffers back
            a._sleeping = False
            raise
    return 0


def _arena_wake(BufferArena a):
    """Map device memory again at the same addresses after `sleep`.

    Zeroes the zero_all set (one fused operation) and norm_unit_w (the
    buffers filled with zeros at construction), then copies back the
    buffers `sleep` offloaded (their host memory unmapped from their
    addresses first: views of them stay valid) and those it kept (a kept
    or offloaded buffer of the zero_all set gets its contents; after a
    resize while asleep, up to the buffer's new size); every other
    buffer's contents are undefined (fresh memory).  A CUDA graph
    captured before the sleep replays bit-identically afterwards.

    Raises
    ------
    OutOfMemoryError
        Physical memory was refused; the arena still sleeps (wake again
        later).
    MetraleError
        The arena has no reservation, is not sleeping, is released, or
        the backend failed; the arena then still sleeps.
    """
    begin(a, "wake", list(a._offloaded))
    try:
        if not a._sleeping:
            raise MetraleError("wake: the buffer arena is not sleeping")
        at_base = a._at_base
        _unmap_hosted(a)
        try:
            _restore(a)
        except BaseException:
            try:
                _map_hosted(a, at_base)     # asleep as before
            except Exception as e:
                logger().warning("buffer arena: mapping the offloaded buffers' host memory "
                                 "again after a failed wake failed: %s", e)
            raise
        a._sleeping = False
        a._offloaded, a._keeping = {}, {}
        trim(a)                     # chunks a failed sleep left and the limits no longer need
    finally:
        mt_life_reshape_end(a._life, a._sleeping)    # paused while it sleeps
    return None


# -- what a sleep keeps and offloads --------------------------------------------------------

cdef int _restore(BufferArena a) except -1:
    """Device memory for the current sizes, zeroed as when new, with the kept
    and offloaded buffers copied back (nothing mapped at the buffers' own
    addresses but the arena's chunks); on failure the chunks are unmapped
    again and the error propagates."""
    cdef Backend be = a._gpu
    cdef uint64_t n
    try:
        commit(a)
        zero_fresh(a, True)     # then the kept and offloaded buffers over it
        for i, p, cap in a._kept:       # up to the current size (a resize while asleep)
            n = min(a._keeping.get(i, 0), a._layout.size[i])
            if n:
                be.h2d(a._base + a._layout.offset[i], <void *><uintptr_t>p, n, 0)
        for i, k in a._offloaded.items():
            n = min(k, a._layout.size[i])
            if n:
                be.copy(a._base + a._layout.offset[i], a._stage + a._layout.offset[i], n, 0)
        be.sync(0)
        refill_guards(a)
    except BaseException:
        try:
            be.quiesce()
        except Exception:
            pass
        unmap_chunks(be, a._base, a._chunks, a._chunks, a._orphans)
        raise
    return 0


cdef list _runs(BufferArena a, list ids):
    """The granules the buffers `ids` occupy at their current sizes, as
    merged (offset, bytes) runs."""
    cdef uint64_t g = a._granule, lo, hi
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


cdef int _host_memory(BufferArena a, list runs) except -1:
    """Host memory mapped at the staging range for every run: what the
    arena has when it covers them (made once, reused), else new handles for
    the runs (the old ones, which overlap them there and hold nothing a
    sleep needs, released first)."""
    cdef Backend be = a._gpu
    cdef uintptr_t stage
    cdef uint64_t h = 0
    if all(_covered(a._hosted, lo, lo + n) for lo, n in runs):
        return 0
    old, a._hosted = a._hosted, []
    _drop_hosted(a, old)
    if a._hosted:
        raise MetraleError("sleep: unmapping the host memory of an earlier offload failed")
    stage = a._stage
    made = []
    pieces = []
    for lo, n in runs:          # no handle longer than _piece
        while a._piece and n > a._piece:
            pieces.append((lo, a._piece))
            lo, n = lo + a._piece, n - a._piece
        pieces.append((lo, n))
    try:
        if not stage:
            be.reserve(a._layout.slab_bytes, &stage)
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
            if stage and not a._stage:
                be.unreserve(stage, a._layout.slab_bytes)
        except Exception as e:
            logger().warning("buffer arena: undoing host memory for offloaded buffers "
                             "failed: %s", e)
        raise
    a._hosted, a._stage = made, stage
    return 0


cdef bint _covered(list hosted, uint64_t lo, uint64_t hi):
    """Whether the (sorted, disjoint) host handles cover [lo, hi) together."""
    for o, k, _h in hosted:
        if o <= lo < o + k:
            lo = o + k
    return lo >= hi


cdef int _drop_hosted(BufferArena a, list hosted) except -1:
    """Unmap from the staging range and release `hosted`; what fails stays
    in a._hosted, released by the next release."""
    cdef Backend be = a._gpu
    first = None
    for lo, n, h in hosted:
        try:
            be.unmap_host(a._stage + lo, n)
        except Exception as e:
            first = first or e
            a._hosted.append((lo, n, h))
            continue
        try:
            be.release_host(h, n)
        except Exception as e:
            first = first or e
            a._host_orphans.append((h, n))      # released again by release
    if first is not None:
        logger().warning("buffer arena: giving back host memory of offloaded buffers "
                         "failed: %s", first)
    return 0


cdef list _overlapping(BufferArena a, list runs):
    """The host handles that hold some of `runs`."""
    return [e for e in a._hosted if any(e[0] < r + k and r < e[0] + e[1] for r, k in runs)]


cdef int _map_hosted(BufferArena a, list entries) except -1:
    """Map the host handles `entries` at the buffers' own addresses; on
    failure what this call mapped is unmapped again."""
    cdef Backend be = a._gpu
    done = []
    try:
        for lo, n, h in entries:
            be.map_host(a._base + lo, n, h)
            done.append((lo, n, h))
    except BaseException:
        for lo, n, h in done:
            be.unmap_host(a._base + lo, n)
        raise
    a._at_base = done
    return 0


cdef int _unmap_hosted(BufferArena a) except -1:
    """Unmap the host memory from the buffers' own addresses (the device's
    work waited for); on failure what this call unmapped is mapped again."""
    cdef Backend be = a._gpu
    if not a._at_base:
        return 0
    be.quiesce()
    done = []
    try:
        for lo, n, h in a._at_base:
            be.unmap_host(a._base + lo, n)
            done.append((lo, n, h))
    except BaseException:
        for lo, n, h in done:
            be.map_host(a._base + lo, n, h)
        raise
    a._at_base = []
    return 0


cdef int _keep_buffers(BufferArena a, list ids) except -1:
    """A pinned host buffer for each of `ids` at its current size: what the
    arena has when large enough (made once, reused), else a new one, the
    old one freed only once the new one is made."""
    cdef Backend be = a._gpu
    cdef void *host = NULL
    have = {k[0]: k for k in a._kept}
    made = []
    try:
        for i in ids:
            n = a._layout.size[i]
            if n and (i not in have or have[i][2] < n):
                be.host_alloc(n, &host)
                made.append((i, <uintptr_t>host, n))
    except BaseException:
        for _, p, _n in made:
            be.host_free(<void *><uintptr_t>p)
        raise
    for k in made:
        if k[0] in have:
            be.host_free(<void *><uintptr_t>have[k[0]][1])
        have[k[0]] = k
    a._kept = sorted(have.values())
    return 0


def _free_hosted(BufferArena a):
    """Give back the host memory of sleep(offload=...) (release): unmapped
    from the buffers' addresses and the staging range, released, the staging
    range unreserved.  What fails stays recorded for the next release.

    Parameters
    ----------
    a : BufferArena
        The arena being released.

    Raises
    ------
    MetraleError
        The backend failed to unmap or release some of it (kept for the
        next call).
    """
    cdef Backend be = a._gpu
    _unmap_hosted(a)
    hosted, a._hosted = a._hosted, []
    _drop_hosted(a, hosted)
    for h, n in list(a._host_orphans):
        be.release_host(h, n)
        a._host_orphans.remove((h, n))
    if a._hosted:
        raise MetraleError("release: unmapping host memory of offloaded buffers failed")
    if a._stage:
        be.unreserve(a._stage, a._layout.slab_bytes)
        a._stage = 0
    return None
