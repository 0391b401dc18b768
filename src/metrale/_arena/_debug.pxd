# Debug operations of a BufferArena (see _debug.pyx), for the modules that
# change what backs its memory (_reserve refills the guard bands after a
# resize or a wake).
from metrale._arena._arena_state cimport ArenaState

# Write the guard pattern over every guard band of a debug arena, and wait.
cdef int refill_guards(ArenaState a) except -1
