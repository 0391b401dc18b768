# Reserved memory of a BufferArena (see _reserve.pyx), for the arena and the
# modules that build on it (_peer: a shared arena is a reserved arena of
# exportable chunks; _sleep: sleep and wake are reshapes too).
from metrale._arena._arena_state cimport ArenaState

# Lay the arena out for `sizes` in a reservation sized for `top_sizes` (its
# Reservation and SleepState made), reserve and map; on failure nothing is left.
cdef int build(ArenaState a, object sizes, object top_sizes, bint shareable) except -1
# What a new arena starts with (init_zero buffers zeroed, fill buffers filled),
# and wait.
cdef int zero_fresh(ArenaState a) except -1
# Refuse `what` (MetraleError) for an arena with no reservation.
cdef int reserved(ArenaState a, str what) except -1
# Start a reshape (refusals named, nothing changed; views of the buffer ids in
# `views_ok` may stay alive), then wait for the operations in flight.
cdef int begin(ArenaState a, str what, object views_ok=*) except -1
