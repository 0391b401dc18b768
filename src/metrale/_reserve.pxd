# Reserved memory of a BufferArena (see _reserve.pyx), for the modules that
# build on it (_peer: a shared arena is a reserved arena of exportable chunks).
from metrale._arena cimport BufferArena

# Lay the arena out for `sizes` in a reservation sized for `top_sizes`, reserve
# and map; on failure nothing is left.
cdef int build(BufferArena a, object sizes, object top_sizes) except -1
