# cython: language_level=3, binding=False
"""Per-thread host scratch (the reference's ScratchSpaceManager).

The slot table lives in the C core: a thread finds its slot through a
thread-local cache with no lock, claims one with a CAS on first use, and gives
it back when the thread ends (a sentinel in a threading.local is dropped when
CPython clears the thread state, before join() returns).
"""

cimport cython
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.ref cimport PyObject
from libc.stdint cimport uint64_t

from metrale._base._core cimport (MT_ERR_LIMIT, MT_ERR_NOMEM, mt_scratch, mt_scratch_active,
                                  mt_scratch_base, mt_scratch_carve, mt_scratch_claim,
                                  mt_scratch_claim_id, mt_scratch_decref, mt_scratch_find,
                                  mt_scratch_get_stats, mt_scratch_incref, mt_scratch_max_threads,
                                  mt_scratch_new, mt_scratch_release, mt_scratch_reset,
                                  mt_scratch_reset_all, mt_scratch_reset_peaks, mt_scratch_set_user,
                                  mt_scratch_size, mt_scratch_stats, mt_scratch_used,
                                  mt_scratch_user, mt_thread_id)
from metrale._base._common cimport dtype_info, index_arg, u64_arg

from metrale._base._record import Record
from metrale._base.errors import MetraleError, OutOfMemoryError

import threading

cdef object _np = None
cdef dict _DTYPES = {}         # dtype argument -> (numpy dtype, itemsize), checked once
# Private constructor key: the classes below are made only by this module.
cdef object _TOKEN = object()


cdef object _numpy():
    global _np
    if _np is None:
        import numpy
        _np = numpy
    return _np


cdef size_t _check_size(str name, object v) except? 0:
    # Sizes stay far below SIZE_MAX so that rounding to 64 bytes cannot wrap.
    return u64_arg(v, name, 0, <size_t>-1 // 64)


cdef tuple _dtype_of(object dtype):
    """(numpy dtype, itemsize) of a `get` dtype argument.  The element types
    of ArenaView are read by the same rule (dtype_info), with the same
    meaning; any other numpy dtype object is accepted too, unless numpy cannot
    place it in raw memory (Python object fields, no fixed size)."""
    hit = None
    try:
        hit = _DTYPES.get(dtype)
    except TypeError:          # unhashable: checked below, not cached
        pass
    if hit is not None:
        return hit
    np = _numpy()
    try:
        dt = np.dtype(dtype_info(dtype)[1])
    except (TypeError, ValueError):
        if isinstance(dtype, str):
            raise
        try:
            dt = np.dtype(dtype)
        except Exception as e:
            raise TypeError(f"dtype {dtype!r} is not a numpy dtype ({e})") from None
    if dt.hasobject:
        raise ValueError(f"dtype {dt} holds Python objects; scratch holds raw bytes only")
    if dt.itemsize == 0:
        raise ValueError(f"dtype {dt} has no fixed size")
    hit = (dt, dt.itemsize)
    try:
        if len(_DTYPES) < 256:
            _DTYPES[dtype] = hit
    except TypeError:
        pass
    return hit


class ScratchStats(Record):
    """Scratch usage of a `ScratchSpaceManager` (`ScratchSpaceManager.stats`).

    Attributes
    ----------
    scratch_size : int
        Bytes of each thread's buffer.
    active_threads : int
        Threads holding a buffer now.
    max_threads : int
        The most threads that may hold one at once.
    total_allocated : int
        Bytes of every buffer allocated (kept for reuse after a thread ends).
    total_used : int
        Bytes carved now, across the active threads.
    max_thread_usage : int
        Bytes carved now by the busiest active thread.
    peak_total_used : int
        The most bytes carved at once across threads since the manager was
        made (or `ScratchSpaceManager.reset_peak_stats`); kept after threads
        exit.
    peak_thread_usage : int
        The most bytes one thread had carved at once, over the same period.
    """
    __slots__ = ("scratch_size", "active_threads", "max_threads", "total_allocated",
                 "total_used", "max_thread_usage", "peak_total_used", "peak_thread_usage")
    _defaults = {"peak_total_used": 0, "peak_thread_usage": 0}


cdef class _TableRef:
    """Holds one reference to a C slot table (taken by _hold), so the table
    outlives the manager while anything made from it lives.  Made only by
    this module."""
    cdef mt_scratch *s

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError(f"{type(self).__name__} objects come from ScratchSpaceManager.get_scratch()")

    cdef inline void _hold(self, mt_scratch *s) noexcept:
        mt_scratch_incref(s)
        self.s = s

    def __dealloc__(self):
        if self.s != NULL:
            mt_scratch_decref(self.s)


@cython.final
cdef class _Region(_TableRef):
    """Exports [ptr, ptr + n) as a writable buffer and keeps the table alive."""
    cdef unsigned char *ptr
    cdef Py_ssize_t n

    def __getbuffer__(self, Py_buffer *buf, int flags):
        PyBuffer_FillInfo(buf, self, self.ptr, self.n, 0, flags)

    def __releasebuffer__(self, Py_buffer *buf):
        pass


cdef _Region _region(mt_scratch *s, unsigned char *ptr, Py_ssize_t n):
    cdef _Region r = _Region.__new__(_Region, _TOKEN)
    r._hold(s)
    r.ptr = ptr
    r.n = n
    return r


@cython.final
cdef class ScratchSpace(_TableRef):
    """One thread's scratch buffer: a 64-byte aligned bump allocator.

    Got from `ScratchSpaceManager.get_scratch` on the thread that uses it.
    Only that thread may call its methods (others raise MetraleError, as do
    all once the thread has ended); arrays it handed out stay valid after
    the manager is gone.
    """
    cdef long slot
    cdef uint64_t claim
    cdef uint64_t tid

    cdef inline int _own(self) except -1:
        if mt_scratch_claim_id(self.s, self.slot) != self.claim or mt_thread_id() != self.tid:
            raise MetraleError("this ScratchSpace belongs to another thread "
                               "(or its thread has ended); call get_scratch() on this thread")
        return 0

    def get(self, count, dtype="float32"):
        """A zero-filled, 64-byte aligned numpy array carved from the buffer.

        Arguments are checked before anything is carved: a refused call
        consumes nothing.

        Parameters
        ----------
        count : int
            Elements.
        dtype : str, numpy.dtype or type, optional
            Element type, read as `BufferArena.view` reads it (numpy's
            names and meanings; bfloat16 and the FP8 types give raw bytes of
            their width); any other numpy dtype without Python objects is
            accepted too.  Default float32.

        Returns
        -------
        numpy.ndarray or None
            The array, or None when it does not fit the space left.

        Raises
        ------
        MetraleError
            Called from a thread that does not own this buffer.
        TypeError, ValueError
            A bad `count` or `dtype`.
        """
        cdef unsigned char *p
        cdef uint64_t n
        self._own()
        count = index_arg(count, "count")
        dt, item = _dtype_of(dtype)
        nbytes = count * item
        if nbytes > 0xFFFFFFFFFFFFFFFF:
            raise ValueError(f"count {count} of dtype {dt} is more than 2**64 - 1 bytes")
        n = nbytes
        p = mt_scratch_carve(self.s, self.slot, n)
        if p == NULL:
            return None
        return _numpy().frombuffer(_region(self.s, p, n), dtype=dt, count=count)

    def as_bytes(self):
        """The whole buffer as a writable memoryview (it keeps the memory alive).

        Returns
        -------
        memoryview

        Raises
        ------
        MetraleError
            Called from a thread that does not own this buffer.
        """
        self._own()
        return memoryview(_region(self.s, mt_scratch_base(self.s, self.slot), mt_scratch_size(self.s)))

    def reset(self):
        """Forget every carve: the next `get` starts at the beginning again.

        Arrays already handed out keep pointing at the memory, which later
        carves reuse (and zero).

        Raises
        ------
        MetraleError
            Called from a thread that does not own this buffer.
        """
        self._own()
        mt_scratch_reset(self.s, self.slot)

    def used(self):
        """Bytes carved since the last reset, alignment padding included.

        Returns
        -------
        int

        Raises
        ------
        MetraleError
            Called from a thread that does not own this buffer.
        """
        self._own()
        return mt_scratch_used(self.s, self.slot)

    def remaining(self):
        """Bytes not yet carved: ``capacity() - used()``.

        The next array starts at the next 64-byte boundary, so up to 63 of
        them may be skipped.

        Returns
        -------
        int

        Raises
        ------
        MetraleError
            Called from a thread that does not own this buffer.
        """
        self._own()
        return mt_scratch_size(self.s) - mt_scratch_used(self.s, self.slot)

    def capacity(self):
        """Bytes of the buffer (the manager's scratch_size).

        Returns
        -------
        int
        """
        return mt_scratch_size(self.s)

    def __repr__(self):
        return f"<ScratchSpace slot={self.slot} capacity={mt_scratch_size(self.s)}>"


@cython.final
cdef class _Lease(_TableRef):
    """Held in a threading.local: gives the slot back when the thread ends."""
    cdef long slot
    cdef uint64_t claim
    cdef object space

    def __dealloc__(self):
        # before _TableRef's, which drops the table reference
        if self.s != NULL:
            mt_scratch_release(self.s, self.slot, self.claim)


@cython.final
cdef class ScratchSpaceManager:
    """ScratchSpaceManager(scratch_size, max_threads)
--

    Per-thread host scratch: each thread gets its own buffer, lock-free.

    A thread's buffer is allocated on its first `get_scratch` and given back
    (kept for reuse) when the thread ends; at most `max_threads` threads
    hold one at a time.

    Parameters
    ----------
    scratch_size : int
        Bytes of each thread's buffer.
    max_threads : int
        The most threads that may hold a buffer at once.

    Raises
    ------
    TypeError, ValueError
        A bad size or count.
    OutOfMemoryError
        The slot table could not be allocated.
    """
    cdef mt_scratch *s
    cdef object _local

    def __cinit__(self, scratch_size, max_threads):
        cdef size_t size = _check_size("scratch_size", scratch_size)
        cdef size_t nthreads = _check_size("max_threads", max_threads)
        self.s = mt_scratch_new(size, nthreads)
        if self.s == NULL:
            raise OutOfMemoryError(f"cannot allocate the scratch slot table for max_threads={nthreads}")
        self._local = threading.local()

    def __dealloc__(self):
        self._local = None          # drops every thread's lease
        if self.s != NULL:
            mt_scratch_decref(self.s)

    @classmethod
    def new(cls, scratch_size, max_threads):
        """The same as ``ScratchSpaceManager(scratch_size, max_threads)``.

        Parameters
        ----------
        scratch_size : int
            Bytes of each thread's buffer.
        max_threads : int
            The most threads that may hold a buffer at once.

        Returns
        -------
        ScratchSpaceManager
        """
        return cls(scratch_size, max_threads)

    @classmethod
    def for_model(cls, hidden_dim, max_threads):
        """A manager sized for a model: ``hidden_dim * 4 * 4`` bytes per thread.

        Four float32 rows of the hidden width per thread.

        Parameters
        ----------
        hidden_dim : int
            The model's hidden size.
        max_threads : int
            The most threads that may hold a buffer at once.

        Returns
        -------
        ScratchSpaceManager

        Raises
        ------
        TypeError, ValueError
            A bad `hidden_dim` or `max_threads`.
        """
        return cls(index_arg(hidden_dim, "hidden_dim", 0, (<size_t>-1 // 64) // 16) * 16, max_threads)

    def get_scratch(self):
        """The calling thread's buffer, allocated on its first call.

        Lock-free after the first call (a thread-local cache).

        Returns
        -------
        ScratchSpace

        Raises
        ------
        MetraleError
            `max_threads` other threads already hold buffers.
        OutOfMemoryError
            The thread's buffer could not be allocated.
        """
        cdef long slot = mt_scratch_find(self.s)
        if slot >= 0:
            return <object><PyObject *>mt_scratch_user(self.s, slot)
        return self._claim()

    cdef object _claim(self):
        cdef long slot = mt_scratch_claim(self.s)
        cdef ScratchSpace space
        cdef _Lease lease
        if slot == MT_ERR_LIMIT:
            raise MetraleError(
                f"scratch thread limit reached: max_threads={mt_scratch_max_threads(self.s)} "
                "threads already hold scratch buffers")
        if slot == MT_ERR_NOMEM:
            raise OutOfMemoryError(f"cannot allocate a {mt_scratch_size(self.s)}-byte scratch buffer")
        space = ScratchSpace.__new__(ScratchSpace, _TOKEN)
        space._hold(self.s)
        space.slot = slot
        space.claim = mt_scratch_claim_id(self.s, slot)
        space.tid = mt_thread_id()
        lease = _Lease.__new__(_Lease, _TOKEN)
        lease._hold(self.s)
        lease.slot = slot
        lease.claim = space.claim
        lease.space = space
        # The lease owns the ScratchSpace; the slot keeps a borrowed pointer to it.
        self._local.lease = lease
        mt_scratch_set_user(self.s, slot, <void *>space)
        return space

    def reset_all(self):
        """Reset every thread's buffer (at the start of a generation step).

        Each owner applies it on its next access, so no thread ever writes
        another's bookkeeping; arrays handed out before are reused after.
        """
        mt_scratch_reset_all(self.s)

    def scratch_size(self):
        """Bytes of each thread's buffer.

        Returns
        -------
        int
        """
        return mt_scratch_size(self.s)

    def max_threads(self):
        """The most threads that may hold a buffer at once.

        Returns
        -------
        int
        """
        return mt_scratch_max_threads(self.s)

    def active_threads(self):
        """Threads holding a buffer now.

        Returns
        -------
        int
        """
        return mt_scratch_active(self.s)

    def stats(self):
        """Usage now and the high-water marks, as one record.

        Returns
        -------
        ScratchStats
        """
        cdef mt_scratch_stats st
        mt_scratch_get_stats(self.s, &st)
        return ScratchStats(mt_scratch_size(self.s), st.active_threads,
                            mt_scratch_max_threads(self.s), st.total_allocated,
                            st.total_used, st.max_thread_usage, st.peak_total_used,
                            st.peak_thread_usage)

    def reset_peak_stats(self):
        """Restart `ScratchStats.peak_total_used` and `peak_thread_usage` from
        the current usage (as torch.cuda.reset_peak_memory_stats does)."""
        mt_scratch_reset_peaks(self.s)

    def __repr__(self):
        return (f"ScratchSpaceManager(scratch_size={mt_scratch_size(self.s)}, "
                f"max_threads={mt_scratch_max_threads(self.s)}, "
                f"active_threads={mt_scratch_active(self.s)})")
