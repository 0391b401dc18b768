# A guard over some of an arena's classes (see _guard.pyx): for the arena,
# which binds `guard` from there, and for metrale.torch's guarded graphs.
from libc.stdint cimport uint64_t

from metrale._arena._arena_state cimport ArenaState
from metrale._arena._sleep_state cimport SleepState


cdef class Guard:
    cdef ArenaState arena         # held: its lifetime word is read
    cdef SleepState state         # its sleep state (a reserved arena's: never None)
    cdef uint64_t mask            # the classes it covers, a bit each (_sleep_state.pxd)
    cdef tuple names              # the class of each bit, by bit ("torch" at 63)

    # The refusal's message, and the names of the classes of `bits`.
    cdef str _refusal(self)
    cdef list _classes(self, uint64_t bits)
