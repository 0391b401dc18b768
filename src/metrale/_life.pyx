# cython: language_level=3, binding=False
"""The lifetime word's refusals as exceptions, and its waits.

The C core (src/life.c) answers every lifetime transition with a code; this
module is the one place a code becomes an exception, so a refusal reads the
same wherever it happens (uvloop's `convert_error`), and the one place a
thread waits on the word: in bounded slices without the GIL, checking for
signals between them.
"""

from cpython.exc cimport PyErr_CheckSignals

from metrale._core cimport (
    MT_LIFE_BUSY, MT_LIFE_CLOSING, MT_LIFE_EXPORTED, MT_LIFE_FORKED, MT_LIFE_FULL,
    MT_LIFE_IN_FLIGHT, MT_LIFE_PAUSED, MT_LIFE_RELEASED, MT_LIFE_SELF, mt_life, mt_life_wait)

from metrale.errors import MetraleError

# A slice of a wait: short enough for Ctrl-C to feel immediate.
cdef long _SLICE_US = 50000


cdef int raise_life(int rc, str subject, str what, str exported="views") except -1:
    where = f"{what}: " if what else ""
    has = "have" if subject.startswith("these ") else "has"     # "these step inputs"
    if rc == MT_LIFE_RELEASED:
        raise MetraleError(f"{where}{subject} {has} been released")
    if rc == MT_LIFE_PAUSED:
        raise MetraleError(f"{where}{subject} is sleeping (or being resized): wake it first")
    if rc == MT_LIFE_EXPORTED:
        raise BufferError(f"{where}{subject} still {has} live views ({exported}); nothing changed "
                          "and nothing was freed: drop those views and every array made from "
                          "them (numpy, DLPack, __cuda_array_interface__), then try again")
    if rc == MT_LIFE_IN_FLIGHT:
        raise MetraleError(f"{where}called from inside an operation (a logging handler, a "
                           f"finalizer) while operations on {subject} are running; nothing "
                           "changed: call it after they return")
    if rc == MT_LIFE_SELF:
        raise MetraleError(f"{where}called from inside a resize, sleep or wake of {subject} on "
                           "this thread (user code run by an argument or a finalizer); nothing "
                           "changed: call it after that returns")
    if rc == MT_LIFE_BUSY:
        raise MetraleError(f"{where}another resize, sleep or wake of {subject} is running")
    if rc == MT_LIFE_CLOSING:
        raise MetraleError(f"{where}a release of {subject} is pending (it was refused while "
                           "views were alive): no new view can be made")
    if rc == MT_LIFE_FORKED:
        raise MetraleError(f"{where}{subject} was inherited across fork(): in the child it can "
                           "only be released (docs/lifetime.md)")
    if rc == MT_LIFE_FULL:
        raise MetraleError(f"{where}too many operations or views of {subject} at once")
    raise MetraleError(f"{where}{subject}: unknown lifetime code {rc}")


cdef int wait_life(mt_life *l, int until) except -1:
    cdef int done = 0
    while True:
        with nogil:
            done = mt_life_wait(l, until, _SLICE_US)
        if done:
            return 0
        PyErr_CheckSignals()
