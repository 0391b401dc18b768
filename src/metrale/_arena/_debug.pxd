# Debug operations of a BufferArena (see _debug.pyx), for the modules that
# change what backs its memory (_reserve refills the guard bands after a
# resize or a wake).
from libc.stdint cimport uintptr_t

from metrale._arena._arena_state cimport ArenaState
from metrale._backends._backend cimport Backend

# Write the guard pattern over every guard band of a debug arena (of buffers
# `ids` only, where given), and wait.
cdef int refill_guards(ArenaState a, list ids=*) except -1
# Write each (offset, bytes, 16-byte pattern) span from `base` with its
# pattern (byte pattern[o % 16] at slab offset o), on `stream`, not waited for
# (the fill kernel of the debug operations; the wake contracts' fills).
cdef int fill_spans(Backend be, uintptr_t base, list spans, uintptr_t stream) except -1
