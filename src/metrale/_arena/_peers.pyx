# cython: language_level=3, binding=False
"""A shared arena's peers (docs/tensor-parallel.md): the group's shape, the
peers' slabs mapped into this process (a PeerSlabs), the pointer cells the
PeerBuffers handed out read, and what attach_peers needs to map the peers
again (the listening socket, what every rank gathered).

Made by metrale.tp at construction (the collective setup); the arena's
`_peers`.  The arena's methods over it are _peer.pyx's and _allreduce.pyx's.
"""

cimport cython

from metrale._sharing._peer_slabs cimport PeerSlabs

import itertools

from metrale._base._common import check_index
from metrale._base.errors import MetraleError
from metrale._sharing._tp_exchange import _gather_slabs, _send_all

_SERIAL = itertools.count()


# no_gc: not tracked by the cyclic collector, so that nothing it holds (its
# PeerSlabs, the cells, the socket) is cleared before the arena's finalizer
# closes it, whatever the order of a collection.  Nothing it holds refers back
# to it (PeerBuffers hold a cell and the buffer set): it can be in no cycle.
@cython.no_gc
@cython.final
cdef class Peers:
    """Peers(rank, size, local, slabs, cells, exported, buffers, bases, signals, srv=None, infos=None)
--

What a shared arena keeps of its peers (made by metrale.tp).

    Parameters
    ----------
    rank, size : int
        This rank and the group's size.
    local : tuple of int
        The ranks on this host.
    slabs : PeerSlabs
        The peers' slabs mapped here.
    cells : dict
        rank -> a one-element list of that rank's pointers by buffer id.
    exported : int
        This rank's handles exported to its peers.
    buffers : BufferSet
        The arena's buffer set.
    bases, signals : dict
        rank -> its slab's base, its signal area's address, here.
    srv : socket.socket, optional
        The socket attach_peers receives on.
    infos : list, optional
        What every rank gathered at construction.
    """

    def __init__(self, int rank, int size, tuple local, PeerSlabs slabs, dict cells, int exported,
                 buffers, dict bases, dict signals, srv=None, infos=None):
        self.rank, self.size, self.local = rank, size, local
        self.exported = exported
        self.buffers = buffers
        self.bases, self.signals, self.reduces = bases, signals, {}
        self.detached = False
        self.serial = next(_SERIAL)
        self._slabs, self._cells, self._handed = slabs, cells, {}
        self._srv, self._infos = srv, infos

    cdef tuple imported(self):
        return self._slabs.mapped()

    def cell(self, rank):
        """The pointer cell of `rank`'s buffers as mapped here, checked.

        Parameters
        ----------
        rank : int

        Returns
        -------
        list
            A one-element list of the pointers by buffer id.

        Raises
        ------
        TypeError, ValueError
            `rank` is not a rank of the group.
        MetraleError
            The peers' memory is detached, or `rank` runs on another host.
        """
        r = check_index(rank, "rank", 0, self.size - 1)
        if self.detached and r != self.rank:
            raise MetraleError("peer: the peers' memory is detached (detach_peers); "
                               "attach_peers maps it again at the same addresses")
        cell = self._cells.get(r)
        if cell is None:
            raise MetraleError(f"peer: rank {r} runs on another host (or network namespace); "
                               f"only ranks {self.local} share memory with rank {self.rank}")
        return cell

    def handed(self, int rank):
        """The PeerBuffers handed out for `rank`, or None.

        Parameters
        ----------
        rank : int
        """
        return self._handed.get(rank)

    def hand(self, int rank, peer):
        """Keep `peer`, the PeerBuffers of `rank`, for the next `handed`.

        Parameters
        ----------
        rank : int
        peer : PeerBuffers
        """
        self._handed[rank] = peer

    cdef int detach(self) except -1:
        self.detached = True            # first: a failed unmap must not leave it usable
        self._slabs.detach()
        return 0

    cdef int attach(self, object gpu, list chunks, double timeout) except -1:
        """Export this rank's memory again, send it to each local peer over
        their kept sockets, and map theirs at the addresses detach kept; the
        errors of every step raise together, the arena staying detached."""
        if not self.detached:
            raise MetraleError("attach_peers: the peers' memory is attached (detach_peers first)")
        peers = [r for r in self.local if r != self.rank]
        if peers:
            own = [tuple(c) for c in chunks] + [self._slabs.own_signal()]
            errors, gone = _send_all(gpu, self.rank, self._infos, peers, own, None, timeout)
            try:
                _gather_slabs(self._slabs, self.rank, self._infos, set(peers) - gone, self._srv,
                              timeout, {}, {}, errors, 0, attach=True)
            except Exception as e:
                errors.append(f"rank {self.rank} failed while receiving its peers' memory: "
                              f"{type(e).__name__}: {e}")
            if errors:
                raise MetraleError("attach_peers: " + "; ".join(errors))
        self.detached = False
        return 0

    cdef object close(self):
        zeros = (0,) * len(self.buffers)
        for cell in self._cells.values():
            cell[0] = zeros
        if self._srv is not None:
            self._srv.close()
            self._srv = None
        try:
            self._slabs.close()
        except Exception as e:
            return e
        return None
