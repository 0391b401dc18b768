# The backend interface the arena drives: one cdef call per device operation,
# so no Python runs per memset, copy or free.
from libc.stdint cimport uint64_t, uintptr_t
from metrale._base._core cimport mt_copy_run, mt_pool_ops, mt_range, mt_rows_args
from metrale._base._debug_core cimport mt_debug_args, mt_debug_result
from metrale._base._peer_core cimport mt_reduce_args

cdef class Backend:
    # DLPack device type of the memory (1 = CPU, 2 = CUDA) and its ordinal.
    cdef readonly int device_type
    cdef readonly int device_id
    # Counters every backend keeps, read by tests and benchmarks.
    cdef readonly Py_ssize_t alloc_count, live_alloc_count, free_count
    cdef readonly Py_ssize_t memset_count, d2h_count, h2d_count, sync_count
    cdef readonly unsigned long long live_bytes
    cdef inline void _note_alloc(self, size_t n) noexcept:
        self.alloc_count += 1
        self.live_alloc_count += 1
        self.live_bytes += n
    cdef inline void _note_free(self, size_t n) noexcept:
        self.free_count += 1
        self.live_alloc_count -= 1
        self.live_bytes -= n
    # Raise ValueError unless [p, p + n) lies inside memory this backend holds.
    cdef int check_range(self, uintptr_t p, size_t n) except -1
    cdef int alloc(self, size_t n, uintptr_t *out) except -1
    cdef int free(self, uintptr_t p, size_t n) except -1
    # Best effort from a finalizer: never raises, may skip at interpreter exit.
    cdef void free_quiet(self, uintptr_t p, size_t n) noexcept
    cdef int memset(self, uintptr_t p, size_t n, uintptr_t stream) except -1
    cdef int zero_ranges(self, uintptr_t base, const mt_range *r, int n, uintptr_t stream) except -1
    # zero_all_rows with the token count read, when the work runs, from the
    # int32 at a.count_at (kernels/zero_ranges.h); the base class reads it with
    # d2h and clears with zero_ranges.  `queue`: the arena's work counter
    # (rows_queue_lend), 0 for none.
    cdef int zero_rows_at(self, const mt_rows_args *a, uintptr_t queue, uintptr_t stream) except -1
    # A work counter for one arena's zero_rows_at launches (0: none to lend,
    # or none needed), and its return: host bookkeeping, never raises.
    cdef uintptr_t rows_queue_lend(self) noexcept
    cdef void rows_queue_return(self, uintptr_t q) noexcept
    # Host -> device copy in stream order, not waited for (capturable on CUDA):
    # src must stay unchanged until the copy has run (see the events below).
    cdef int copy_h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1
    # Events that say when queued work has run: record in stream order (a node
    # of its own in a captured graph), wait on the host.  Host backends run
    # everything at the call, so their events are always complete.
    cdef int event_create(self, uintptr_t *out) except -1
    cdef int event_record(self, uintptr_t event, uintptr_t stream) except -1
    cdef int event_wait(self, uintptr_t event) except -1
    cdef void event_destroy(self, uintptr_t event) noexcept
    cdef int d2h(self, void *dst, uintptr_t src, size_t n, uintptr_t stream) except -1
    cdef int h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1
    cdef int sync(self, uintptr_t stream) except -1
    # Virtual memory, for reserved arenas (docs/stable-addresses.md).  The base
    # class refuses; sizes and addresses are multiples of granularity().
    cdef readonly unsigned long long reserved_bytes, mapped_bytes
    cdef readonly Py_ssize_t handle_count
    cdef size_t granularity(self) except 0
    cdef int reserve(self, size_t n, uintptr_t *out) except -1
    cdef int unreserve(self, uintptr_t p, size_t n) except -1
    # A physical handle of n bytes; mapped at most once, whole.
    cdef int create(self, size_t n, uint64_t *handle) except -1
    cdef int release_handle(self, uint64_t handle, size_t n) except -1
    # Map a handle at p (inside a reservation) and make it read/write; on
    # failure nothing stays mapped.
    cdef int map(self, uintptr_t p, size_t n, uint64_t handle) except -1
    cdef int unmap(self, uintptr_t p, size_t n) except -1
    # Wait for all work on the device (before memory is unmapped).
    cdef int quiesce(self) except -1
    # An arena's pool (src/pool.c) calls its device operations from any
    # thread without the GIL (torch's allocator calls it): where the backend
    # has such operations (CUDA: the driver's) it fills `ops` and returns 1;
    # 0: the pool calls create / release_handle / map / unmap above, with
    # the GIL (and cannot serve torch).  pool_error: the exception for a
    # code those operations returned.
    cdef int pool_ops(self, mt_pool_ops *ops) except -1
    cdef object pool_error(self, int code, str call)
    # Host memory the device maps, for sleep(offload=...): a physical handle
    # in host memory (CUDA: a host-NUMA handle; host: a memfd), mapped and
    # unmapped like a device handle (map_host / unmap_host count it apart from
    # mapped_bytes, in host_mapped_bytes; it may be mapped at several places),
    # and a copy between two mapped ranges in stream order (not waited for).
    cdef readonly Py_ssize_t host_handle_count
    cdef readonly unsigned long long host_handle_bytes, host_mapped_bytes
    cdef int create_host(self, size_t n, uint64_t *handle) except -1
    cdef int release_host(self, uint64_t handle, size_t n) except -1
    cdef int map_host(self, uintptr_t p, size_t n, uint64_t handle) except -1
    cdef int unmap_host(self, uintptr_t p, size_t n) except -1
    # Whether memory can be mapped over memory of the other kind in one step,
    # so that an offload leaves no address of an offloaded buffer without
    # memory for a moment (docs/stable-addresses.md): map_host over device
    # memory, which `unmap` then leaves alone; `map_filled` / `refill` over
    # host memory, which `unmap_host` then leaves alone.  The host backend
    # can (one mmap or mremap each); CUDA maps only where nothing is mapped.
    # Mapping a host handle again where it is mapped shows it again over what
    # covers it, counted once (maps_over backends: a failed wake's undo).
    cdef bint maps_over(self)
    # maps_over backends: a handle mapped at [p, p+n) over the host memory
    # mapped there, already holding the n bytes at `src` (a staging copy).
    cdef int map_filled(self, uintptr_t p, size_t n, uint64_t handle, uintptr_t src) except -1
    # maps_over backends: the device memory of a chunk still mapped at
    # [p, p+n), under host memory mapped over it, put back holding the n
    # bytes at `src` (counted as before: the chunk never went).
    cdef int refill(self, uintptr_t p, size_t n, uintptr_t src) except -1
    cdef int copy(self, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) except -1
    # The n runs, in stream order, none overlapping another (checked by the
    # caller): each a `copy` here; CUDA: one launch per MT_COPY_RUNS runs
    # (kernels/copy_runs.cu), so many small copies cost about one.
    cdef int copy_runs(self, const mt_copy_run *runs, Py_ssize_t n, uintptr_t stream) except -1
    # A stream of the backend's own that runs beside the default stream (CUDA:
    # a non-blocking stream made with the backend; host: 0, work runs at the
    # call), for copies that overlap a wake's zeroing.
    cdef int side_stream(self, uintptr_t *out) except -1
    # Host memory for copies (pinned on CUDA), counted like the allocations.
    cdef readonly Py_ssize_t host_alloc_count, live_host_alloc_count
    cdef int host_alloc(self, size_t n, void **out) except -1
    cdef void host_free(self, void *p) noexcept
    # Debug arenas (docs/debug.md): run debug operation `op` (MT_DBG_*) over
    # the items of `a`; out[0 .. a.count) holds the results when it returns.
    # FILL is only enqueued on `stream`; the others wait for their results.
    cdef int debug_run(self, int op, mt_debug_args *a, mt_debug_result *out,
                       uintptr_t stream) except -1
    # Peer sharing, for tensor-parallel arenas (docs/tensor-parallel.md).  A
    # physical handle another process can map; export gives a new file
    # descriptor for it (the caller closes it); import makes a handle of a
    # peer's descriptor (the caller still closes the descriptor).
    cdef readonly Py_ssize_t export_count, import_count
    cdef int create_exportable(self, size_t n, uint64_t *handle) except -1
    cdef int export_handle(self, uint64_t handle, size_t n, int *fd) except -1
    cdef int import_handle(self, int fd, size_t n, uint64_t *handle) except -1
    # The tensor-parallel all-reduce of BufferArena.peer_all_reduce over the
    # parameter block `a` (kernels/peer_reduce.h), in stream order (CUDA: one
    # launch, capturable); host backends run it at the call and raise
    # MetraleError when a barrier timed out (now or before).
    cdef int peer_reduce(self, mt_reduce_args *a, uintptr_t stream) except -1
    # The address of an int32 count the device reads when the work runs
    # (`tokens_at=`): converted and checked to be 4-byte aligned (count_arg,
    # before the operation holds its arena: it may run user code), then to lie
    # in memory of this backend (check_count, while it holds it);
    # ValueError / TypeError naming `tokens_at` otherwise.
    cdef uintptr_t count_arg(self, object tokens_at) except 0
    cdef int check_count(self, uintptr_t at) except -1
