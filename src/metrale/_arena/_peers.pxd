# A shared arena's peers (see _peers.pyx): the group's shape, the peers' slabs
# mapped here and what attach_peers needs to map them again; the arena's one
# typed field for its sharing (ArenaState._peers).
from metrale._sharing._peer_slabs cimport PeerSlabs


cdef class Peers:
    cdef int rank, size
    cdef tuple local        # the ranks on this host (sharing memory), in order
    cdef int exported       # this rank's handles exported (chunks and signal area)
    cdef object buffers              # the arena's BufferSet (the ids)
    cdef dict bases                  # rank -> its slab's base here (own included)
    cdef dict signals                # rank -> its signal area here ({} without local peers)
    cdef dict reduces                # peer_all_reduce's parameter blocks, by buffer ids
    cdef bint detached      # detach_peers unmapped the peers' memory
    cdef object serial      # this process's shared arenas, in construction order
    cdef PeerSlabs _slabs
    cdef dict _cells                 # rank -> [pointers by buffer id]: PeerBuffers read them
    cdef dict _handed                # rank -> the PeerBuffers handed out for it
    cdef object _srv                 # the listening socket attach_peers receives on, or None
    cdef object _infos               # what every rank gathered at construction

    # (handles, bytes) of the peers' slabs mapped here.
    cdef tuple imported(self)
    # Unmap the peers' memory, keeping its addresses.
    cdef int detach(self) except -1
    # Map it again (docs/tensor-parallel.md); raises, detached, on failure.
    cdef int attach(self, object gpu, list chunks, double timeout) except -1
    # Zero the pointers handed out, close the socket, unmap the peers' slabs:
    # the first error, or None (what fails stays for the next call).
    cdef object close(self)
