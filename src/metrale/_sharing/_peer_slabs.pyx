# cython: language_level=3, binding=False
"""The peers' slabs of a shared arena mapped into this process (`PeerSlabs`),
and this rank's chunks exported as file descriptors (`export_chunks`): the
backend's virtual-memory calls the tensor-parallel setup needs (metrale/_arena/tp.py,
metrale/_sharing/_tp_exchange.py), below it and below the arena (metrale/_arena/_peer.pyx).
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport free, malloc

from metrale._backends._backend cimport Backend
from metrale._base._common cimport as_stream, mt_py_finalizing
from metrale._backends._mapping cimport free_reservation, release_orphans, unmap_chunks
from metrale._base._core cimport mt_copy_run
from metrale._base._peer_core cimport mt_signal

import os

from metrale._base._common import U64_MAX as _U64_MAX
from metrale._base.errors import MetraleError

#: Bytes of a rank's signal area (kernels/peer_reduce.h), before rounding up
#: to the granularity.
SIGNAL_BYTES = sizeof(mt_signal)


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

    Attributes
    ----------
    copies_begun : int
        Batches of `remap_peer`'s copies begun
        (counted before each: one that failed may have written some bytes).
    """
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
            self._import(entry, chunks, fds, self._check_chunks(f"rank {rank}", entry, chunks))
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

    def remap_peer(self, key, list chunks, list fds, list runs=None, stream=None):
        """Import each descriptor and map it at its chunk of `key`'s
        reservation, which `detach` kept: the same addresses as before; with
        `runs`, copy each one in as soon as the chunks under it are mapped.

        The chunks are mapped by offset, so the device copies what the first
        ones hold while the next ones are being mapped.

        Parameters
        ----------
        key : int or tuple
            The entry, as `map_peer` made it.
        chunks : list of (int, int)
            (offset, length) of each chunk: those `map_peer` mapped.
        fds : list of int
            One descriptor per chunk; not closed here.
        runs : list of (int, int, int), optional
            ``(offset, src, nbytes)`` by offset, none overlapping another,
            each checked before the first chunk is mapped: `offset` from
            the entry's base, where ``[offset, offset + nbytes)`` must lie
            in `chunks`; `src` the source's address (device memory, or host
            memory the device reads: the caller vouches for its `nbytes`).
            Not waited for: `detach` and `close` wait for the device.
        stream : stream, optional
            The copies' stream, as the arena's methods take it (None: the
            legacy default stream).

        Returns
        -------
        int
            The base address (unchanged).

        Raises
        ------
        TypeError, ValueError
            A bad chunk (outside the reservation, or over another) or run
            (nothing mapped).
        MetraleError
            A chunk's import or map, or a copy, failed: the device waited
            for, everything unmapped again (what was copied stays copied).
        """
        cdef uintptr_t s = as_stream(stream)       # converted before anything is read
        cdef mt_copy_run *checked = NULL
        cdef Py_ssize_t k = 0, j = 0, m
        cdef uintptr_t hi
        cdef bint copied = False
        entry = self._slabs.get(key)
        if entry is None:
            raise ValueError(f"{key!r} was never mapped")
        if entry[3]:
            raise ValueError(f"{key!r} is mapped already")
        if len(chunks) != len(fds):
            raise ValueError(f"{len(chunks)} chunks but {len(fds)} descriptors")
        order = self._check_chunks(repr(key), entry, chunks)
        if runs is not None:
            checked = <mt_copy_run *>malloc(max(len(runs), 1) * sizeof(mt_copy_run))
            if checked == NULL:
                raise MemoryError(f"remap_peer: a table of {len(runs)} runs")
        try:
            if runs is not None:
                self._check_runs(key, entry[0], [(o, n, 0) for o, n in chunks], runs, checked, &k)
            for i in order:
                self._import(entry, chunks, fds, [i])
                # every run that ends in what is mapped by now: the chunks go
                # by offset, and no run lies outside them
                hi = <uintptr_t>entry[0] + <uintptr_t>(chunks[i][0] + chunks[i][1])
                m = j
                while m < k and checked[m].dst + checked[m].length <= hi:
                    m += 1
                if m > j:
                    copied = True
                    self.copies_begun += 1
                    self._gpu.copy_runs(checked + j, m - j, s)
                    j = m
        except BaseException:
            try:
                if copied:
                    self._gpu.quiesce()     # no copy may still write what is unmapped
            finally:
                unmap_chunks(self._gpu, entry[0], entry[3], entry[3], self._orphans)
            raise
        finally:
            free(checked)
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
            if key != "signal":             # each tried, whatever failed before
                err = unmap_chunks(self._gpu, entry[0], entry[3], entry[3], self._orphans)
                first = first or err
        err = release_orphans(self._gpu, self._orphans)
        first = first or err
        if first is not None:
            raise first
        return None

    cdef int _check_runs(self, key, uintptr_t base, list chunks, list runs, mt_copy_run *checked,
                         Py_ssize_t *k) except -1:
        """remap_peer's runs, each checked against `chunks` ((offset, length,
        handle) of `key`'s), into `checked` (its *k entries those of a byte
        or more)."""
        cdef size_t i, m = len(runs), at, off, n, end = 0
        mapped = sorted((o, c) for o, c, _h in chunks)
        for i in range(m):
            run = runs[i]
            if type(run) is not tuple or len(run) != 3:
                raise ValueError(f"remap_peer: runs[{i}] must be an (offset, src, nbytes) tuple")
            o, src, nb = run
            if type(o) is not int or type(src) is not int or type(nb) is not int:
                raise TypeError(f"remap_peer: runs[{i}] must hold three ints")
            if o < 0 or src < 0 or nb < 0:
                raise ValueError(f"remap_peer: runs[{i}] holds a negative number")
            if o > _U64_MAX or src > _U64_MAX or nb > _U64_MAX:
                raise ValueError(f"remap_peer: runs[{i}] holds a number of more than 64 bits")
            off, n = o, nb
            if off + n < off:
                raise ValueError(f"remap_peer: runs[{i}]: offset + nbytes overflows")
            if off < end:       # two runs over the same bytes: the caller's error
                raise ValueError(f"remap_peer: runs[{i}] starts at {off}, before the end of the "
                                 f"run before it ({end}): runs go by offset, none overlapping")
            end = off + n
            at = off
            for co, cn in mapped:
                if co <= at < co + cn:
                    at = co + cn
                    if at >= off + n:
                        break
            if n and at < off + n:
                raise ValueError(f"remap_peer: runs[{i}]: [{off}, +{n}) of {key!r} is not all "
                                 "mapped")
            if n:
                checked[k[0]].dst = base + off
                checked[k[0]].src = src
                checked[k[0]].length = n
                k[0] += 1
        return 0

    def own_signal(self):
        """This rank's signal area as ``(offset, bytes, handle)`` (to export
        again), or None without local peers."""
        entry = self._slabs.get("signal")
        return entry[3][0] if entry is not None and entry[3] else None

    cdef list _check_chunks(self, str what, list entry, list chunks):
        """The chunks' indices by offset, each chunk checked first: two ints,
        a length of a byte or more, inside `entry`'s reservation ([base,
        alloc, bytes, mapped]), none overlapping another (the engine's word
        is checked before anything is mapped)."""
        cdef size_t room = <size_t>entry[2] - (<uintptr_t>entry[0] - <uintptr_t>entry[1])
        cdef size_t end = 0
        for i, c in enumerate(chunks):
            if (type(c) is not tuple and type(c) is not list or len(c) != 2
                    or type(c[0]) is not int or type(c[1]) is not int):
                raise TypeError(f"{what}: chunks[{i}] must be two ints (offset, length)")
            if c[0] < 0 or c[1] <= 0 or c[0] + c[1] > room:
                raise ValueError(f"{what}: chunk [{c[0]}, +{c[1]}) lies outside its "
                                 f"{room}-byte reservation")
        order = sorted(range(len(chunks)), key=lambda i: chunks[i][0])
        for i in order:
            if chunks[i][0] < end:
                raise ValueError(f"{what}: chunk [{chunks[i][0]}, +{chunks[i][1]}) overlaps "
                                 f"the one before it (which ends at {end})")
            end = chunks[i][0] + chunks[i][1]
        return order

    cdef int _import(self, list entry, list chunks, list fds, list order) except -1:
        """Import the descriptor of each chunk in `order` (`_check_chunks`
        checked them) and map it at its chunk (offset, length) of `entry`'s
        reservation, adding each to the mapped list; on failure what was
        mapped stays listed there, for the caller to take down."""
        cdef uint64_t h = 0
        cdef uintptr_t base = entry[0]
        for i in order:
            off, n = chunks[i]
            self._gpu.import_handle(fds[i], n, &h)
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
                                      self._orphans, True)
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
        err = release_orphans(self._gpu, self._orphans)     # tried whatever failed before
        first = first or err
        if first is not None:
            raise first
        return None

    def __dealloc__(self):
        if (self._slabs or self._orphans) and self._gpu is not None and not mt_py_finalizing():
            try:
                self.close()
            except Exception:
                pass
