# Tensor-parallel sharing of a BufferArena (see _peer.pyx), for its construction.
from metrale._arena._arena_state cimport ArenaState

# A reserved arena of exportable chunks, then the collective setup with the
# group's other ranks (metrale/_arena/tp.py); on any failure, on any rank, nothing is left.
cdef int build_shared(ArenaState a, object sizes, object top_sizes, object group) except -1
