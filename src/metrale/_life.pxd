# The lifetime word's codes as exceptions (one mapping for the arena, views and
# step inputs), and the one interruptible wait on it.
from metrale._core cimport mt_life

# Raise the exception for lifetime code `rc` (never returns normally).
# `subject` names the object ("the buffer arena", "these step inputs"),
# `what` the call; `exported` describes the live views (MT_LIFE_EXPORTED).
cdef int raise_life(int rc, str subject, str what, str exported=*) except -1
# Wait until the word's operations (MT_WAIT_OPERATIONS), or its operations
# and reshape (MT_WAIT_ALL), are done: without the GIL, in slices between
# which a signal handler may raise (KeyboardInterrupt surfaces promptly).
cdef int wait_life(mt_life *l, int until) except -1
