# cython: language_level=3, binding=False
"""The backend calls of a tensor-parallel arena: export this rank's physical
chunks as file descriptors, import and map a peer's, unmap them again.

The protocol around them (the group, the checks, the descriptor passing) is
metrale/tp.py; the backend's virtual-memory methods are C-level, so the calls
that need them live here.  See docs/tensor-parallel.md.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t

from metrale._backend cimport Backend
from metrale._common cimport mt_py_finalizing

import os


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


# no_gc_clear: the finalizer unmaps through _gpu, which a gc clear would have
# set to None first (the same reason as BufferArena's).
@cython.no_gc_clear
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

    def __init__(self, Backend gpu):
        self._gpu = gpu
        self._slabs = {}

    def map_peer(self, rank, size_t nbytes, list chunks, list fds):
        """Reserve `nbytes`, import each descriptor and map it at its chunk.

        Parameters
        ----------
        rank : int
            The peer's rank (the key `close` and `base` use).
        nbytes : int
            The peer's slab (its reservation) in bytes.
        chunks : list of (int, int)
            (offset, length) of each of the peer's physical chunks.
        fds : list of int
            One descriptor per chunk; not closed here.

        Returns
        -------
        int
            The base address of the peer's slab in this process.
        """
        cdef uintptr_t base = 0
        cdef uint64_t h = 0
        if rank in self._slabs:
            raise ValueError(f"rank {rank} is mapped already")
        if len(chunks) != len(fds):
            raise ValueError(f"{len(chunks)} chunks but {len(fds)} descriptors")
        self._gpu.reserve(nbytes, &base)
        entry = [base, nbytes, []]
        self._slabs[rank] = entry
        try:
            for (off, n), fd in zip(chunks, fds):
                if off + n > nbytes:
                    raise ValueError(f"rank {rank}: chunk [{off}, +{n}) lies outside its "
                                     f"{nbytes}-byte slab")
                self._gpu.import_handle(fd, n, &h)
                try:
                    self._gpu.map(base + off, n, h)
                except BaseException:
                    self._gpu.release_handle(h, n)
                    raise
                entry[2].append((off, n, h))
        except BaseException:
            try:
                self._unmap_rank(rank)
            except Exception:
                pass        # left in _slabs: close() and the finalizer retry it
            raise
        return base

    cdef int _unmap_rank(self, rank) except -1:
        """Unmap and release `rank`'s chunks, then free its reservation; the
        first error propagates after every step was tried."""
        cdef Backend be = self._gpu
        entry = self._slabs[rank]
        first = None
        for c in list(entry[2]):
            try:
                be.unmap(entry[0] + c[0], c[1])
            except Exception as e:
                first = first or e
                continue
            entry[2].remove(c)
            try:
                be.release_handle(c[2], c[1])
            except Exception as e:
                first = first or e
        if not entry[2]:
            try:
                be.unreserve(entry[0], entry[1])
            except Exception as e:
                first = first or e
            else:
                del self._slabs[rank]
        if first is not None:
            raise first
        return 0

    def close(self):
        """Wait for the device, then unmap every peer slab (idempotent).

        Raises
        ------
        MetraleError
            The backend failed an unmap, a release or an unreserve; what
            failed stays recorded and the next `close` tries it again.
        """
        first = None
        if not self._slabs:
            return None
        try:
            self._gpu.quiesce()         # no kernel may still read a peer's memory
        except Exception as e:
            first = e
        for rank in list(self._slabs):
            try:
                self._unmap_rank(rank)
            except Exception as e:
                first = first or e
        if first is not None:
            raise first
        return None

    def __dealloc__(self):
        if self._slabs and self._gpu is not None and not mt_py_finalizing():
            try:
                self.close()
            except Exception:
                pass
