# The arena's lifetime word (src/life.c), compiled into this module only and
# called through it by every other module: the word keeps process-wide state
# (each thread's operation depth, the fork generation) that one copy of the C
# code per extension would split.  The contract of each function is in
# src/arena_core.h; the codes (MT_LIFE_*, MT_WAIT_*) are in _core.pxd.
from libc.stdint cimport uint64_t

from metrale._base._core cimport mt_life

cdef unsigned long mt_fork_generation() noexcept nogil
cdef mt_life *mt_life_new(int nslots) noexcept nogil
cdef void mt_life_free(mt_life *l) noexcept nogil
cdef int mt_life_enter(mt_life *l) noexcept nogil
cdef void mt_life_leave(mt_life *l) noexcept nogil
cdef int mt_life_export(mt_life *l, int slot) noexcept nogil
cdef void mt_life_unexport(mt_life *l, int slot) noexcept nogil
cdef uint64_t mt_life_exports(const mt_life *l, int slot) noexcept nogil
cdef int mt_life_close(mt_life *l) noexcept nogil
cdef void mt_life_reopen(mt_life *l) noexcept nogil
cdef int mt_life_released(const mt_life *l) noexcept nogil
cdef int mt_life_reshape_begin(mt_life *l, const unsigned char *views_ok) noexcept nogil
cdef void mt_life_reshape_end(mt_life *l, int stay_paused) noexcept nogil
cdef void mt_life_set_asleep(mt_life *l, int slot, int asleep) noexcept nogil
cdef int mt_life_forked(const mt_life *l) noexcept nogil

# Raise the exception for lifetime code `rc` (never returns normally).
# `subject` names the object ("the buffer arena", "these step inputs"),
# `what` the call; `exported` describes the live views (MT_LIFE_EXPORTED).
cdef int raise_life(int rc, str subject, str what, str exported=*) except -1
# Wait until the word's operations (MT_WAIT_OPERATIONS), or its operations
# and reshape (MT_WAIT_ALL), are done: without the GIL, in slices between
# which a signal handler may raise (KeyboardInterrupt surfaces promptly).
cdef int wait_life(mt_life *l, int until) except -1
