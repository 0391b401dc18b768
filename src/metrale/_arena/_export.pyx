# cython: language_level=3, binding=False
"""One class of a reserved arena's memory exported to another process
(`export_memory`, docs/rl.md): its physical chunks as file descriptors, for a
trainer that maps them and writes the engine's weights in place.

While a `MemoryExport` is open the arena is held as a reshape is (operations
in flight waited for, new ones, a sleep, a wake, a resize and a release
refused, from any thread), so that the chunks the descriptors stand for stay
the ones mapped; views stay valid, as nothing moves.  Its end counts one more
in the class's epoch (``Guard.epochs``) when the memory may have been written:
what was computed from the old bytes can tell.  BufferArena binds
`export_memory` from here; the socket protocol over it is
metrale/_integrations/refit.py.
"""

cimport cython
from libc.stdint cimport uint64_t

from metrale._arena._arena_state cimport ArenaState, sleeping
from metrale._arena._reservation cimport Reservation
from metrale._arena._reserve cimport begin
from metrale._base._life cimport mt_life_reshape_end

import os

from metrale._base.errors import MetraleError
from metrale._sharing._peer_slabs import export_chunks


@cython.binding(True)
def export_memory(ArenaState self, tag):
    """Export the memory of one class of the arena to another process.

    Parameters
    ----------
    tag : str
        The class (``BufferSpec(tag=...)``), awake.

    Returns
    -------
    MemoryExport
        Open: the arena is held until its `end` (or its collection).

    Raises
    ------
    TypeError, ValueError
        `tag` is not a str, or not a class of the arena.
    MetraleError
        The arena was not built ``exportable=True``, is released or shared,
        the class sleeps, or another thread holds the arena (a reshape, an
        export).
    """
    cdef ArenaState a = self
    cdef MemoryExport ex
    cdef Reservation r
    cdef int k
    if type(tag) is not str:
        raise TypeError(f"export_memory: tag must be a str, got {type(tag).__name__}")
    members = a._buffers.classes
    classes = list(members)
    if tag not in classes:
        raise ValueError(f"export_memory: {tag!r} is not a class of the arena (its classes: "
                         f"{', '.join(map(repr, classes))})")
    k = classes.index(tag)
    if a._reservation is None or not a._reservation.shareable:
        raise MetraleError("export_memory: the arena's memory is not exportable (build it with "
                           "BufferArena.from_sizes(..., reserve_sizes=..., exportable=True))")
    begin(a, "export_memory", range(len(a._buffers.names)))
    try:
        if a._sleep_state.asleep >> k & 1:
            raise MetraleError(f"export_memory: class {tag!r} sleeps: wake it first")
        r = <Reservation>a._reservation
        spans = r.spans[k] if k < len(r.spans) else []
        own = [(c[0], c[1], c[2]) for c in r.chunks if any(x <= c[0] < y for x, y in spans)]
        if not own:
            raise MetraleError(f"export_memory: class {tag!r} has no memory mapped")
        ex = MemoryExport.__new__(MemoryExport)
        ex._fds = export_chunks(a._gpu, own)
        for fd in ex._fds:
            os.set_inheritable(fd, False)       # not into a child the engine starts
        ex.a, ex.k, ex.tag, ex.open = a, k, tag, True
        ex.chunks = tuple((c[0], c[1]) for c in own)
        ex.offsets = {n: a._ptrs[a._index[n]] - a._base for n in members[tag]}
        ex.epoch_at = a._sleep_state.epoch[k]
    except BaseException:
        mt_life_reshape_end(a._life, sleeping(a))
        raise
    return ex


# no_gc: it holds the arena (which refers to nothing of it), a tuple, a dict of
# ints and a list of ints: no cycle; its finalizer ends the hold whatever the
# order of a collection.
@cython.no_gc
@cython.final
cdef class MemoryExport:
    """One class of an arena exported (made by `BufferArena.export_memory`).

    Attributes
    ----------
    tag : str
        The class.
    chunks : tuple of (int, int)
        Each physical chunk's offset from the arena's base and its bytes, in
        order; the importer maps descriptor ``i`` at its own base plus
        ``chunks[i][0]``.
    offsets : dict
        Each of the class's buffers' offset from the arena's base.
    epoch : int
        The class's epoch when exported.
    """
    cdef ArenaState a
    cdef int k
    cdef readonly str tag
    cdef readonly tuple chunks
    cdef readonly dict offsets
    cdef list _fds
    cdef uint64_t epoch_at
    cdef bint open

    def __cinit__(self):
        self._fds = []

    @property
    def epoch(self):
        """The class's epoch when exported (int)."""
        return self.epoch_at

    @property
    def is_open(self):
        """Whether it still holds the arena."""
        return self.open

    def fds(self):
        """The descriptors, one per chunk (the export's own: `close_fds` or
        `end` closes them; send them, do not close them).

        Returns
        -------
        list of int
        """
        if not self.open:
            raise MetraleError("MemoryExport.fds: the export has ended")
        return list(self._fds)

    def close_fds(self):
        """Close the descriptors (once sent, the receiver holds its own)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def end(self, written=True):
        """Close the descriptors and let the arena go (idempotent).

        Parameters
        ----------
        written : bool, optional
            Whether the memory may have been written (the descriptors were
            sent): then the class's epoch counts one more.

        Returns
        -------
        int
            The class's epoch now.
        """
        if type(written) is not bool:
            raise TypeError(f"end: written must be a bool, got {type(written).__name__}")
        self._end(written)
        return self.a._sleep_state.epoch[self.k]

    cdef void _end(self, bint written) noexcept:
        if not self.open:
            return
        self.open = False
        try:
            self.close_fds()
        except BaseException:
            pass
        if written:
            self.a._sleep_state.epoch[self.k] += 1
        mt_life_reshape_end(self.a._life, sleeping(self.a))

    def __repr__(self):
        return (f"<MemoryExport of class {self.tag!r}: {len(self.chunks)} chunks, "
                f"{sum(n for _o, n in self.chunks):,} bytes, "
                f"{'open' if self.open else 'ended'}>")

    def __dealloc__(self):
        if self.a is not None:
            self._end(True)     # unknown whether it was written: counted as written
