# cython: language_level=3, boundscheck=False, wraparound=False, binding=False
"""Backend base class, stream handles and the host backend."""

from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport free as c_free
from libc.string cimport memcpy, memset as c_memset

from metrale._common cimport as_stream, u64_arg
from metrale._core cimport MT_ALIGN, MT_N_ZERO_ALL, mt_range

from metrale.errors import OutOfMemoryError

cdef extern from "<stdlib.h>" nogil:
    void *aligned_alloc(size_t alignment, size_t size)


cdef int _unusable(object backend) except -1:
    raise TypeError(f"gpu: {type(backend).__name__} does not implement the backend interface; "
                    "use HostBackend or CudaBackend")


cdef class Backend:
    """Base of the memory backends; an arena calls it through cdef methods.

    Only `HostBackend` and `CudaBackend` (and their subclasses) implement the
    interface: the base refuses to serve as one.
    """

    cdef int check_range(self, uintptr_t p, size_t n) except -1:
        return _unusable(self)
    cdef int alloc(self, size_t n, uintptr_t *out) except -1:
        return _unusable(self)
    cdef int free(self, uintptr_t p, size_t n) except -1:
        return _unusable(self)
    cdef void free_quiet(self, uintptr_t p, size_t n) noexcept:
        pass
    cdef int memset(self, uintptr_t p, size_t n, uintptr_t stream) except -1:
        return _unusable(self)
    cdef int zero_ranges(self, uintptr_t base, const mt_range *r, int n, uintptr_t stream) except -1:
        cdef int i
        for i in range(n):
            self.memset(base + r[i].offset, r[i].length, stream)
        return 0
    cdef int d2h(self, void *dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        return _unusable(self)
    cdef int h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        return _unusable(self)
    cdef int sync(self, uintptr_t stream) except -1:
        return _unusable(self)

    def target(self):
        """The `Target` (SM count, split-K policy) arenas on this backend are sized for."""
        _unusable(self)

    def clear_ranges(self, ranges, stream=0):
        """Zero up to 18 (address, nbytes) ranges of this backend's memory in one
        operation: one kernel launch on CUDA (one memset for a single range), the
        same call zero_all_rows makes.  Addresses must be 16-byte aligned; ranges
        of 0 bytes are skipped.  Each range must lie inside one allocation this
        backend knows (ValueError otherwise); keeping it allocated until the work
        is done is the caller's part."""
        cdef mt_range r[MT_N_ZERO_ALL]
        cdef int n = 0
        cdef uintptr_t s = as_stream(stream)
        cdef uint64_t ptr, nbytes
        if not isinstance(ranges, (list, tuple)):
            raise TypeError(f"ranges must be a list or tuple of (address, nbytes), got {type(ranges).__name__}")
        for item in ranges:
            if not isinstance(item, tuple) or len(item) != 2:
                raise TypeError(f"ranges: each item must be an (address, nbytes) tuple, got {type(item).__name__}")
            ptr = u64_arg(item[0], "ranges: address")
            nbytes = u64_arg(item[1], "ranges: nbytes")
            if nbytes == 0:
                continue
            if ptr == 0 or ptr % 16:
                raise ValueError(f"ranges: address {ptr:#x} must be non-zero and 16-byte aligned")
            if n == MT_N_ZERO_ALL:
                raise ValueError(f"ranges: at most {MT_N_ZERO_ALL} non-empty ranges in one call")
            self.check_range(ptr, nbytes)
            r[n].offset = ptr
            r[n].length = nbytes
            n += 1
        if n:
            self.zero_ranges(0, r, n, s)


cdef class HostBackend(Backend):
    """Host memory, synchronous: everything the arena does, with no GPU.

    Counters (read-only) let tests see what an operation cost;
    metrale.testing.FaultyBackend is one that fails on demand.
    """

    def __cinit__(self):
        self.device_type = 1
        self.device_id = 0
        self._live = {}

    def target(self):
        from metrale.sizes import Target
        return Target.reference()

    cdef int check_range(self, uintptr_t p, size_t n) except -1:
        for base, size in self._live.items():
            if base <= p and n <= size and p - base <= size - n:
                return 0
        raise ValueError(f"ranges: [{p:#x}, +{n}) is not inside memory this HostBackend allocated")

    cdef int alloc(self, size_t n, uintptr_t *out) except -1:
        cdef void *p
        with nogil:
            p = aligned_alloc(MT_ALIGN, (n + MT_ALIGN - 1) // MT_ALIGN * MT_ALIGN if n else MT_ALIGN)
        if p == NULL:
            raise OutOfMemoryError(f"host allocation of {n} bytes refused")
        out[0] = <uintptr_t>p
        self._live[<uintptr_t>p] = n
        self._note_alloc(n)
        return 0

    cdef int free(self, uintptr_t p, size_t n) except -1:
        self._live.pop(p, None)
        with nogil:
            c_free(<void *>p)
        self._note_free(n)
        return 0

    cdef void free_quiet(self, uintptr_t p, size_t n) noexcept:
        if self._live is not None:
            self._live.pop(p, None)
        c_free(<void *>p)
        self._note_free(n)

    cdef int memset(self, uintptr_t p, size_t n, uintptr_t stream) except -1:
        with nogil:
            c_memset(<void *>p, 0, n)
        self.memset_count += 1
        return 0

    cdef int d2h(self, void *dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        with nogil:
            memcpy(dst, <void *>src, n)
        self.d2h_count += 1
        return 0

    cdef int h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        with nogil:
            memcpy(<void *>dst, src, n)
        self.h2d_count += 1
        return 0

    cdef int sync(self, uintptr_t stream) except -1:
        self.sync_count += 1
        return 0

    def __repr__(self):
        return (f"HostBackend(live_alloc_count={self.live_alloc_count}, "
                f"live_bytes={self.live_bytes})")
