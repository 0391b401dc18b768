# cython: language_level=3, binding=False
"""CudaBackend: the arena's device operations on an NVIDIA GPU.

A CudaDevice (_cuda_device.pyx: the device's primary context, made current
on whichever thread calls, and what is loaded with it) with the operations:
allocations, memsets, copies, events; its kernels, launched by _kernels.pyx;
its physical memory, through _vmm.pyx.
Every driver call is a direct C call into cuda.bindings.cydriver (no Python
object in between) made with the GIL released and checked by _driver.pxd.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport free, malloc

from cuda.bindings cimport cydriver
from metrale._backends cimport _kernels
from metrale._backends cimport _vmm
from metrale._base._core cimport mt_copy_run, mt_pool_ops, mt_range, mt_rows_args
from metrale._backends._cuda_device cimport CudaDevice
from metrale._base._debug_core cimport MT_DBG_FILL, mt_debug_args, mt_debug_result
from metrale._base._peer_core cimport MT_RED_BLOCKS, mt_reduce_args
from metrale._base._common cimport mt_py_finalizing
from metrale._base._driver cimport check, error_name

from metrale._base.errors import MetraleError, OutOfMemoryError


# Not final: metrale.testing.FaultyCudaBackend fails its operations on demand.
@cython.no_gc_clear         # as every backend (see _backend.pyx)
cdef class CudaBackend(CudaDevice):
    """CudaBackend(device=0)
--

An NVIDIA GPU through the CUDA driver.

    Construction retains the device's primary context, the one torch and
    CuPy use, so pointers move freely between metrale, torch and CuPy; reads
    the SM count and compute capability; and loads the zeroing kernel once.
    Before each driver call the backend makes its context current on the
    calling thread, without restoring the previous one afterwards.  Every
    driver call is a direct C call made with the GIL released.  Build one per
    device and share it: it is safe to use from many threads.  The context is
    released when the backend is garbage-collected.

    Parameters
    ----------
    device : int, optional
        The device ordinal (default 0).

    Attributes
    ----------
    launch_count : int
        Kernel launches made (read-only; besides the counters of `Backend`).

    Raises
    ------
    TypeError
        `device` is not an int.
    ValueError
        `device` is negative or above 2**31 - 1.
    MetraleError
        No usable driver or GPU, or a driver call failed; the message names
        the call and the driver's error.
    OutOfMemoryError
        The driver ran out of memory while setting up the context or
        loading the zeroing kernel.
    """
    # -- Backend interface ----------------------------------------------------------
    cdef int check_range(self, uintptr_t p, size_t n) except -1:
        cdef bint inside
        with nogil:
            self._current()
            inside = _vmm.inside(p, n, self.device_id)
        if not inside:
            raise ValueError(f"ranges: [{p:#x}, +{n}) is not inside one allocation of device "
                             f"memory on device {self.device_id}")
        return 0

    cdef int alloc(self, size_t n, uintptr_t *out) except -1:
        cdef cydriver.CUdeviceptr p = 0
        with nogil:
            self._current()
            check(cydriver.cuMemAlloc(&p, n), "cuMemAlloc", NULL, n)
        out[0] = <uintptr_t>p
        self._note_alloc(n)
        return 0

    cdef int free(self, uintptr_t p, size_t n) except -1:
        with nogil:
            self._current()
            check(cydriver.cuMemFree(<cydriver.CUdeviceptr>p), "cuMemFree")
        self._note_free(n)
        return 0

    cdef void free_quiet(self, uintptr_t p, size_t n) noexcept:
        cdef cydriver.CUresult err
        if mt_py_finalizing():
            return
        with nogil:
            cydriver.cuCtxSetCurrent(self._ctx)
            err = cydriver.cuMemFree(<cydriver.CUdeviceptr>p)
        if err == cydriver.CUDA_SUCCESS:
            self._note_free(n)

    cdef int memset(self, uintptr_t p, size_t n, uintptr_t stream) except -1:
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        with nogil:
            self._current()
            if (p | n) & 3 == 0:
                check(cydriver.cuMemsetD32Async(<cydriver.CUdeviceptr>p, 0, n // 4, s), "cuMemsetD32Async")
            else:
                check(cydriver.cuMemsetD8Async(<cydriver.CUdeviceptr>p, 0, n, s), "cuMemsetD8Async")
        self.memset_count += 1
        return 0

    cdef int zero_ranges(self, uintptr_t base, const mt_range *r, int n, uintptr_t stream) except -1:
        if n == 1:
            return self.memset(base + r[0].offset, r[0].length, stream)
        with nogil:
            self._current()
            _kernels.zero_ranges(&self._zero, base, r, n, <cydriver.CUstream>stream)
        self.launch_count += 1
        return 0

    cdef int zero_rows_at(self, const mt_rows_args *a, uintptr_t queue, uintptr_t stream) except -1:
        cdef int launched
        with nogil:
            self._current()
            launched = _kernels.zero_rows_at(&self._zero, a, queue, self._sm_count,
                                             <cydriver.CUstream>stream)
        self.launch_count += launched
        return 0

    cdef uintptr_t rows_queue_lend(self) noexcept:
        return _kernels.queue_lend(&self._zero)

    cdef void rows_queue_return(self, uintptr_t q) noexcept:
        _kernels.queue_return(&self._zero, q)

    cdef int copy_h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        with nogil:
            self._current()
            check(cydriver.cuMemcpyHtoDAsync(<cydriver.CUdeviceptr>dst, src, n, <cydriver.CUstream>stream),
                  "cuMemcpyHtoDAsync")
        self.h2d_count += 1
        return 0

    cdef int event_create(self, uintptr_t *out) except -1:
        cdef cydriver.CUevent ev = NULL
        with nogil:
            self._current()
            check(cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        out[0] = <uintptr_t>ev
        return 0

    cdef int event_record(self, uintptr_t event, uintptr_t stream) except -1:
        # Inside a stream capture the record is made EXTERNAL, a node of the
        # graph, so that each replay records the event (a plain record would
        # only order the capture); the driver refuses that flag outside one.
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        with nogil:
            self._current()
            if self._capturing(s):
                check(cydriver.cuEventRecordWithFlags(<cydriver.CUevent>event, s,
                                                      cydriver.CU_EVENT_RECORD_EXTERNAL),
                      "cuEventRecordWithFlags")
            else:
                check(cydriver.cuEventRecord(<cydriver.CUevent>event, s), "cuEventRecord")
        return 0

    cdef int event_wait(self, uintptr_t event) except -1:
        with nogil:
            self._current()
            check(cydriver.cuEventSynchronize(<cydriver.CUevent>event), "cuEventSynchronize")
        return 0

    cdef void event_destroy(self, uintptr_t event) noexcept:
        if mt_py_finalizing():
            return
        with nogil:
            cydriver.cuCtxSetCurrent(self._ctx)
            cydriver.cuEventDestroy(<cydriver.CUevent>event)

    cdef int d2h(self, void *dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        with nogil:
            self._current()
            check(cydriver.cuMemcpyDtoHAsync(dst, <cydriver.CUdeviceptr>src, n, s), "cuMemcpyDtoHAsync")
            check(cydriver.cuStreamSynchronize(s), "cuStreamSynchronize")
        self.d2h_count += 1
        return 0

    cdef int h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        with nogil:
            self._current()
            check(cydriver.cuMemcpyHtoDAsync(<cydriver.CUdeviceptr>dst, src, n, s), "cuMemcpyHtoDAsync")
            check(cydriver.cuStreamSynchronize(s), "cuStreamSynchronize")
        self.h2d_count += 1
        return 0

    cdef int sync(self, uintptr_t stream) except -1:
        with nogil:
            self._current()
            check(cydriver.cuStreamSynchronize(<cydriver.CUstream>stream), "cuStreamSynchronize")
        self.sync_count += 1
        return 0

    cdef int quiesce(self) except -1:
        with nogil:
            self._current()
            check(cydriver.cuCtxSynchronize(), "cuCtxSynchronize")
        self.sync_count += 1
        return 0

    cdef int host_alloc(self, size_t n, void **out) except -1:
        with nogil:
            self._current()
            check(cydriver.cuMemAllocHost(out, n if n else 1), "cuMemAllocHost", NULL, n)
        self.host_alloc_count += 1
        self.live_host_alloc_count += 1
        return 0

    cdef void host_free(self, void *p) noexcept:
        if mt_py_finalizing():
            return
        with nogil:
            cydriver.cuCtxSetCurrent(self._ctx)
            cydriver.cuMemFreeHost(p)
        self.live_host_alloc_count -= 1

    # -- physical memory: reserved and tensor-parallel arenas (_vmm.pyx) -------------
    cdef size_t granularity(self) except 0:
        if self._gran == 0:
            with nogil:
                _vmm.granularity(self.device_id, &self._gran)
        return self._gran

    cdef int reserve(self, size_t n, uintptr_t *out) except -1:
        cdef size_t g = self.granularity()
        with nogil:
            self._current()
            _vmm.reserve(n, g, out)
        self.reserved_bytes += n
        return 0

    cdef int unreserve(self, uintptr_t p, size_t n) except -1:
        with nogil:
            self._current()
            _vmm.unreserve(p, n)
        self.reserved_bytes -= n
        return 0

    cdef int create(self, size_t n, uint64_t *handle) except -1:
        return self._create(n, False, handle)

    cdef int create_exportable(self, size_t n, uint64_t *handle) except -1:
        return self._create(n, True, handle)

    cdef int _create(self, size_t n, bint exportable, uint64_t *handle) except -1:
        with nogil:
            self._current()
            _vmm.create(self.device_id, n, exportable, handle)
        self.handle_count += 1
        return 0

    cdef int release_handle(self, uint64_t handle, size_t n) except -1:
        with nogil:
            self._current()
            _vmm.release(handle)
        self.handle_count -= 1
        return 0

    cdef int create_host(self, size_t n, uint64_t *handle) except -1:
        with nogil:
            self._current()
            _vmm.create_host(self.device_id, n, handle)
        self.host_handle_count += 1
        self.host_handle_bytes += n
        return 0

    cdef int release_host(self, uint64_t handle, size_t n) except -1:
        with nogil:
            self._current()
            _vmm.release(handle)
        self.host_handle_count -= 1
        self.host_handle_bytes -= n
        return 0

    cdef int side_stream(self, uintptr_t *out) except -1:
        out[0] = <uintptr_t>self._side
        return 0

    cdef int copy(self, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        with nogil:
            self._current()
            check(cydriver.cuMemcpyAsync(<cydriver.CUdeviceptr>dst, <cydriver.CUdeviceptr>src, n,
                                         <cydriver.CUstream>stream), "cuMemcpyAsync")
        return 0

    cdef int copy_runs(self, const mt_copy_run *runs, Py_ssize_t n, uintptr_t stream) except -1:
        # The kernel takes the runs whose ends are both 16-byte aligned (a
        # tensor's storage starts at least so; torch's caching allocator and
        # the arenas align to 512 and 256 bytes), cuMemcpyAsync the others; a
        # single run, or a capture before the kernel is loaded, copies alone.
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        cdef mt_copy_run *ok = NULL
        cdef Py_ssize_t i, m = 0
        cdef bint capturing = False
        cdef int launches = 0
        cdef bint kernel = n >= 2
        if kernel and self._copy.mod == NULL:
            with nogil:
                self._current()
                capturing = self._capturing(s)
            if capturing:
                kernel = False
            else:
                with self._debug_lock:
                    with nogil:
                        self._current()
                    _kernels.copy_load(&self._copy)
        ok = <mt_copy_run *>malloc(<size_t>n * sizeof(mt_copy_run) if kernel else 1)
        if ok == NULL:
            raise MemoryError(f"copy_runs: a table of {n} runs")
        try:
            with nogil:
                self._current()
                for i in range(n):
                    if runs[i].length == 0:
                        continue
                    if kernel and (runs[i].dst | runs[i].src) & 15 == 0:
                        ok[m] = runs[i]
                        m += 1
                    else:
                        check(cydriver.cuMemcpyAsync(<cydriver.CUdeviceptr>runs[i].dst,
                                                     <cydriver.CUdeviceptr>runs[i].src,
                                                     <size_t>runs[i].length, s), "cuMemcpyAsync")
                if m:
                    launches = _kernels.copy_runs(&self._copy, ok, m, s)
        finally:
            free(ok)
        self.launch_count += launches
        return 0

    cdef int pool_ops(self, mt_pool_ops *ops) except -1:
        self._pool_dev.device = self.device_id
        self._pool_dev.ctx = self._ctx
        _vmm.pool_ops(ops, &self._pool_dev)
        return 1

    cdef object pool_error(self, int code, str call):
        msg = f"pool.{call}: {error_name(<cydriver.CUresult>code)}"
        if code == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
            return OutOfMemoryError(msg)
        return MetraleError(msg)

    cdef int map(self, uintptr_t p, size_t n, uint64_t handle) except -1:
        with nogil:
            self._current()
            _vmm.map(p, n, handle, self.device_id)
        self.mapped_bytes += n
        return 0

    cdef int unmap(self, uintptr_t p, size_t n) except -1:
        with nogil:
            self._current()
            _vmm.unmap(p, n)
        self.mapped_bytes -= n
        return 0

    cdef int export_handle(self, uint64_t handle, size_t n, int *fd) except -1:
        with nogil:
            self._current()
            _vmm.export_fd(handle, fd)
        self.export_count += 1
        return 0

    cdef int import_handle(self, int fd, size_t n, uint64_t *handle) except -1:
        with nogil:
            self._current()
            _vmm.import_fd(fd, handle)
        self.handle_count += 1
        self.import_count += 1
        return 0

    # -- the tensor-parallel all-reduce (docs/tensor-parallel.md) -----------------
    cdef int peer_reduce(self, mt_reduce_args *a, uintptr_t stream) except -1:
        if a == NULL:           # an arena is being shared: load the kernel, outside any capture
            with self._debug_lock:
                with nogil:
                    self._current()
                _kernels.peer_load(&self._peer)
            return 0
        if self._peer.mod == NULL:
            raise MetraleError("peer_all_reduce: the kernel is not loaded (the arena is not shared)")
        a.blocks = MT_RED_BLOCKS
        with nogil:
            self._current()
            _kernels.peer_reduce(&self._peer, a, <cydriver.CUstream>stream)
        self.launch_count += 1
        return 0

    # -- debug arenas (docs/debug.md) ---------------------------------------------
    cdef int debug_run(self, int op, mt_debug_args *a, mt_debug_result *out,
                       uintptr_t stream) except -1:
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        cdef bint capturing
        if _kernels.debug_check(op, a, out) == 0:      # no items
            return 0
        with self._debug_lock:
            if self._debug.host == NULL:
                with nogil:
                    self._current()
                    capturing = self._capturing(s)
                if capturing:
                    raise MetraleError("the debug kernels load on first use, which a stream capture "
                                       "forbids: run a debug operation (e.g. poison_rows) once "
                                       "before capturing")
                _kernels.debug_load(&self._debug)
            with nogil:
                self._current()
                _kernels.debug_launch(&self._debug, op, a, s)
            self.launch_count += 1
            if op != MT_DBG_FILL:
                with nogil:
                    _kernels.debug_results(&self._debug, out, a.count, s)
        return 0
