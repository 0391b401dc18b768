# cython: language_level=3, binding=False
"""Backend base class and stream handles (the host backend: _host_backend.pyx)."""

cimport cython
from libc.stdint cimport int32_t, uint64_t, uintptr_t

from metrale._base._common cimport as_stream, u64_arg
from metrale._base._core cimport (MT_MAX_RANGES, MT_MAX_ROWS_ENTRIES, mt_copy_run, mt_pool_ops, mt_range,
                                  mt_rows_args, mt_rows_count, mt_rows_segment)
from metrale._base._debug_core cimport mt_debug_args, mt_debug_result
from metrale._base._peer_core cimport mt_reduce_args

from metrale._base.errors import MetraleError


cdef int _unusable(object backend) except -1:
    raise TypeError(f"gpu: {type(backend).__name__} does not implement the backend interface; "
                    "use HostBackend or CudaBackend")


# no_gc_clear on every backend: an arena reachable only from a reference cycle
# frees its memory through its backend in its finalizer, and the collector may
# clear the backend (which can join no cycle: it holds ints only) before it.
@cython.no_gc_clear
cdef class Backend:
    """Base of the memory backends.

    An arena calls its backend through C-level methods, so no Python runs per
    allocation, memset, copy or free.  Only `HostBackend` and `CudaBackend`
    (and their subclasses) implement that interface: an arena built on the
    base class, or on a Python subclass of it, raises TypeError.  Python
    methods a subclass defines are never called by the arena.

    Attributes
    ----------
    device_type : int
        DLPack device type of the memory: 1 (CPU) or 2 (CUDA).
    device_id : int
        Device ordinal of the memory (0 on the host).
    alloc_count : int
        Allocations made.
    live_alloc_count : int
        Allocations not freed yet.
    live_bytes : int
        Bytes of the allocations not freed yet.
    free_count : int
        Allocations freed.
    memset_count : int
        Memsets issued.
    reserved_bytes : int
        Bytes of address space reserved now (reserved arenas).
    mapped_bytes : int
        Bytes of physical memory mapped now (reserved arenas).
    handle_count : int
        Physical handles alive now (reserved arenas).
    host_handle_count : int
        Physical handles in host memory alive now (``sleep(offload=...)``).
    host_handle_bytes : int
        Their bytes.
    host_mapped_bytes : int
        Bytes of those handles mapped now (a handle mapped at two places
        counts twice); not in `mapped_bytes`.
    export_count : int
        Physical handles exported to peer processes (tensor-parallel arenas).
    import_count : int
        Peer handles imported (tensor-parallel arenas).
    d2h_count : int
        Device-to-host copies.
    h2d_count : int
        Host-to-device copies.
    sync_count : int
        Stream synchronizations.
    host_alloc_count : int
        Host buffers (pinned on CUDA) allocated for copies and step inputs.
    live_host_alloc_count : int
        Those not freed yet.

    Notes
    -----
    The counters are read-only and count operations that succeeded; they
    make cost assertions easy in tests.
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
    cdef int zero_rows_at(self, const mt_rows_args *a, uintptr_t queue, uintptr_t stream) except -1:
        # Read the count when the call runs (d2h waits for the stream's work
        # before it), then clear what the table gives for it.
        cdef int32_t count = 0
        cdef mt_range r[MT_MAX_ROWS_ENTRIES]
        cdef unsigned long long t, lo, hi
        cdef int i, n = 0
        self.d2h(&count, a.count_at, 4, stream)
        t = mt_rows_count(a, count)
        for i in range(a.n):
            mt_rows_segment(a, i, t, &lo, &hi)
            if hi > lo:
                r[n].offset = lo
                r[n].length = hi - lo
                n += 1
        if n:
            self.zero_ranges(a.base, r, n, stream)
        return 0
    cdef uintptr_t rows_queue_lend(self) noexcept:
        return 0
    cdef void rows_queue_return(self, uintptr_t q) noexcept:
        pass
    cdef int copy_h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        return _unusable(self)
    cdef int event_create(self, uintptr_t *out) except -1:
        return _unusable(self)
    cdef int event_record(self, uintptr_t event, uintptr_t stream) except -1:
        return _unusable(self)
    cdef int event_wait(self, uintptr_t event) except -1:
        return _unusable(self)
    cdef void event_destroy(self, uintptr_t event) noexcept:
        pass
    cdef int d2h(self, void *dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        return _unusable(self)
    cdef int h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        return _unusable(self)
    cdef int sync(self, uintptr_t stream) except -1:
        return _unusable(self)
    cdef size_t granularity(self) except 0:
        _unusable(self)
        return 0
    cdef int reserve(self, size_t n, uintptr_t *out) except -1:
        return _unusable(self)
    cdef int unreserve(self, uintptr_t p, size_t n) except -1:
        return _unusable(self)
    cdef int create(self, size_t n, uint64_t *handle) except -1:
        return _unusable(self)
    cdef int release_handle(self, uint64_t handle, size_t n) except -1:
        return _unusable(self)
    cdef int map(self, uintptr_t p, size_t n, uint64_t handle) except -1:
        return _unusable(self)
    cdef int unmap(self, uintptr_t p, size_t n) except -1:
        return _unusable(self)
    cdef int quiesce(self) except -1:
        return _unusable(self)
    cdef int pool_ops(self, mt_pool_ops *ops) except -1:
        return 0
    cdef object pool_error(self, int code, str call):
        return MetraleError(f"pool.{call}: the backend's operation failed ({code})")
    cdef int create_host(self, size_t n, uint64_t *handle) except -1:
        return _unusable(self)
    cdef int release_host(self, uint64_t handle, size_t n) except -1:
        return _unusable(self)
    cdef int map_host(self, uintptr_t p, size_t n, uint64_t handle) except -1:
        # the device's own mapping call; counted as host memory
        self.map(p, n, handle)
        self.mapped_bytes -= n
        self.host_mapped_bytes += n
        return 0
    cdef int unmap_host(self, uintptr_t p, size_t n) except -1:
        self.unmap(p, n)
        self.mapped_bytes += n
        self.host_mapped_bytes -= n
        return 0
    cdef bint maps_over(self):
        return False
    cdef int map_filled(self, uintptr_t p, size_t n, uint64_t handle, uintptr_t src) except -1:
        raise MetraleError(f"{type(self).__name__} maps memory only where none is mapped")
    cdef int refill(self, uintptr_t p, size_t n, uintptr_t src) except -1:
        raise MetraleError(f"{type(self).__name__} maps memory only where none is mapped")
    cdef int copy(self, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        return _unusable(self)
    cdef int copy_runs(self, const mt_copy_run *runs, Py_ssize_t n, uintptr_t stream) except -1:
        cdef Py_ssize_t i
        for i in range(n):
            if runs[i].length:
                self.copy(<uintptr_t>runs[i].dst, <uintptr_t>runs[i].src, <size_t>runs[i].length, stream)
        return 0
    cdef int side_stream(self, uintptr_t *out) except -1:
        return _unusable(self)
    cdef int host_alloc(self, size_t n, void **out) except -1:
        return _unusable(self)
    cdef void host_free(self, void *p) noexcept:
        pass
    cdef int debug_run(self, int op, mt_debug_args *a, mt_debug_result *out,
                       uintptr_t stream) except -1:
        return _unusable(self)
    cdef int create_exportable(self, size_t n, uint64_t *handle) except -1:
        return _unusable(self)
    cdef int export_handle(self, uint64_t handle, size_t n, int *fd) except -1:
        return _unusable(self)
    cdef int import_handle(self, int fd, size_t n, uint64_t *handle) except -1:
        return _unusable(self)
    cdef int peer_reduce(self, mt_reduce_args *a, uintptr_t stream) except -1:
        return _unusable(self)

    cdef uintptr_t count_arg(self, object tokens_at) except 0:
        cdef uintptr_t at = u64_arg(tokens_at, "tokens_at")
        if at == 0 or at % 4:
            raise ValueError(f"tokens_at must be the 4-byte aligned address of an int32, got {at:#x}")
        return at

    cdef int check_count(self, uintptr_t at) except -1:
        try:
            self.check_range(at, 4)
        except ValueError:
            raise ValueError(f"tokens_at: {at:#x} is not inside memory of "
                             f"{type(self).__name__} (the arena's backend)") from None
        return 0

    def allocation_granularity(self):
        """The unit a reserved arena's buffers are placed and mapped in.

        Returns
        -------
        int
            The host's page size for `HostBackend`; the device's minimum
            physical allocation granularity for `CudaBackend` (2 MiB on
            H100 / H200).

        Raises
        ------
        MetraleError
            The backend has no virtual memory (the base class), or the
            driver failed.
        """
        return self.granularity()

    def target(self):
        """The target arenas on this backend are sized for.

        Returns
        -------
        Target
            The SM count and split-K policy ``BufferArena.new`` sizes the
            split-K workspace for.

        Raises
        ------
        TypeError
            On the base class, which is no backend.
        """
        _unusable(self)

    def clear_ranges(self, ranges, stream=None):
        """Zero up to 32 byte ranges of this backend's memory in one operation.

        The fused zeroing ``zero_all_rows`` uses, for your own buffers: one
        kernel launch on CUDA (one memset when a single range is non-empty),
        one memset per range on the host.  On CUDA the work is enqueued on
        `stream` and the call returns at once (it can be captured in a CUDA
        graph); keeping the memory allocated until it has run is the
        caller's part.  Every range is checked before anything is zeroed.

        Parameters
        ----------
        ranges : list or tuple of (int, int)
            ``(address, nbytes)`` tuples.  Addresses must be non-zero and
            16-byte aligned, and each range must lie inside one allocation
            of this backend: on CUDA any device allocation on its device
            (torch and CuPy ones too), on the host memory this HostBackend
            allocated.  Ranges of 0 bytes are skipped; at most 32 may be
            non-empty.
        stream : int, stream object or None, optional
            An int handle, an object with ``__cuda_stream__`` or an int
            ``cuda_stream`` / ``ptr`` attribute (cuda.core, torch, CuPy
            streams), or None, the default, for the legacy default stream.
            On the host it is checked, then ignored.

        Raises
        ------
        TypeError
            `ranges` is not a list or tuple of 2-tuples, an address or size
            is not an int, or `stream` is not a stream; or the backend is the
            base class, which is no backend.
        ValueError
            An address is 0 or not 16-byte aligned, more than 32 ranges are
            non-empty, a range is not inside one allocation of this backend,
            a value does not fit 64 bits, or the stream's protocol version is
            not 0.
        MetraleError
            The CUDA driver failed the launch or memset (or a
            FaultyBackend's armed memset failure fired).
        """
        cdef mt_range r[MT_MAX_RANGES]
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
            if n == MT_MAX_RANGES:
                raise ValueError(f"ranges: at most {MT_MAX_RANGES} non-empty ranges in one call")
            self.check_range(ptr, nbytes)
            r[n].offset = ptr
            r[n].length = nbytes
            n += 1
        if n:
            self.zero_ranges(0, r, n, s)
