# cython: language_level=3, boundscheck=False, wraparound=False, binding=False
"""Backend base class, stream handles and the host backend."""

from libc.stdint cimport uintptr_t
from libc.stdlib cimport free as c_free
from libc.string cimport memcpy, memset as c_memset

from metrale._core cimport MT_N_ZERO_ALL, mt_range

from metrale.errors import MetraleError, OutOfMemoryError

cdef extern from "<stdlib.h>" nogil:
    void *aligned_alloc(size_t alignment, size_t size)

cdef uintptr_t as_stream(object stream) except? 0:
    """A stream handle from an int, a `__cuda_stream__` object, or an object
    with `cuda_stream` (torch) or `ptr` (CuPy)."""
    if type(stream) is int:
        if stream < 0:
            raise ValueError("stream must be a non-negative handle")
        return <uintptr_t>stream
    if stream is None:
        raise TypeError("stream must be an int handle or a stream object, got None")
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        version, handle = proto()
        return <uintptr_t>int(handle)
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if handle is not None:
            return <uintptr_t>int(handle)
    if isinstance(stream, int) and not isinstance(stream, bool):
        return as_stream(int(stream))
    raise TypeError("stream must be an int handle or an object with __cuda_stream__, "
                    f"cuda_stream or ptr, got {type(stream).__name__}")


cdef class Backend:
    """Base of the memory backends; an arena calls it through cdef methods."""

    cdef int alloc(self, size_t n, uintptr_t *out) except -1:
        raise NotImplementedError
    cdef int free(self, uintptr_t p, size_t n) except -1:
        raise NotImplementedError
    cdef void free_quiet(self, uintptr_t p, size_t n) noexcept:
        pass
    cdef int memset(self, uintptr_t p, size_t n, uintptr_t stream) except -1:
        raise NotImplementedError
    cdef int zero_ranges(self, uintptr_t base, const mt_range *r, int n, uintptr_t stream) except -1:
        cdef int i
        for i in range(n):
            self.memset(base + r[i].offset, r[i].length, stream)
        return 0
    cdef int d2h(self, void *dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        raise NotImplementedError
    cdef int h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        raise NotImplementedError
    cdef int sync(self, uintptr_t stream) except -1:
        raise NotImplementedError

    def target(self):
        raise NotImplementedError

    def clear_ranges(self, ranges, stream=0):
        """Zero up to 18 (address, nbytes) ranges of this backend's memory in one
        operation: one kernel launch on CUDA (one memset for a single range), the
        same call zero_all_rows makes.  Addresses must be 16-byte aligned; ranges
        of 0 bytes are skipped.  Raw memory: nothing checks that it is yours."""
        cdef mt_range r[MT_N_ZERO_ALL]
        cdef int n = 0
        cdef uintptr_t s = as_stream(stream)
        if not isinstance(ranges, (list, tuple)):
            raise TypeError(f"ranges must be a list or tuple of (address, nbytes), got {type(ranges).__name__}")
        for item in ranges:
            if not isinstance(item, tuple) or len(item) != 2:
                raise TypeError(f"ranges: each item must be an (address, nbytes) tuple, got {item!r}")
            ptr, nbytes = item
            for what, v in (("address", ptr), ("nbytes", nbytes)):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise TypeError(f"ranges: {what} must be an int, got {type(v).__name__}")
                if v < 0 or v >= 1 << 64:
                    raise ValueError(f"ranges: {what} {v} is out of range")
            if nbytes == 0:
                continue
            if ptr == 0 or ptr % 16:
                raise ValueError(f"ranges: address {ptr:#x} must be non-zero and 16-byte aligned")
            if n == MT_N_ZERO_ALL:
                raise ValueError(f"ranges: at most {MT_N_ZERO_ALL} non-empty ranges in one call")
            r[n].offset = ptr
            r[n].length = nbytes
            n += 1
        if n:
            self.zero_ranges(0, r, n, s)


_OPS = ("alloc", "free", "memset", "d2h", "h2d", "sync")


cdef class HostBackend(Backend):
    """Host memory, synchronous: everything the arena does, with no GPU.

    Counters (read-only) let tests see what an operation cost, and
    `inject_fault(op, nth)` makes the nth next `op` fail.
    """
    cdef dict _faults

    def __cinit__(self):
        self.device_type = 1
        self.device_id = 0
        self._faults = {}

    def target(self):
        from metrale.sizes import Target
        return Target.reference()

    def inject_fault(self, op, nth=1):
        """Make the nth next `op` ("alloc", "free", "memset", "d2h", "h2d", "sync") fail."""
        if op not in _OPS:
            raise ValueError(f"op must be one of {', '.join(_OPS)}, got {op!r}")
        if type(nth) is not int or nth < 1:
            raise ValueError("nth must be an int >= 1")
        self._faults[op] = nth

    def clear_faults(self):
        self._faults.clear()

    cdef bint _fault(self, str op) except -1:
        if not self._faults:
            return False
        left = self._faults.get(op)
        if left is None:
            return False
        if left > 1:
            self._faults[op] = left - 1
            return False
        del self._faults[op]
        return True

    cdef int alloc(self, size_t n, uintptr_t *out) except -1:
        cdef void *p
        if self._fault("alloc"):
            raise OutOfMemoryError(f"host allocation of {n} bytes refused (injected fault)")
        with nogil:
            p = aligned_alloc(256, (n + 255) // 256 * 256 if n else 256)
        if p == NULL:
            raise OutOfMemoryError(f"host allocation of {n} bytes refused")
        out[0] = <uintptr_t>p
        self._note_alloc(n)
        return 0

    cdef int free(self, uintptr_t p, size_t n) except -1:
        if self._fault("free"):
            raise MetraleError(f"HOST_INJECTED_FAULT: free of {n} bytes at {p:#x} failed")
        with nogil:
            c_free(<void *>p)
        self._note_free(n)
        return 0

    cdef void free_quiet(self, uintptr_t p, size_t n) noexcept:
        c_free(<void *>p)
        self._note_free(n)

    cdef int memset(self, uintptr_t p, size_t n, uintptr_t stream) except -1:
        if self._fault("memset"):
            raise MetraleError("HOST_INJECTED_FAULT: memset failed")
        with nogil:
            c_memset(<void *>p, 0, n)
        self.memset_count += 1
        return 0

    cdef int d2h(self, void *dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        if self._fault("d2h"):
            raise MetraleError("HOST_INJECTED_FAULT: copy failed")
        with nogil:
            memcpy(dst, <void *>src, n)
        self.d2h_count += 1
        return 0

    cdef int h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        if self._fault("h2d"):
            raise MetraleError("HOST_INJECTED_FAULT: copy failed")
        with nogil:
            memcpy(<void *>dst, src, n)
        self.h2d_count += 1
        return 0

    cdef int sync(self, uintptr_t stream) except -1:
        if self._fault("sync"):
            raise MetraleError("HOST_INJECTED_FAULT: synchronize failed")
        self.sync_count += 1
        return 0

    def __repr__(self):
        return (f"HostBackend(live_alloc_count={self.live_alloc_count}, "
                f"live_bytes={self.live_bytes})")
