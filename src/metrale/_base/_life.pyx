# cython: language_level=3, binding=False
"""The lifetime word's refusals as exceptions, and its waits.

The C core (src/life.c) answers every lifetime transition with a code; this
module is the one place a code becomes an exception, so a refusal reads the
same wherever it happens (uvloop's `convert_error`), and the one place a
thread waits on the word: in bounded slices without the GIL, checking for
signals between them.
"""

from cpython.exc cimport PyErr_CheckSignals

from libc.stdint cimport uint64_t

from metrale._base._core cimport (
    MT_LIFE_BUSY, MT_LIFE_CLOSING, MT_LIFE_EXPORTED, MT_LIFE_FORKED, MT_LIFE_FULL,
    MT_LIFE_IN_FLIGHT, MT_LIFE_PAUSED, MT_LIFE_RELEASED, MT_LIFE_SELF, mt_life)

cdef extern from "arena_core.h" nogil:
    unsigned long c_fork_generation "mt_fork_generation"()
    mt_life *c_new "mt_life_new"(int nslots)
    void c_free "mt_life_free"(mt_life *l)
    int c_enter "mt_life_enter"(mt_life *l)
    void c_leave "mt_life_leave"(mt_life *l)
    int c_export "mt_life_export"(mt_life *l, int slot)
    void c_unexport "mt_life_unexport"(mt_life *l, int slot)
    uint64_t c_exports "mt_life_exports"(const mt_life *l, int slot)
    int c_close "mt_life_close"(mt_life *l)
    void c_reopen "mt_life_reopen"(mt_life *l)
    int c_wait "mt_life_wait"(mt_life *l, int until, long timeout_us)
    int c_released "mt_life_released"(const mt_life *l)
    int c_reshape_begin "mt_life_reshape_begin"(mt_life *l, const unsigned char *views_ok)
    void c_reshape_end "mt_life_reshape_end"(mt_life *l, int stay_paused)
    void c_set_asleep "mt_life_set_asleep"(mt_life *l, int slot, int asleep)
    int c_forked "mt_life_forked"(const mt_life *l)


# The C core's functions, for the other modules (_life.pxd says why here).
cdef unsigned long mt_fork_generation() noexcept nogil:
    return c_fork_generation()

cdef mt_life *mt_life_new(int nslots) noexcept nogil:
    return c_new(nslots)

cdef void mt_life_free(mt_life *l) noexcept nogil:
    c_free(l)

cdef int mt_life_enter(mt_life *l) noexcept nogil:
    return c_enter(l)

cdef void mt_life_leave(mt_life *l) noexcept nogil:
    c_leave(l)

cdef int mt_life_export(mt_life *l, int slot) noexcept nogil:
    return c_export(l, slot)

cdef void mt_life_unexport(mt_life *l, int slot) noexcept nogil:
    c_unexport(l, slot)

cdef uint64_t mt_life_exports(const mt_life *l, int slot) noexcept nogil:
    return c_exports(l, slot)

cdef int mt_life_close(mt_life *l) noexcept nogil:
    return c_close(l)

cdef void mt_life_reopen(mt_life *l) noexcept nogil:
    c_reopen(l)

cdef int mt_life_released(const mt_life *l) noexcept nogil:
    return c_released(l)

cdef int mt_life_reshape_begin(mt_life *l, const unsigned char *views_ok) noexcept nogil:
    return c_reshape_begin(l, views_ok)

cdef void mt_life_reshape_end(mt_life *l, int stay_paused) noexcept nogil:
    c_reshape_end(l, stay_paused)

cdef void mt_life_set_asleep(mt_life *l, int slot, int asleep) noexcept nogil:
    c_set_asleep(l, slot, asleep)

cdef int mt_life_forked(const mt_life *l) noexcept nogil:
    return c_forked(l)

from metrale._base.errors import MetraleError

# A slice of a wait: short enough for Ctrl-C to feel immediate.
cdef long _SLICE_US = 50000


cdef int raise_life(int rc, str subject, str what, str exported="views") except -1:
    where = f"{what}: " if what else ""
    has = "have" if subject.startswith("these ") else "has"     # "these step inputs"
    if rc == MT_LIFE_RELEASED:
        raise MetraleError(f"{where}{subject} {has} been released")
    if rc == MT_LIFE_PAUSED:
        raise MetraleError(f"{where}{subject} is sleeping (or being resized or exported): "
                           "wake it first")
    if rc == MT_LIFE_EXPORTED:
        raise BufferError(f"{where}{subject} still {has} live views ({exported}); nothing changed "
                          "and nothing was freed: drop those views and every array made from "
                          "them (numpy, DLPack, __cuda_array_interface__), then try again")
    if rc == MT_LIFE_IN_FLIGHT:
        raise MetraleError(f"{where}called from inside an operation (a logging handler, a "
                           f"finalizer) while operations on {subject} are running; nothing "
                           "changed: call it after they return")
    if rc == MT_LIFE_SELF:
        raise MetraleError(f"{where}called from inside a resize, sleep, wake or export of "
                           f"{subject} on this thread (user code run by an argument or a "
                           "finalizer, or an export_memory not ended); nothing changed: call "
                           "it after that returns")
    if rc == MT_LIFE_BUSY:
        raise MetraleError(f"{where}another resize, sleep, wake or export (export_memory) of "
                           f"{subject} is running")
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
            done = c_wait(l, until, _SLICE_US)
        if done:
            return 0
        PyErr_CheckSignals()
