# cython: language_level=3, binding=False
"""Tensor-parallel sharing of a BufferArena (docs/tensor-parallel.md): the
arena side (a reserved arena of exportable chunks, shared by the collective
setup of metrale/_arena/tp.py; `peer`), and the backend calls around it: export
this rank's physical chunks as file descriptors, import and map a peer's,
unmap them again (_peer_slabs).

The protocol itself (the group, the checks, the descriptor passing) is
metrale/_arena/tp.py and metrale/_sharing/_tp_exchange.py; the peers' mappings and the
descriptors they are made from are metrale/_sharing/_peer_slabs.pyx, below both.
BufferArena binds `peer`, `peer_ranks`, `detach_peers`, `attach_peers` and
`peers_detached` from here, and builds a shared arena with `build_shared`.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memset

from metrale._arena._arena_state cimport ArenaState
from metrale._backends._backend cimport Backend
from metrale._base._common import check_index, seconds_arg
from metrale._base._core cimport MT_LIFE_OK, MT_MAX_BUFFERS, MT_WAIT_OPERATIONS
from metrale._base._life cimport (mt_life_released, mt_life_reshape_begin, mt_life_reshape_end,
                                  raise_life, wait_life)
from metrale._arena._reserve cimport build

from metrale._arena import tp
from metrale._base.errors import MetraleError


cdef int build_shared(ArenaState a, object sizes, object top_sizes, object group) except -1:
    """A reserved arena of exportable chunks, then the collective setup of
    metrale/_arena/tp.py; on any failure, on any rank, nothing is left."""
    grp = group if isinstance(group, tp.PeerGroup) else tp.PeerGroup(group)   # TypeError first
    try:
        build(a, sizes, top_sizes, True)
    except BaseException as e:
        tp._abort(grp, e)           # the other ranks raise instead of waiting
        raise
    layout = tuple((a._layout.offset[i], a._layout.size[i], a._layout.room[i])
                   for i in range(a._layout.n))
    try:
        a._peers = tp._share(a._gpu, grp, a._base, a._layout.slab_bytes,
                             list(a._reservation.chunks), layout, a._ptrs,
                             a._reservation.granule, a._layout.max_batch_tokens, a._buffers,
                             a._layout.base_align)
    except BaseException:
        a._set_ptrs((0,) * a._layout.n)
        a._reservation.close()
        if not a._reservation.alloc:
            a._base = a._alloc = 0
        raise
    return 0


@cython.binding(True)
def peer_ranks(ArenaState self):
    """The ranks whose buffers `peer` gives: those on this host.

    Returns
    -------
    tuple of int
        Sorted, this rank included; ``()`` for an arena that is not shared.
    """
    cdef ArenaState a = self
    return () if a._peers is None else tuple(a._peers.local)


@cython.binding(True)
def peer(ArenaState self, rank):
    """The buffers of another rank of the group, as this process maps them.

    Parameters
    ----------
    rank : int
        A rank of the group the arena was built with (its own rank
        gives the arena's own pointers).

    Returns
    -------
    metrale.tp.PeerBuffers
        The same pointer accessors as the arena (``hidden_states()``
        ...), at that rank's base plus the same offsets; the same object
        for every call.

    Raises
    ------
    TypeError, ValueError
        `rank` is not an int, or not in ``[0, group size)``.
    MetraleError
        The arena is not shared or is released, or `rank` runs on
        another host.
    """
    cdef ArenaState a = self
    if a._peers is None:
        raise MetraleError("peer: the arena is not shared (build it with group=...)")
    if mt_life_released(a._life):
        raise MetraleError("peer: the buffer arena has been released")
    r = check_index(rank, "rank", 0, a._peers.size - 1)
    cell = a._peers.cell(r)
    p = a._peers.handed(r)
    if p is None:
        p = tp.PeerBuffers(r, cell, a._peers.buffers)
        a._peers.hand(r, p)
    return p


cdef int _hold(ArenaState a, str what) except -1:
    """Hold the arena alone, as a reshape does (operations in flight waited
    for, new ones refused until mt_life_reshape_end), views allowed:
    detaching changes only what backs the peers' addresses."""
    cdef unsigned char ok[MT_MAX_BUFFERS]
    memset(ok, 1, sizeof(ok))
    rc = mt_life_reshape_begin(a._life, ok)
    if rc != MT_LIFE_OK:
        raise_life(rc, "the buffer arena", what, a._exported())
    try:
        wait_life(a._life, MT_WAIT_OPERATIONS)
    except BaseException:
        mt_life_reshape_end(a._life, 0)
        raise
    return 0


@cython.binding(True)
def detach_peers(ArenaState self):
    """Unmap and release the peers' memory, keeping their addresses reserved.

    What a process checkpoint needs (docs/checkpoint.md): the driver cannot
    restore a process holding memory imported from another process.  Waits
    for the device first.  Every address stays reserved, so graphs and
    PeerBuffers keep their pointers; but nothing may touch a peer's memory
    until `attach_peers` maps it again (`peer` and `peer_all_reduce` refuse
    meanwhile).  This rank's own memory stays as it is.  Detaching a
    detached arena, or one that is not shared, does nothing.

    Raises
    ------
    MetraleError
        The arena is released, another thread reshapes it, or the backend
        failed an unmap or a release (what failed stays recorded: calling
        again retries it).
    """
    cdef ArenaState a = self
    if a._peers is None:
        return None
    _hold(a, "detach_peers")
    try:
        if mt_life_released(a._life):
            raise MetraleError("detach_peers: the buffer arena has been released")
        a._peers.detach()
    finally:
        mt_life_reshape_end(a._life, 0)
    return None


@cython.binding(True)
def attach_peers(ArenaState self, timeout=60.0):
    """Map the peers' memory again at the addresses `detach_peers` kept.

    A collective call: every local rank of the group makes it (after each
    detached, and after a restore: docs/checkpoint.md).  Each rank exports
    its memory again and sends it to each local peer over the socket it kept
    from construction; each imports and maps its peers' at the same addresses
    as before, so captured graphs and PeerBuffers work unchanged.

    Parameters
    ----------
    timeout : float, optional
        Seconds to wait for the peers' memory (default 60).

    Raises
    ------
    TypeError, ValueError
        `timeout` is not a number of seconds in (0, 86400].
    MetraleError
        The arena is not shared, not detached, released, or a peer's memory
        did not come (the arena then stays detached: release it on every
        rank).
    """
    cdef ArenaState a = self
    secs = seconds_arg(timeout, "timeout")
    if a._peers is None:
        raise MetraleError("attach_peers: the arena is not shared (build it with group=...)")
    _hold(a, "attach_peers")
    try:
        if mt_life_released(a._life):
            raise MetraleError("attach_peers: the buffer arena has been released")
        a._peers.attach(a._gpu, list(a._reservation.chunks), secs)
    finally:
        mt_life_reshape_end(a._life, 0)
    return None


@cython.binding(True)
def peers_detached(ArenaState self):
    """Whether `detach_peers` left the peers' memory unmapped.

    Returns
    -------
    bool
        False for an arena that is not shared.
    """
    cdef ArenaState a = self
    return a._peers is not None and a._peers.detached
