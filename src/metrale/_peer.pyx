# cython: language_level=3, binding=False
"""Tensor-parallel sharing of a BufferArena (docs/tensor-parallel.md): the
arena side (a reserved arena of exportable chunks, shared by the collective
setup of metrale/tp.py; `peer`), and the backend calls around it: export
this rank's physical chunks as file descriptors, import and map a peer's,
unmap them again.

The protocol itself (the group, the checks, the descriptor passing) is
metrale/tp.py; the backend's virtual-memory methods are C-level, so the
calls that need them live here.  BufferArena forwards `peer`, `peer_ranks`
and the construction of a shared arena here.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memset

from metrale._arena cimport BufferArena, live_arenas
from metrale._backend cimport Backend
from metrale._common cimport mt_py_finalizing
from metrale._common import seconds_arg
from metrale._core cimport MT_LIFE_OK, MT_MAX_BUFFERS, MT_WAIT_OPERATIONS
from metrale._life cimport (mt_life_released, mt_life_reshape_begin, mt_life_reshape_end, raise_life,
                            wait_life)
from metrale._mapping cimport free_reservation, release_orphans, unmap_chunks
from metrale._peer_core cimport mt_signal
from metrale._reserve cimport build

import os

from metrale.errors import MetraleError

#: Bytes of a rank's signal area (kernels/peer_reduce.h), before rounding up
#: to the granularity.
SIGNAL_BYTES = sizeof(mt_signal)


def _build_shared(BufferArena a, sizes, top_sizes, group):
    """A reserved arena of exportable chunks, then the collective setup of
    metrale/tp.py; on any failure, on any rank, nothing is left."""
    from metrale import tp
    grp = group if isinstance(group, tp.PeerGroup) else tp.PeerGroup(group)   # TypeError first
    a._shareable = True
    try:
        build(a, sizes, top_sizes)
    except BaseException as e:
        tp._abort(grp, e)           # the other ranks raise instead of waiting
        raise
    layout = tuple((a._layout.offset[i], a._layout.size[i], a._layout.room[i])
                   for i in range(a._layout.n))
    try:
        a._peers = tp._share(a._gpu, grp, a._base, a._layout.slab_bytes, list(a._chunks),
                             layout, a._ptrs, a._granule, a._layout.max_batch_tokens, a._buffers,
                             a._layout.base_align)
    except BaseException:
        a._set_ptrs((0,) * a._layout.n)
        err, freed = free_reservation(a._gpu, a._base, a._alloc, a._layout.slab_bytes, a._chunks,
                                      a._orphans, a._kept)
        if freed:
            a._base = a._alloc = 0
        raise
    return None


def _arena_peer_ranks(BufferArena a):
    """The ranks whose buffers `peer` gives: those on this host.

    Returns
    -------
    tuple of int
        Sorted, this rank included; ``()`` for an arena that is not shared.
    """
    return () if a._peers is None else tuple(a._peers.local)


def _arena_peer(BufferArena a, rank):
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
    if a._peers is None:
        raise MetraleError("peer: the arena is not shared (build it with group=...)")
    if mt_life_released(a._life):
        raise MetraleError("peer: the buffer arena has been released")
    return a._peers.peer(rank)


cdef int _hold(BufferArena a, str what) except -1:
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


def _arena_detach_peers(BufferArena a):
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


def _arena_attach_peers(BufferArena a, timeout=60.0):
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
    secs = seconds_arg(timeout, "timeout")
    if a._peers is None:
        raise MetraleError("attach_peers: the arena is not shared (build it with group=...)")
    _hold(a, "attach_peers")
    try:
        if mt_life_released(a._life):
            raise MetraleError("attach_peers: the buffer arena has been released")
        a._peers.attach(a._gpu, list(a._chunks), secs)
    finally:
        mt_life_reshape_end(a._life, 0)
    return None


def _arena_peers_detached(BufferArena a):
    """Whether `detach_peers` left the peers' memory unmapped.

    Returns
    -------
    bool
        False for an arena that is not shared.
    """
    return a._peers is not None and a._peers.detached


def export_chunks(Backend gpu, list chunks):
    """A new descriptor for each chunk ``(offset, length, handle)``, in order.

    On failure the descriptors already made are closed and the error
    propagates.  The caller closes the descriptors it gets.

    Parameters
    ----------
    gpu : Backend
        The backend that created the chunks' handles (exportable).
    chunks : list of (int, int, int)
        The arena's mapped chunks.

    Returns
    -------
    list of int
    """
    cdef int fd = -1
    fds = []
    try:
        for _off, n, h in chunks:
            gpu.export_handle(h, n, &fd)
            fds.append(fd)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


# no_gc: not tracked by the cyclic collector, so that nothing it holds (its
# backend, and the dict and lists of integers that stand for the peers'
# mappings) is cleared before its finalizer unmaps them, whatever the order of
# a collection.  It holds nothing that refers back to it: it can be in no cycle.
@cython.no_gc
@cython.final
cdef class PeerSlabs:
    """PeerSlabs(gpu)
--

The peers' slabs mapped into this process, each in its own reservation.

    Built by metrale.tp while an arena is shared; `close` (from the arena's
    release) and the finalizer unmap and release everything.

    Parameters
    ----------
    gpu : Backend
        The backend that maps the peers' slabs (the arena's).
    """
    cdef Backend _gpu
    # rank -> [base, reserved bytes, [(offset, length, handle), ...] mapped]:
    # an entry leaves the dict once its chunks are unmapped and its
    # reservation freed, so a failed close can be retried.
    cdef dict _slabs
    cdef list _orphans            # [(handle, bytes)] unmapped, whose release failed: retried

    def __init__(self, Backend gpu):
        self._gpu = gpu
        self._slabs = {}
        self._orphans = []

    def map_peer(self, rank, size_t nbytes, list chunks, list fds, size_t align=0):
        """Reserve `nbytes`, import each descriptor and map it at its chunk.

        Parameters
        ----------
        rank : int or tuple
            The peer's rank (the key `close` uses): ``("signal", rank)`` for
            its signal area.
        nbytes : int
            The peer's slab (its reservation) in bytes.
        chunks : list of (int, int)
            (offset, length) of each of the peer's physical chunks.
        fds : list of int
            One descriptor per chunk; not closed here.
        align : int, optional
            The alignment the peer's base needs (its layout's `base_align`,
            a power of two; 0: the reservation's own).

        Returns
        -------
        int
            The base address of the peer's slab in this process.
        """
        cdef uintptr_t base = 0, alloc = 0
        if rank in self._slabs:
            raise ValueError(f"rank {rank} is mapped already")
        if len(chunks) != len(fds):
            raise ValueError(f"{len(chunks)} chunks but {len(fds)} descriptors")
        if align & (align - 1):
            raise ValueError(f"align must be a power of two, got {align}")
        self._gpu.reserve(nbytes, &alloc)
        base = (alloc + align - 1) & ~(align - 1) if align else alloc
        entry = [base, alloc, nbytes, []]
        self._slabs[rank] = entry
        try:
            self._import(f"rank {rank}", entry, chunks, fds)
        except BaseException:
            try:
                self._unmap_rank(rank)
            except Exception:
                pass        # left in _slabs: close() and the finalizer retry it
            raise
        return base

    def map_signal(self, size_t nbytes):
        """Create, map and zero this rank's signal area (the flags of
        peer_all_reduce, kernels/peer_reduce.h): an exportable handle of
        `nbytes` in a reservation of its own, kept as the entry "signal".
        Also loads the reduction's kernel, outside any capture.

        Parameters
        ----------
        nbytes : int
            A multiple of the granularity holding an ``mt_signal``.

        Returns
        -------
        tuple of (int, int)
            The area's address and its handle (to export).
        """
        cdef uintptr_t alloc = 0
        cdef uint64_t h = 0
        if "signal" in self._slabs:
            raise ValueError("the signal area is mapped already")
        if nbytes < sizeof(mt_signal):
            raise ValueError(f"a signal area needs {sizeof(mt_signal)} bytes, got {nbytes}")
        self._gpu.reserve(nbytes, &alloc)
        entry = [alloc, alloc, nbytes, []]
        self._slabs["signal"] = entry
        try:
            self._gpu.create_exportable(nbytes, &h)
            try:
                self._gpu.map(alloc, nbytes, h)
            except BaseException:
                self._gpu.release_handle(h, nbytes)
                raise
            entry[3].append((0, nbytes, h))
            self._gpu.memset(alloc, nbytes, 0)      # device memory comes uninitialized
            self._gpu.sync(0)
            self._gpu.peer_reduce(NULL, 0)
        except BaseException:
            try:
                self._unmap_rank("signal")
            except Exception:
                pass        # left in _slabs: close() and the finalizer retry it
            raise
        return alloc, h

    def remap_peer(self, key, list chunks, list fds):
        """Import each descriptor and map it at its chunk of `key`'s
        reservation, which `detach` kept: the same addresses as before.

        Parameters
        ----------
        key : int or tuple
            The entry, as `map_peer` made it.
        chunks : list of (int, int)
            (offset, length) of each chunk: those `map_peer` mapped.
        fds : list of int
            One descriptor per chunk; not closed here.

        Returns
        -------
        int
            The base address (unchanged).
        """
        entry = self._slabs.get(key)
        if entry is None:
            raise ValueError(f"{key!r} was never mapped")
        if entry[3]:
            raise ValueError(f"{key!r} is mapped already")
        if len(chunks) != len(fds):
            raise ValueError(f"{len(chunks)} chunks but {len(fds)} descriptors")
        try:
            self._import(repr(key), entry, chunks, fds)
        except BaseException:
            unmap_chunks(self._gpu, entry[0], entry[3], entry[3], self._orphans)
            raise
        return entry[0]

    def detach(self):
        """Wait for the device, then unmap and release every peer's chunks,
        keeping the reservations (this rank's own signal area stays).

        Raises
        ------
        MetraleError
            The backend failed an unmap or a release: what failed stays
            recorded, and the next `detach` or `close` tries it again.
        """
        first = None
        if any(entry[3] for key, entry in self._slabs.items() if key != "signal"):
            self._gpu.quiesce()         # no kernel may still read a peer's memory
        for key, entry in self._slabs.items():
            if key != "signal":
                first = first or unmap_chunks(self._gpu, entry[0], entry[3], entry[3],
                                              self._orphans)
        first = first or release_orphans(self._gpu, self._orphans)
        if first is not None:
            raise first
        return None

    def own_signal(self):
        """This rank's signal area as ``(offset, bytes, handle)`` (to export
        again), or None without local peers."""
        entry = self._slabs.get("signal")
        return entry[3][0] if entry is not None and entry[3] else None

    cdef int _import(self, str what, list entry, list chunks, list fds) except -1:
        """Import each descriptor and map it at its chunk (offset, length) of
        `entry`'s reservation ([base, alloc, bytes, mapped]), adding each to
        the mapped list; on failure what was mapped stays listed there, for
        the caller to take down."""
        cdef uint64_t h = 0
        cdef uintptr_t base = entry[0]
        for (off, n), fd in zip(chunks, fds):
            if base - <uintptr_t>entry[1] + off + n > entry[2]:
                raise ValueError(f"{what}: chunk [{off}, +{n}) lies outside its "
                                 f"{entry[2]}-byte reservation")
            self._gpu.import_handle(fd, n, &h)
            try:
                self._gpu.map(base + off, n, h)
            except BaseException:
                self._gpu.release_handle(h, n)
                raise
            entry[3].append((off, n, h))
        return 0

    cdef int _unmap_rank(self, rank) except -1:
        """Unmap and release `rank`'s chunks, then free its reservation; the
        first error propagates after every step was tried."""
        entry = self._slabs[rank]
        err, freed = free_reservation(self._gpu, entry[0], entry[1], entry[2], entry[3],
                                      self._orphans, [], True)
        if freed:
            del self._slabs[rank]
        if err is not None:
            raise err
        return 0

    def mapped(self):
        """The peers' physical handles mapped here, and their bytes (this
        rank's own signal area is not counted).

        Returns
        -------
        tuple of (int, int)
        """
        chunks = [c for key, entry in self._slabs.items() if key != "signal" for c in entry[3]]
        return len(chunks), sum(c[1] for c in chunks)

    def close(self):
        """Wait for the device, then unmap every peer slab (idempotent).

        Raises
        ------
        MetraleError
            The backend failed an unmap, a release or an unreserve; what
            failed stays recorded and the next `close` tries it again.
        """
        first = None
        if not self._slabs and not self._orphans:
            return None
        try:
            if self._slabs:
                self._gpu.quiesce()     # no kernel may still read a peer's memory
        except Exception as e:
            first = e
        for rank in list(self._slabs):
            try:
                self._unmap_rank(rank)
            except Exception as e:
                first = first or e
        first = first or release_orphans(self._gpu, self._orphans)
        if first is not None:
            raise first
        return None

    def __dealloc__(self):
        if (self._slabs or self._orphans) and self._gpu is not None and not mt_py_finalizing():
            try:
                self.close()
            except Exception:
                pass


def _shared_arenas():
    """The live shared arenas of this process (metrale.tp.shared_arenas)."""
    shared = [a for a in live_arenas()
              if (<BufferArena>a)._peers is not None and not mt_life_released((<BufferArena>a)._life)]
    return sorted(shared, key=lambda a: (<BufferArena>a)._peers.serial)
