# cython: language_level=3, binding=False
"""Sleep and wake of a reserved BufferArena (docs/stable-addresses.md): what
each buffer becomes while the device memory is given back (discarded, kept
as a pinned host copy, or offloaded to host memory mapped at its own
addresses), the host memory for that (made once, reused, freed by release),
and the pipelined copy and remap of an offload.

The reservation, its chunks and the reshape protocol are _reserve.pyx's;
BufferArena forwards `sleep` and `wake` here (and its release frees the host memory
through `_free_hosted`).
"""

from libc.stdint cimport uint64_t, uintptr_t

from metrale._arena cimport BufferArena
from metrale._backend cimport Backend
from metrale._common cimport buffer_ids, logger
from metrale._core cimport MT_IN_ZERO_ALL, MT_MAX_BUFFERS, MT_MAX_RANGES, mt_group_ranges, mt_range
from metrale._debug cimport refill_guards
from metrale._life cimport mt_life_reshape_end
from metrale._mapping cimport unmap_chunks
from metrale._reserve cimport begin, commit, cut, trim

from metrale.errors import MetraleError


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
        undefined), a handle's release (the arena sleeps; the handle is
        released again later), an unmap (the arena then sleeps with that
        chunk still mapped, `wake` works; or, where the chunk lies under an
        offloaded buffer's host memory, it is awake again as for a failed
        mapping).
    """
    cdef Backend be = a._gpu
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
        if (off or ids) and not a._piece:
            # Host memory, and from the next wake on device memory, in pieces
            # of an eighth of the slab: a sleep unmaps the pieces it copies
            # nothing from at once, and each other one (remapping an
            # offloaded one at its addresses) as soon as its copy is done,
            # while the next ones are still being copied.
            a._piece = max(a._granule, (a._layout.slab_bytes // 8 + a._granule - 1)
                           // a._granule * a._granule)
        runs = _runs(a, off)
        _host_memory(a, runs)
        _keep_buffers(a, ids)
        chunks = sorted(a._chunks)
        events = []
        try:
            moved, copied = _copy_out(a, off, ids, chunks, events)
            a._offloaded, a._keeping = moved, copied
            a._sleeping = True
            _remap(a, chunks, events, _overlapping(a, runs))
        finally:
            for ev in events:
                if ev:
                    be.event_destroy(ev)
    finally:
        mt_life_reshape_end(a._life, a._sleeping)    # paused while it sleeps
    return None


cdef tuple _copy_out(BufferArena a, list off, list ids, list chunks, list events):
    """Queue the copies out, chunk by chunk in address order: the offloaded
    buffers' bytes to their host memory (at the staging range), the kept
    ones' to their pinned buffers (one address space with the device's),
    with an event after each chunk's (0 for a chunk nothing is copied
    from).  Returns (offloaded, kept): buffer id -> bytes.  On failure the
    copies queued are waited for and nothing else is changed."""
    cdef Backend be = a._gpu
    cdef uintptr_t ev = 0
    cdef uint64_t lo, hi, o, n, x, y
    host = {k[0]: k[1] for k in a._kept if k[0] in ids}
    try:
        for c in chunks:
            lo, hi = c[0], c[0] + c[1]
            ev = 0
            for i in off + ids:
                o, n = a._layout.offset[i], a._layout.size[i]
                x, y = max(o, lo), min(o + n, hi)
                if x < y:
                    dst = a._stage + x if i in off else host[i] + (x - o)
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


cdef int _remap(BufferArena a, list chunks, list events, list entries) except -1:
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
    first = None
    pending = list(entries)
    order = [k for k in range(len(chunks)) if not events[k]] + \
        [k for k in range(len(chunks)) if events[k]]
    try:
        for k in order:
            if events[k]:
                be.event_wait(events[k])
            err = unmap_chunks(be, a._base, [chunks[k]], a._chunks, a._orphans)
            first = first or err
            ready = _bare(a, pending)
            _map_hosted(a, ready)
            pending = [e for e in pending if e not in ready]
        if pending:         # a chunk left mapped under offloaded memory
            raise first or MetraleError("sleep: a chunk is still mapped under offloaded memory")
    except BaseException:
        be.quiesce()            # every copy done: the staging range is whole
        _unmap_hosted(a)
        try:
            _restore(a)         # awake again: the kept and offloaded buffers back
        except BaseException:
            _map_hosted(a, _bare(a, entries))     # asleep, the offloaded buffers held
            raise
        a._sleeping = False
        raise
    if first is not None:
        raise first
    return 0


cdef list _bare(BufferArena a, list entries):
    """The host handles of `entries` under which no chunk is mapped."""
    return [e for e in entries
            if not any(e[0] < c[0] + c[1] and c[0] < e[0] + e[1] for c in a._chunks)]


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
        at_base = list(a._at_base)
        _unmap_hosted(a)
        try:
            _restore(a)
        except BaseException:
            try:
                _map_hosted(a, _bare(a, at_base))     # asleep as before
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
    again and the error propagates.  The copies run on the backend's side
    stream while the zeroing, which spares their bytes, runs on the default
    one: they overlap."""
    cdef Backend be = a._gpu
    cdef uint64_t n, o
    cdef uintptr_t side = 0
    try:
        commit(a)
        be.side_stream(&side)
        spans = []
        for i, p, cap in a._kept:       # up to the current size (a resize while asleep)
            n = min(a._keeping.get(i, 0), a._layout.size[i])
            if n:
                o = a._layout.offset[i]
                be.copy_h2d(a._base + o, <void *><uintptr_t>p, n, side)
                spans.append((o, o + n))
        for i, k in a._offloaded.items():
            n = min(k, a._layout.size[i])
            if n:
                o = a._layout.offset[i]
                be.copy(a._base + o, a._stage + o, n, side)
                spans.append((o, o + n))
        _zero_fresh_but(a, spans)
        be.sync(side)
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


cdef int _zero_fresh_but(BufferArena a, list spans) except -1:
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
    for lo, hi in sorted(spans):        # cut each span out of every wanted range
        cut = []
        for x, y in want:
            if y <= lo or hi <= x:
                cut.append((x, y))
                continue
            if x < lo:
                cut.append((x, lo))
            if hi < y:
                cut.append((hi, y))
        want = cut
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
    old = list(a._hosted)
    a._hosted.clear()
    _drop_hosted(a, old)
    if a._hosted:
        raise MetraleError("sleep: unmapping the host memory of an earlier offload failed")
    stage = a._stage
    made = []
    try:
        if not stage:
            be.reserve(a._layout.slab_bytes, &stage)
        for lo, n in cut(runs, a._piece):   # no handle longer than the arena's pieces
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
    a._hosted.replace(made)
    a._stage = stage
    return 0


cdef bint _covered(object hosted, uint64_t lo, uint64_t hi):
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
    """Map the host handles `entries` at the buffers' own addresses (added
    to those mapped there); on failure what this call mapped is unmapped
    again."""
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
    a._at_base.extend(done)
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
    a._at_base.clear()
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
    a._kept.replace(sorted(have.values()))
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
    hosted = list(a._hosted)
    a._hosted.clear()
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
