# Reserved memory of a BufferArena (see _reserve.pyx), for the modules that
# build on it (_peer: a shared arena is a reserved arena of exportable chunks;
# _sleep: sleep and wake are reshapes of its chunks).
from libc.stdint cimport uint64_t

from metrale._arena cimport BufferArena

# Lay the arena out for `sizes` in a reservation sized for `top_sizes`, reserve
# and map; on failure nothing is left.
cdef int build(BufferArena a, object sizes, object top_sizes) except -1

# Map what the current sizes need and is not mapped (no chunk longer than the
# arena's _piece); on failure what this call mapped is unmapped again.
cdef int commit(BufferArena a) except -1
# The (offset, bytes) runs cut in pieces of at most `piece` bytes (0: whole):
# the device chunks commit maps and the host memory of an offload.
cdef list cut(list runs, uint64_t piece)
# Unmap the chunks the current sizes no longer touch (the device waited for).
cdef int trim(BufferArena a) except -1
# Start a reshape (refusals named, nothing changed; views of the buffer ids in
# `views_ok` may stay alive), then wait for the operations in flight.
cdef int begin(BufferArena a, str what, object views_ok=*) except -1
