# cython: language_level=3, binding=False
"""The arena's own state (`ArenaState`, the base of BufferArena): what the
buffers are sized for, where they are, their lifetime word, the pointers the
accessors read, and one typed field per concept whose state it holds apart
(the reservation, the sleep, the peers).  The modules of the concepts work on
this type, BufferArena (metrale/_arena/_buffer_arena.pyx) is one: imports run from the arena
down to its concepts and from them down to here, never back up.

Also the process's list of arenas (`metrale.stats`, `metrale.tp.shared_arenas`)
and the pointer table (`BufferArena.ptrs`).
"""

cimport cython
from cpython.long cimport PyLong_FromSize_t
from cpython.ref cimport PyObject
from libc.stdint cimport uint64_t

from metrale._base._common cimport mt_py_finalizing
from metrale._base._core cimport (MT_LIFE_FORKED, MT_LIFE_OK, MT_LIFE_PAUSED, MT_LIFE_RELEASED,
                                  MT_MAX_BUFFERS, MT_WAIT_ALL, mt_cursor_free, mt_cursor_new)
from metrale._base._life cimport (mt_life_close, mt_life_enter, mt_life_exports, mt_life_forked,
                                  mt_life_free, mt_life_new, mt_life_released, mt_life_reopen,
                                  raise_life, wait_life)

from metrale._base.errors import MetraleError, OutOfMemoryError
from metrale._sizing.reference import REFERENCE

cdef extern from *:
    """
    #include <structmember.h>      /* PyMemberDef (Python.h has it from 3.12 on) */

    /* The offset a __slots__ member descriptor stores its value at; -1 for
     * anything else. */
    static Py_ssize_t _member_offset(PyObject *d)
    {
        if (Py_TYPE(d) != &PyMemberDescr_Type) return -1;
        return ((PyMemberDescrObject *)d)->d_member->offset;
    }

    /* Store v in the slot at `offset` of o (a new reference; the old value
     * released). */
    static void _store(PyObject *o, Py_ssize_t offset, PyObject *v)
    {
        PyObject **slot = (PyObject **)((char *)o + offset);
        PyObject *old = *slot;
        Py_INCREF(v);
        *slot = v;
        Py_XDECREF(old);
    }
    """
    Py_ssize_t _member_offset(object d)
    void _store(object o, Py_ssize_t offset, object v)

# What a compiled accessor finds for a reference buffer the arena's set lacks
# (compared by address in metrale/_arena/_buffer_arena.pyx).
ABSENT = object()
cdef tuple _REF_ZEROS = (0,) * len(REFERENCE)
# The first of the process's arenas (their list: _arena_state.pxd), under the GIL.
cdef PyObject *_live = NULL


# no_gc_clear: BufferArena's finalizer frees the memory through _gpu and the
# concepts' state, which a gc clear would have set to None first (the RMM #931
# pattern); what they hold is no Python object (Held, C records).
@cython.no_gc_clear
cdef class ArenaState:
    """The state every BufferArena has (BufferArena is the only kind).

    Attributes
    ----------
    ptrs : ArenaPointers
        One attribute per buffer of the set, its device pointer
        (``arena.ptrs.sampler_ws``): one attribute load; 0 for an empty
        buffer and, once released, for every buffer.
    """

    def __cinit__(self, *args, **kw):
        self._ptrs = self._bytes = ()
        self._ptr_by_name = None
        self._ref_ptrs = self._ref_bytes = _REF_ZEROS     # the accessors read 46 entries
        self._tp = 1
        self._moe_cache = {}
        self._cursor = mt_cursor_new()
        self._life = mt_life_new(MT_MAX_BUFFERS)
        if self._cursor == NULL or self._life == NULL:
            raise OutOfMemoryError("cannot allocate the arena's bookkeeping")

    def __dealloc__(self):
        # After BufferArena's: the memory is freed, the bookkeeping goes last.
        if self._cursor != NULL:
            mt_cursor_free(self._cursor)
            self._cursor = NULL
        if self._life != NULL:
            mt_life_free(self._life)
            self._life = NULL

    cdef int _enter(self, object gpu) except -1:
        cdef int rc
        if gpu is not None and gpu is not self._gpu:
            raise MetraleError("this backend is not the arena's own (pass the backend the arena was built with)")
        rc = mt_life_enter(self._life)
        if rc != MT_LIFE_OK:
            refuse(self, rc, "", -1)
        return 0

    cdef str _exported(self):
        cdef uint64_t k
        parts = []
        names = self._buffers.names if self._buffers is not None else ()
        for i in range(len(names)):
            k = mt_life_exports(self._life, i)
            if k:
                parts.append(f"{names[i]}: {k} view{'s' if k > 1 else ''}")
        return ", ".join(parts) or "views being dropped right now"

    cdef tuple _pointers(self, bint room):
        return tuple(PyLong_FromSize_t(self._base + self._layout.offset[i])
                     if (self._layout.room[i] if room else self._layout.size[i]) else 0
                     for i in range(self._layout.n))

    cdef int _set_ptrs(self, tuple ptrs) except -1:
        self._ptrs = ptrs
        self._ptr_by_name = None        # made again by the next ptr()
        self._ref_ptrs = ptrs if self._buffers is REFERENCE else _by_reference(self, ptrs)
        if self.ptrs is None:
            self.ptrs = _pointer_table(self._buffers)
        _fill_table(self.ptrs, ptrs)
        return 0

    cdef int _set_bytes(self, tuple sizes) except -1:
        self._bytes = sizes
        self._ref_bytes = sizes if self._buffers is REFERENCE else _by_reference(self, sizes)
        return 0


    # -- lifetime: each concept closes what it holds -----------------------------------
    cdef int _release(self, object gpu) except -1:
        """`BufferArena.release` (its docstring says what it does)."""
        if gpu is not None and gpu is not self._gpu:
            raise MetraleError("release: this backend is not the arena's own")
        if self._pool is not None and self._pool.segments_held():
            raise MetraleError(
                f"release: torch still holds {self._pool.segments_held()} segments of the arena's pool: "
                "free what lives there first (the tensors, the CUDA graphs captured into it, "
                "then the torch MemPool: metrale.torch.close_pool(arena) says what is left)")
        rc = mt_life_close(self._life)
        if rc == MT_LIFE_RELEASED:
            if self._freeing or not self.holds():
                return 0         # released (another thread may still be freeing)
        elif rc == MT_LIFE_FORKED:
            self._set_ptrs(zeros(self))
            if self._gpu.device_type != 1:      # the device memory is the parent's
                self._base = 0
                if self._reservation is not None:
                    self._reservation.forget()
                    self._sleep_state.forget()
                if self._pool is not None:      # the parent's too: its C pool is left
                    self._pool.close_inherited()
                    self._pool = None
                return 0
        elif rc != MT_LIFE_OK:
            raise_life(rc, "the buffer arena", "release", self._exported())
        self._freeing = True        # this call frees; a concurrent release returns
        try:
            if rc == MT_LIFE_OK:
                try:
                    wait_life(self._life, MT_WAIT_ALL)
                except BaseException:   # interrupted: nothing freed, the arena as it was
                    mt_life_reopen(self._life)
                    raise
            self._set_ptrs(zeros(self))
            self.free_memory()
            if not self.holds():
                self._return_queue()
        finally:
            self._freeing = False
        return 0

    cdef int free_memory(self) except -1:
        """Free the slab, or the reservation with everything in it: each concept
        closes what it holds (the peers first: nothing may read their mappings
        after; then the pool; then the sleep, its offload's host memory and its
        copies; then the reservation, unless host memory is still mapped at the
        buffers' addresses).  What fails stays recorded for the next call; the
        first error follows."""
        if self._reservation is None:
            if self._base:
                self._gpu.free(self._alloc, self._layout.slab_bytes)
                self._base = self._alloc = 0
            return 0
        first = None
        if self._peers is not None:
            first = self._peers.close()
        if self._pool is not None:
            err = self._pool.close()
            if self._pool.closed:
                self._pool = None
            first = first or err
        err = self._sleep_state.close()         # every step is tried, whatever failed before
        first = first or err
        if not self._sleep_state.hosting():   # else host memory stays in the range
            err = self._reservation.close()
            first = first or err
            if not self._reservation.alloc:
                self._base = self._alloc = 0
        if first is not None:
            raise first
        return 0

    cdef void finalize(self) noexcept:
        """The finalizer: unlinked, and what the arena still holds freed.  No view
        and no operation can be alive here: each holds a reference.  In a forked
        child a GPU's memory is the parent's: nothing to free."""
        unlink(self)
        if self._gpu is not None and self._life != NULL and not (
                mt_life_forked(self._life) and self._gpu.device_type != 1):
            if self._reservation is not None:
                # released or not: what a failed release left behind goes now
                if self.holds() and not mt_py_finalizing():
                    try:
                        self.free_memory()
                    except Exception:
                        pass
            elif self._base:            # unreleased, or a release whose free failed
                self._gpu.free_quiet(self._alloc, self._layout.slab_bytes)
            self._base = 0
        self._return_queue()

    cdef void _return_queue(self) noexcept:
        """Give the work counter back, once the memory is freed: freeing waits
        for the device's work on it (a reservation quiesces, cuMemFree
        synchronizes), so no launch of this arena still counts on the counter
        that the next arena may be lent."""
        if self._rows_queue and self._gpu is not None:
            self._gpu.rows_queue_return(self._rows_queue)
            self._rows_queue = 0

    cdef bint holds(self):
        """Whether it still holds memory, a reservation or a handle (what
        free_memory frees): a release or a finalizer has something left to free."""
        return bool(self._base or (self._reservation is not None and (
            self._reservation.holds() or self._sleep_state.holds()))
            or (self._pool is not None and not self._pool.closed))


cdef uintptr_t rows_queue(ArenaState a) noexcept:
    if a._rows_queue == 0:
        a._rows_queue = a._gpu.rows_queue_lend()
    return a._rows_queue


cdef int refuse(ArenaState a, int rc, str what, int i) except -1:
    cdef SleepState st = a._sleep_state
    cdef uint64_t bits
    order = list(a._buffers.classes)
    if rc == MT_LIFE_PAUSED and st is not None and st.any_asleep() and len(order) > 1:
        bits = st.asleep & st.classes
        if i >= 0 and bits >> st.rec[i].cls & 1:
            raise MetraleError(f"{what}: {a._buffers.names[i]} is of the class "
                               f"{order[st.rec[i].cls]!r}, asleep: wake it first")
        asleep = [order[k] for k in range(len(order)) if bits >> k & 1]
        if i < 0:
            raise MetraleError(f"{what + ': ' if what else ''}the buffer arena's "
                               f"{'class' if len(asleep) == 1 else 'classes'} "
                               f"{', '.join(asleep)} "
                               f"{'sleeps' if len(asleep) == 1 else 'sleep'}: its operations "
                               "wait for every class to be awake (wake it first)")
    raise_life(rc, "the buffer arena", what)


cdef bint sleeping(ArenaState a):
    return a._sleep_state is not None and a._sleep_state.any_asleep()


cdef uint64_t reshapes(ArenaState a):
    return a._reservation.reshapes if a._reservation is not None else 0


# -- the process's arenas --------------------------------------------------------------------

cdef void link(ArenaState a) noexcept:
    global _live
    a._live_next = _live
    if _live != NULL:
        (<ArenaState>_live)._live_prev = <PyObject *>a
    _live = <PyObject *>a


cdef void unlink(ArenaState a) noexcept:
    global _live
    if a._live_prev != NULL:
        (<ArenaState>a._live_prev)._live_next = a._live_next
    elif _live == <PyObject *>a:
        _live = a._live_next
    if a._live_next != NULL:
        (<ArenaState>a._live_next)._live_prev = a._live_prev
    a._live_prev = a._live_next = NULL


cdef list live_arenas():
    out = []
    cdef PyObject *p = _live
    while p != NULL:
        out.append(<object>p)
        p = (<ArenaState>p)._live_next
    return out


def shared_arenas():
    """The live shared arenas of this process (`metrale.tp.shared_arenas`).

    Returns
    -------
    list of BufferArena
        Not released, in the order they were built.
    """
    shared = [a for a in live_arenas()
              if (<ArenaState>a)._peers is not None and not mt_life_released((<ArenaState>a)._life)]
    return sorted(shared, key=lambda a: (<ArenaState>a)._peers.serial)


def reserved_arenas():
    """The live reserved arenas of this process that are not shared
    (`metrale.checkpoint.prepare` puts them to sleep).

    Returns
    -------
    list of BufferArena
        Not released, in the order they were built.
    """
    return [a for a in reversed(live_arenas())     # the list is kept newest first
            if (<ArenaState>a)._reservation is not None and (<ArenaState>a)._peers is None
            and not mt_life_released((<ArenaState>a)._life)]


# -- the pointers ------------------------------------------------------------------------------

cdef tuple zeros(ArenaState a):
    z = a._buffers._cache.get("zeros")
    if z is None:
        z = a._buffers._cache["zeros"] = (0,) * len(a._buffers)
    return z


cdef tuple _by_reference(ArenaState a, tuple values):
    """`values` (by the arena's ids) by REFERENCE id, ABSENT where the set
    has no such buffer: what the compiled accessors read."""
    cdef dict index = a._index
    return tuple(values[<Py_ssize_t>index[n]] if n in index else ABSENT for n in REFERENCE.names)


cdef int _fill_table(object table, tuple values) except -1:
    # The table's class refuses assignment (it is read-only to its users): its
    # slots are stored at the offsets their member descriptors give (read once
    # per class), one store each.
    cdef Py_ssize_t i, n = len(values)
    cdef tuple offsets = _slot_offsets(type(table))
    if len(offsets) != n:
        raise MetraleError("the pointer table does not fit the arena's buffer set")
    for i in range(n):
        _store(table, offsets[i], values[i])
    return 0


cdef dict _offsets = {}


cdef tuple _slot_offsets(object cls):
    """The offsets in `cls`'s instances of its slots, in __slots__ order."""
    t = _offsets.get(cls)
    if t is None:
        t = tuple(_member_offset(cls.__dict__[n]) for n in cls.__slots__)
        if any(o <= 0 for o in t):
            raise MetraleError("the pointer table's slots are not member descriptors")
        _offsets[cls] = t
    return t


class ArenaPointers:
    """An arena's pointers, one attribute per buffer of its set, got from
    `BufferArena.ptrs` (``arena.ptrs.sampler_ws``): each one attribute load.

    Read-only to its users; the arena updates it, so it always holds the
    pointers as they are now (0 for an empty buffer, 0 for every buffer
    once the arena is released).  Iterating gives (name, pointer) pairs in
    the set's order.  Each buffer set has its own subclass, whose slots are
    the set's names.
    """

    __slots__ = ()

    def __setattr__(self, name, value):
        raise AttributeError("ArenaPointers is read-only (the arena updates it)")

    def __delattr__(self, name):
        raise AttributeError("ArenaPointers is read-only (the arena updates it)")

    def __iter__(self):
        return ((n, getattr(self, n)) for n in type(self).__slots__)

    def __getattr__(self, name):
        # Only for a name the set lacks (each buffer is a slot): say which
        # are near, as arena.ptr(name) does.  Type checkers cannot know an
        # own set's names (the stub types every attribute as int).
        from metrale._sizing._suggest import near_names
        near = near_names(name, type(self).__slots__) if isinstance(name, str) else ()
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise AttributeError(f"no buffer {name!r} in this arena's set of "
                             f"{len(type(self).__slots__)}{hint}", name=name, obj=self)

    def __reduce__(self):
        raise TypeError("ArenaPointers cannot be pickled: its pointers are this process's")

    def __repr__(self):
        names = type(self).__slots__
        shown = ", ".join(f"{n}={getattr(self, n):#x}" for n in names[:4])
        more = ", ..." if len(names) > 4 else ""
        return f"<ArenaPointers of {len(names)} buffers: {shown}{more}>"


cdef object _pointer_table(object buffers):
    """A new pointer table for a BufferSet (its class made once per set);
    the arena fills it."""
    cls = buffers._cache.get("pointers_class")
    if cls is None:
        cls = buffers._cache["pointers_class"] = type(
            "ArenaPointers", (ArenaPointers,), {"__slots__": buffers.names,
                                                "__module__": "metrale._arena._arena_state"})
    return object.__new__(cls)
