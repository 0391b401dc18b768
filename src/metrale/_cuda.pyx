# cython: language_level=3, binding=False
"""CudaBackend: the arena's device operations through cuda.bindings.cydriver.

Every driver call is a direct C call (no Python object in between) made with
the GIL released.  The backend retains the device's primary context, the one
torch and CuPy use, and makes it current on whichever thread calls.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memcpy, memset as c_memset

from cuda.bindings cimport cydriver
from metrale._core cimport (
    MT_MAX_RANGES, mt_range, mt_rows_args, mt_rows_count, mt_rows_segment, mt_zero_args)
from metrale._life cimport mt_fork_generation
from metrale._backend cimport Backend
from metrale._debug_core cimport (MT_DBG_FILL, MT_DBG_FINGERPRINT, MT_DBG_MAX_ITEMS,
                                  MT_DBG_NONFINITE, mt_debug_args, mt_debug_result)
from metrale._common cimport as_stream, index_arg, u64_arg, mt_py_finalizing
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize

from threading import Lock as _Lock

from metrale.errors import MetraleError, OutOfMemoryError

# 16-byte chunks per block of the zeroing kernel: 8 KiB, two stores per thread
# of a 256-thread block.  Measured on the H200 against 256..8192 (RESULTS.md).
cdef enum:
    ZERO_THREADS = 256
    ZERO_PER = 512
    # metrale_zero_rows_at: its grid is fixed at capture, whatever the count
    # read later, so a few resident blocks per SM take the tiles in turn.
    ROWS_AT_BLOCKS_PER_SM = 8
    ROWS_AT_SPREAD = 8

# The debug kernels (kernels/debug_ops.cu, docs/debug.md): 256 threads a block,
# each block 2,048 16-byte chunks (32 KiB) of one item; one entry per MT_DBG_* op.
cdef enum:
    DBG_THREADS = 256
    DBG_PER = 2048
    DBG_OPS = 4
cdef const char *_DBG_NAMES[4]
_DBG_NAMES[0] = b"metrale_debug_fill"
_DBG_NAMES[1] = b"metrale_debug_check"
_DBG_NAMES[2] = b"metrale_debug_nonfinite"
_DBG_NAMES[3] = b"metrale_debug_fingerprint"


cdef str _err_name(cydriver.CUresult err):
    cdef const char *name = NULL
    if cydriver.cuGetErrorName(err, &name) == cydriver.CUDA_SUCCESS and name != NULL:
        return name.decode()
    return f"CUresult {<int>err}"


cdef int _check(cydriver.CUresult err, str what) except -1:
    if err == cydriver.CUDA_SUCCESS:
        return 0
    name = _err_name(err)
    if err == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
        raise OutOfMemoryError(f"{what}: {name}")
    raise MetraleError(f"{what}: {name}")


@cython.no_gc_clear         # as every backend (see _backend.pyx)
@cython.final
cdef class CudaBackend(Backend):
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
    cdef cydriver.CUdevice _dev
    cdef cydriver.CUcontext _ctx
    cdef cydriver.CUmodule _mod
    cdef cydriver.CUfunction _zero_fn, _rows_at_fn
    cdef public int _rows_at_blocks_per_sm   # grid of zero_rows_at, per SM (tuning)
    cdef public unsigned int _rows_at_per    # its tile in 16-byte chunks, a power of two (tuning)
    cdef public unsigned int _rows_at_spread # tiles a block aims at (tuning)
    cdef bint _retained
    cdef unsigned long _fork_gen     # fork()s this process descends from, when made
    cdef int _sm_count, _cc_major, _cc_minor
    cdef size_t _gran
    cdef readonly Py_ssize_t launch_count
    # Debug kernels, loaded by the first debug operation (a debug arena's
    # construction): their module and entry points, the device results of one
    # call and their pinned host copy, and the lock that serializes the calls
    # that use those results.
    cdef cydriver.CUmodule _dbg_mod
    cdef cydriver.CUfunction _dbg_fn[4]
    cdef cydriver.CUdeviceptr _dbg_dev
    cdef void *_dbg_host
    cdef object _dbg_lock

    def __cinit__(self, device=0):
        cdef cydriver.CUresult err
        cdef int ordinal = <int>u64_arg(device, "device", 0, 0x7FFFFFFF)
        self.device_type = 2
        self.device_id = ordinal
        self._fork_gen = mt_fork_generation()
        self._dbg_lock = _Lock()
        try:
            with nogil:
                err = cydriver.cuInit(0)
        except MetraleError:
            raise
        except Exception as e:      # cydriver raises when libcuda cannot be loaded
            raise MetraleError(f"CUDA driver unavailable: {e}") from e
        _check(err, "cuInit (is an NVIDIA driver and GPU present?)")
        _check(cydriver.cuDeviceGet(&self._dev, ordinal), f"cuDeviceGet({ordinal})")
        with nogil:
            err = cydriver.cuDevicePrimaryCtxRetain(&self._ctx, self._dev)
        _check(err, "cuDevicePrimaryCtxRetain")
        self._retained = True
        _check(cydriver.cuDeviceGetAttribute(
            &self._sm_count, cydriver.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self._dev),
            "cuDeviceGetAttribute")
        _check(cydriver.cuDeviceGetAttribute(
            &self._cc_major, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self._dev),
            "cuDeviceGetAttribute")
        _check(cydriver.cuDeviceGetAttribute(
            &self._cc_minor, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self._dev),
            "cuDeviceGetAttribute")
        self._load_kernels()

    cdef int _load_kernels(self) except -1:
        # Loaded once here, never inside a graph capture.
        from importlib.resources import files
        ptx = (files("metrale") / "kernels" / "zero_ranges.ptx").read_bytes() + b"\0"
        cdef const char *image = ptx
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuModuleLoadData(&self._mod, image)
        _check(err, "cuModuleLoadData(zero_ranges.ptx)")
        _check(cydriver.cuModuleGetFunction(&self._zero_fn, self._mod, b"metrale_zero_ranges"),
               "cuModuleGetFunction")
        _check(cydriver.cuModuleGetFunction(&self._rows_at_fn, self._mod, b"metrale_zero_rows_at"),
               "cuModuleGetFunction")
        self._rows_at_blocks_per_sm = ROWS_AT_BLOCKS_PER_SM
        self._rows_at_per = ZERO_PER
        self._rows_at_spread = ROWS_AT_SPREAD
        return 0

    def __dealloc__(self):
        if not self._retained or mt_py_finalizing() or mt_fork_generation() != self._fork_gen:
            return        # at exit the driver may already be gone (the process frees all);
                          # in a forked child every driver object is the parent's
        with nogil:
            if self._mod != NULL:
                cydriver.cuModuleUnload(self._mod)
            if self._dbg_mod != NULL:
                cydriver.cuModuleUnload(self._dbg_mod)
            if self._dbg_dev != 0:
                cydriver.cuMemFree(self._dbg_dev)
            if self._dbg_host != NULL:
                cydriver.cuMemFreeHost(self._dbg_host)
            cydriver.cuDevicePrimaryCtxRelease(self._dev)

    cdef inline int _current(self) except -1:
        cdef cydriver.CUcontext cur = NULL
        if mt_fork_generation() != self._fork_gen:
            raise MetraleError("CudaBackend: this process was forked after CUDA was initialized "
                               "in its parent; CUDA cannot be used here (use the spawn start "
                               "method, or make the backend in the child)")
        cydriver.cuCtxGetCurrent(&cur)
        if cur != self._ctx:
            _check(cydriver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        return 0

    # -- Backend interface ----------------------------------------------------------
    cdef int check_range(self, uintptr_t p, size_t n) except -1:
        # The driver knows every allocation's extent: [p, p + n) must lie in one
        # that is device memory of this backend's device.
        cdef cydriver.CUdeviceptr start = 0
        cdef size_t size = 0
        cdef int ordinal = -1
        cdef unsigned int mtype = 0
        cdef cydriver.CUpointer_attribute attrs[4]
        cdef void *data[4]
        cdef cydriver.CUresult err
        attrs[0] = cydriver.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
        attrs[1] = cydriver.CU_POINTER_ATTRIBUTE_RANGE_SIZE
        attrs[2] = cydriver.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        attrs[3] = cydriver.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
        data[0] = &start
        data[1] = &size
        data[2] = &ordinal
        data[3] = &mtype
        cdef int mapped_first = 0, mapped_last = 0
        cdef bint inside
        self._current()
        with nogil:
            # For an address the driver does not know this succeeds with start
            # 0; the singular query below would fail instead (an API error
            # under compute-sanitizer), so it runs only inside a known extent.
            err = cydriver.cuPointerGetAttributes(4, attrs, data, <cydriver.CUdeviceptr>p)
            inside = (err == cydriver.CUDA_SUCCESS and start != 0 and p >= start
                      and n <= size and p - start <= size - n)
            # Virtual-memory ranges (reserved arenas): both ends must be mapped,
            # whatever extent the driver reports for the range.
            if inside:
                err = cydriver.cuPointerGetAttribute(&mapped_first, cydriver.CU_POINTER_ATTRIBUTE_MAPPED,
                                                     <cydriver.CUdeviceptr>p)
            if inside and err == cydriver.CUDA_SUCCESS:
                err = cydriver.cuPointerGetAttribute(&mapped_last, cydriver.CU_POINTER_ATTRIBUTE_MAPPED,
                                                     <cydriver.CUdeviceptr>(p + n - 1))
        if (not inside or err != cydriver.CUDA_SUCCESS or ordinal != self.device_id
                or mtype != cydriver.CU_MEMORYTYPE_DEVICE or not mapped_first or not mapped_last):
            raise ValueError(f"ranges: [{p:#x}, +{n}) is not inside one allocation of device "
                             f"memory on device {self.device_id}")
        return 0

    cdef int alloc(self, size_t n, uintptr_t *out) except -1:
        cdef cydriver.CUdeviceptr p = 0
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuMemAlloc(&p, n)
        _check(err, f"cuMemAlloc({n} bytes)")
        out[0] = <uintptr_t>p
        self._note_alloc(n)
        return 0

    cdef int free(self, uintptr_t p, size_t n) except -1:
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuMemFree(<cydriver.CUdeviceptr>p)
        _check(err, "cuMemFree")
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
        cdef cydriver.CUresult err
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        self._current()
        with nogil:
            if (p | n) & 3 == 0:
                err = cydriver.cuMemsetD32Async(<cydriver.CUdeviceptr>p, 0, n // 4, s)
            else:
                err = cydriver.cuMemsetD8Async(<cydriver.CUdeviceptr>p, 0, n, s)
        _check(err, "cuMemsetAsync")
        self.memset_count += 1
        return 0

    cdef int zero_ranges(self, uintptr_t base, const mt_range *r, int n, uintptr_t stream) except -1:
        cdef mt_zero_args args
        cdef void *params[1]
        cdef unsigned long long blocks = 0, chunks = 0, per = ZERO_PER, nb
        cdef int order[MT_MAX_RANGES]
        cdef int i, j, k
        cdef cydriver.CUresult err
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        if n == 1:
            return self.memset(base + r[0].offset, r[0].length, stream)
        if n > MT_MAX_RANGES:
            raise MetraleError(f"zero_ranges: {n} ranges, at most {MT_MAX_RANGES}")
        # Largest range first (stable): its blocks are dispatched first and the
        # small ranges, latency-bound, fill the tail.  Measured best overall.
        for i in range(n):
            k = i
            while k > 0 and r[order[k - 1]].length < r[i].length:
                order[k] = order[k - 1]
                k -= 1
            order[k] = i
        for i in range(n):
            chunks += r[i].length // 16
        if chunks // per > 0x3FFFFFFF:          # keep the grid within 2^30 blocks
            per = chunks // 0x3FFFFFFF + 1
        c_memset(&args, 0, sizeof(args))
        args.base = base
        args.count = n
        args.per = <unsigned int>per
        for i in range(n):
            j = order[i]
            args.offset[i] = r[j].offset
            args.length[i] = r[j].length
            args.first[i] = <unsigned int>blocks
            nb = (r[j].length // 16 + per - 1) // per
            blocks += nb if nb else 1           # a range under 16 bytes still needs a block
        args.first[n] = <unsigned int>blocks
        params[0] = &args
        self._current()
        with nogil:
            err = cydriver.cuLaunchKernel(self._zero_fn, <unsigned int>blocks, 1, 1, ZERO_THREADS, 1, 1,
                                          0, s, params, NULL)
        _check(err, "cuLaunchKernel(metrale_zero_ranges)")
        self.launch_count += 1
        return 0

    cdef int zero_rows_at(self, const mt_rows_args *a, uintptr_t stream) except -1:
        cdef mt_rows_args args = a[0]
        cdef void *params[1]
        cdef unsigned int per = self._rows_at_per
        cdef unsigned long long lo, hi, tiles = 0, tile
        cdef unsigned long long blocks
        cdef int i
        cdef cydriver.CUresult err
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        if per == 0 or per & (per - 1):
            raise ValueError(f"_rows_at_per must be a power of two, got {per}")
        tile = <unsigned long long>per * 16
        # The grid covers the most the kernel can find to clear (every buffer
        # whole), capped at a few blocks per SM.
        for i in range(args.n):
            mt_rows_segment(&args, i, args.m, &lo, &hi)
            tiles += (hi - lo + tile - 1) // tile
        if tiles == 0:
            return 0
        blocks = <unsigned long long>self._sm_count * max(self._rows_at_blocks_per_sm, 1)
        if tiles < blocks:
            blocks = tiles
        args.per = per
        args.spread = max(self._rows_at_spread, 1)
        params[0] = &args
        self._current()
        with nogil:
            err = cydriver.cuLaunchKernel(self._rows_at_fn, <unsigned int>blocks, 1, 1, ZERO_THREADS,
                                          1, 1, 0, s, params, NULL)
        _check(err, "cuLaunchKernel(metrale_zero_rows_at)")
        self.launch_count += 1
        return 0

    cdef int copy_h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        cdef cydriver.CUresult err
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        self._current()
        with nogil:
            err = cydriver.cuMemcpyHtoDAsync(<cydriver.CUdeviceptr>dst, src, n, s)
        _check(err, "cuMemcpyHtoDAsync")
        self.h2d_count += 1
        return 0

    cdef int event_create(self, uintptr_t *out) except -1:
        cdef cydriver.CUevent ev = NULL
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING)
        _check(err, "cuEventCreate")
        out[0] = <uintptr_t>ev
        return 0

    cdef bint _capturing(self, cydriver.CUstream s) except -1:
        """Whether stream `s` is being captured into a graph."""
        cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuStreamIsCapturing(s, &status)
        _check(err, "cuStreamIsCapturing")
        return status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE

    cdef int event_record(self, uintptr_t event, uintptr_t stream) except -1:
        # Inside a stream capture the record is made EXTERNAL, a node of the
        # graph, so that each replay records the event (a plain record would
        # only order the capture); the driver refuses that flag outside one.
        cdef cydriver.CUresult err
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        cdef bint capturing = self._capturing(s)
        with nogil:
            if capturing:
                err = cydriver.cuEventRecordWithFlags(<cydriver.CUevent>event, s,
                                                      cydriver.CU_EVENT_RECORD_EXTERNAL)
            else:
                err = cydriver.cuEventRecord(<cydriver.CUevent>event, s)
        _check(err, "cuEventRecord")
        return 0

    cdef int event_wait(self, uintptr_t event) except -1:
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuEventSynchronize(<cydriver.CUevent>event)
        _check(err, "cuEventSynchronize")
        return 0

    cdef void event_destroy(self, uintptr_t event) noexcept:
        if mt_py_finalizing():
            return
        with nogil:
            cydriver.cuCtxSetCurrent(self._ctx)
            cydriver.cuEventDestroy(<cydriver.CUevent>event)

    cdef int d2h(self, void *dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        cdef cydriver.CUresult err
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        self._current()
        with nogil:
            err = cydriver.cuMemcpyDtoHAsync(dst, <cydriver.CUdeviceptr>src, n, s)
            if err == cydriver.CUDA_SUCCESS:
                err = cydriver.cuStreamSynchronize(s)
        _check(err, "cuMemcpyDtoH")
        self.d2h_count += 1
        return 0

    cdef int h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        cdef cydriver.CUresult err
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        self._current()
        with nogil:
            err = cydriver.cuMemcpyHtoDAsync(<cydriver.CUdeviceptr>dst, src, n, s)
            if err == cydriver.CUDA_SUCCESS:
                err = cydriver.cuStreamSynchronize(s)
        _check(err, "cuMemcpyHtoD")
        self.h2d_count += 1
        return 0

    cdef int sync(self, uintptr_t stream) except -1:
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuStreamSynchronize(<cydriver.CUstream>stream)
        _check(err, "cuStreamSynchronize")
        self.sync_count += 1
        return 0

    # -- virtual memory (reserved arenas) -----------------------------------------
    cdef inline void _prop(self, cydriver.CUmemAllocationProp *prop) noexcept:
        c_memset(prop, 0, sizeof(prop[0]))
        prop.type = cydriver.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.device_id

    cdef size_t granularity(self) except 0:
        cdef cydriver.CUmemAllocationProp prop
        cdef cydriver.CUresult err
        cdef size_t g = 0
        if self._gran == 0:
            self._prop(&prop)
            with nogil:
                err = cydriver.cuMemGetAllocationGranularity(
                    &g, &prop, cydriver.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
            _check(err, "cuMemGetAllocationGranularity")
            if g == 0:
                raise MetraleError("cuMemGetAllocationGranularity: the driver reported 0")
            self._gran = g
        return self._gran

    cdef int reserve(self, size_t n, uintptr_t *out) except -1:
        cdef cydriver.CUdeviceptr p = 0
        cdef cydriver.CUresult err
        cdef size_t g = self.granularity()
        self._current()
        with nogil:
            err = cydriver.cuMemAddressReserve(&p, n, g, 0, 0)
        if err != cydriver.CUDA_SUCCESS:
            # Whatever the driver's reason (out of memory, or no room in the
            # address space), a refused reservation is an out-of-memory.
            raise OutOfMemoryError(f"cuMemAddressReserve({n} bytes): {_err_name(err)}")
        out[0] = <uintptr_t>p
        self.reserved_bytes += n
        return 0

    cdef int unreserve(self, uintptr_t p, size_t n) except -1:
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuMemAddressFree(<cydriver.CUdeviceptr>p, n)
        _check(err, "cuMemAddressFree")
        self.reserved_bytes -= n
        return 0

    cdef int create(self, size_t n, uint64_t *handle) except -1:
        cdef cydriver.CUmemAllocationProp prop
        cdef cydriver.CUmemGenericAllocationHandle h = 0
        cdef cydriver.CUresult err
        self._prop(&prop)
        self._current()
        with nogil:
            err = cydriver.cuMemCreate(&h, n, &prop, 0)
        _check(err, f"cuMemCreate({n} bytes)")
        handle[0] = <uint64_t>h
        self.handle_count += 1
        return 0

    cdef int release_handle(self, uint64_t handle, size_t n) except -1:
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuMemRelease(<cydriver.CUmemGenericAllocationHandle>handle)
        _check(err, "cuMemRelease")
        self.handle_count -= 1
        return 0

    cdef int map(self, uintptr_t p, size_t n, uint64_t handle) except -1:
        cdef cydriver.CUmemAccessDesc desc
        cdef cydriver.CUresult err
        cdef bint mapped = False
        c_memset(&desc, 0, sizeof(desc))
        desc.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.device_id
        desc.flags = cydriver.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._current()
        with nogil:
            err = cydriver.cuMemMap(<cydriver.CUdeviceptr>p, n, 0,
                                    <cydriver.CUmemGenericAllocationHandle>handle, 0)
            if err == cydriver.CUDA_SUCCESS:
                mapped = True
                err = cydriver.cuMemSetAccess(<cydriver.CUdeviceptr>p, n, &desc, 1)
                if err != cydriver.CUDA_SUCCESS:
                    cydriver.cuMemUnmap(<cydriver.CUdeviceptr>p, n)
        _check(err, f"cuMemSetAccess({n} bytes)" if mapped else f"cuMemMap({n} bytes)")
        self.mapped_bytes += n
        return 0

    cdef int unmap(self, uintptr_t p, size_t n) except -1:
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuMemUnmap(<cydriver.CUdeviceptr>p, n)
        _check(err, "cuMemUnmap")
        self.mapped_bytes -= n
        return 0

    cdef int quiesce(self) except -1:
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuCtxSynchronize()
        _check(err, "cuCtxSynchronize")
        self.sync_count += 1
        return 0

    cdef int host_alloc(self, size_t n, void **out) except -1:
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuMemAllocHost(out, n if n else 1)
        _check(err, f"cuMemAllocHost({n} bytes)")
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

    # -- debug arenas (docs/debug.md) ---------------------------------------------
    cdef int _debug_load(self) except -1:
        """Load the debug kernels and their result buffers, once."""
        cdef cydriver.CUresult err
        cdef cydriver.CUmodule mod = NULL
        cdef const char *image
        cdef int i
        if self._dbg_host != NULL:
            return 0
        from importlib.resources import files
        ptx = (files("metrale") / "kernels" / "debug_ops.ptx").read_bytes() + b"\0"
        image = ptx
        self._current()
        with nogil:
            err = cydriver.cuModuleLoadData(&mod, image)
        _check(err, "cuModuleLoadData(debug_ops.ptx)")
        try:
            for i in range(DBG_OPS):
                _check(cydriver.cuModuleGetFunction(&self._dbg_fn[i], mod, _DBG_NAMES[i]),
                       "cuModuleGetFunction(" + _DBG_NAMES[i].decode() + ")")
            with nogil:
                err = cydriver.cuMemAlloc(&self._dbg_dev, MT_DBG_MAX_ITEMS * sizeof(mt_debug_result))
            _check(err, "cuMemAlloc(debug results)")
            with nogil:
                err = cydriver.cuMemAllocHost(&self._dbg_host, MT_DBG_MAX_ITEMS * sizeof(mt_debug_result))
            _check(err, "cuMemAllocHost(debug results)")
        except BaseException:
            with nogil:
                if self._dbg_dev != 0:
                    cydriver.cuMemFree(self._dbg_dev)
                cydriver.cuModuleUnload(mod)
            self._dbg_dev = 0
            raise
        self._dbg_mod = mod
        return 0

    cdef int debug_run(self, int op, mt_debug_args *a, mt_debug_result *out,
                       uintptr_t stream) except -1:
        cdef unsigned long long blocks = 0, chunks = 0, per = DBG_PER, nb, total = 0
        cdef size_t nres = <size_t>a.count * sizeof(mt_debug_result)
        cdef void *params[1]
        cdef int i
        cdef cydriver.CUresult err
        cdef cydriver.CUstream s = <cydriver.CUstream>stream
        if a.count > MT_DBG_MAX_ITEMS:         # before `out` (that many entries) is touched
            raise MetraleError(f"debug operation: {a.count} items, at most {MT_DBG_MAX_ITEMS}")
        c_memset(out, 0, nres)
        if a.count == 0:
            return 0
        if op == MT_DBG_NONFINITE or op == MT_DBG_FINGERPRINT:
            for i in range(a.count):            # their kernels read whole 16-byte lanes
                if a.offset[i] & 15:
                    raise MetraleError(f"debug operation {op}: item {i} starts at "
                                       f"{a.offset[i]:#x}, not 16-byte aligned")
        with self._dbg_lock:
            if self._dbg_host == NULL and self._capturing(s):
                raise MetraleError("the debug kernels load on first use, which a stream capture "
                                   "forbids: run a debug operation (e.g. poison_rows) once "
                                   "before capturing")
            self._debug_load()
            # The grid: each item its 16-byte chunks (from the one holding its
            # first byte to the one holding its last), `per` a block.
            for i in range(a.count):
                total += ((a.offset[i] + a.length[i] + 15) >> 4) - (a.offset[i] >> 4)
            if total // per > 0x3FFFFFFF:          # keep the grid within 2^30 blocks
                per = total // 0x3FFFFFFF + 1
            for i in range(a.count):
                chunks = ((a.offset[i] + a.length[i] + 15) >> 4) - (a.offset[i] >> 4)
                a.first[i] = <unsigned int>blocks
                nb = (chunks + per - 1) // per
                blocks += nb if nb else 1
            a.first[a.count] = <unsigned int>blocks
            a.per = <unsigned int>per
            a.results = <unsigned long long>self._dbg_dev
            params[0] = a
            self._current()
            with nogil:
                err = cydriver.CUDA_SUCCESS
                if op != MT_DBG_FILL:
                    err = cydriver.cuMemsetD32Async(self._dbg_dev, 0, nres // 4, s)
                if err == cydriver.CUDA_SUCCESS:
                    err = cydriver.cuLaunchKernel(self._dbg_fn[op], <unsigned int>blocks, 1, 1,
                                                  DBG_THREADS, 1, 1, 0, s, params, NULL)
            _check(err, "cuLaunchKernel(" + _DBG_NAMES[op].decode() + ")")
            self.launch_count += 1
            if op == MT_DBG_FILL:
                return 0
            with nogil:
                err = cydriver.cuMemcpyDtoHAsync(self._dbg_host, self._dbg_dev, nres, s)
                if err == cydriver.CUDA_SUCCESS:
                    err = cydriver.cuStreamSynchronize(s)
            _check(err, "debug results: cuMemcpyDtoH")
            memcpy(out, self._dbg_host, nres)
        return 0

    # -- peer sharing (tensor-parallel arenas, docs/tensor-parallel.md) -------------
    cdef int create_exportable(self, size_t n, uint64_t *handle) except -1:
        cdef cydriver.CUmemAllocationProp prop
        cdef cydriver.CUmemGenericAllocationHandle h = 0
        cdef cydriver.CUresult err
        self._prop(&prop)
        # Requested at creation: only such a handle can be exported as an fd.
        prop.requestedHandleTypes = cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        self._current()
        with nogil:
            err = cydriver.cuMemCreate(&h, n, &prop, 0)
        _check(err, f"cuMemCreate({n} bytes, POSIX file descriptor handle)")
        handle[0] = <uint64_t>h
        self.handle_count += 1
        return 0

    cdef int export_handle(self, uint64_t handle, size_t n, int *fd) except -1:
        cdef cydriver.CUresult err
        cdef int out = -1
        self._current()
        with nogil:
            err = cydriver.cuMemExportToShareableHandle(
                <void *>&out, <cydriver.CUmemGenericAllocationHandle>handle,
                cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
        _check(err, "cuMemExportToShareableHandle")
        fd[0] = out
        self.export_count += 1
        return 0

    cdef int import_handle(self, int fd, size_t n, uint64_t *handle) except -1:
        cdef cydriver.CUresult err
        cdef cydriver.CUmemGenericAllocationHandle h = 0
        self._current()
        with nogil:
            err = cydriver.cuMemImportFromShareableHandle(
                &h, <void *><uintptr_t>fd, cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        _check(err, "cuMemImportFromShareableHandle")
        handle[0] = <uint64_t>h
        self.handle_count += 1
        self.import_count += 1
        return 0

    def mem_info(self):
        """Free and total memory of the device, as the driver reports them.

        Returns
        -------
        tuple of (int, int)
            ``(free, total)`` bytes (``cuMemGetInfo``).

        Raises
        ------
        MetraleError
            The driver call failed.
        """
        cdef size_t free_b = 0, total_b = 0
        cdef cydriver.CUresult err
        self._current()
        with nogil:
            err = cydriver.cuMemGetInfo(&free_b, &total_b)
        _check(err, "cuMemGetInfo")
        return (free_b, total_b)

    # -- Python-level helpers ------------------------------------------------------------
    def target(self):
        """The target of this device, which ``BufferArena.new`` sizes for.

        Returns
        -------
        Target
            ``Target(sm_count, "auto")`` on compute capability 9.x (Hopper),
            ``Target(sm_count, "legacy")`` on every other device.
        """
        from metrale.sizes import Target
        return Target(self._sm_count, "auto" if self._cc_major == 9 else "legacy")

    def sm_count(self):
        """The device's streaming multiprocessor count.

        Returns
        -------
        int
            The multiprocessor count the driver reports.
        """
        return self._sm_count

    def compute_capability(self):
        """The device's compute capability.

        Returns
        -------
        tuple of (int, int)
            ``(major, minor)``, for example ``(9, 0)`` on an H100 or H200.
        """
        return (self._cc_major, self._cc_minor)

    @property
    def device(self):
        """The device ordinal (int) this backend was built for."""
        return self.device_id

    def upload(self, ptr, data, stream=None):
        """Copy host bytes to device memory, and wait until the copy is done.

        The copy is enqueued on `stream`, which is then synchronized, so
        keep this out of the step loop: it is for tests, debugging and small
        tables.  For bulk data use torch or CuPy on a view.

        Parameters
        ----------
        ptr : int
            The device address to write to.
        data : bytes-like
            Any C-contiguous object of the buffer protocol (bytes, bytearray,
            memoryview, numpy array); all its bytes are copied.
        stream : int, stream object or None, optional
            The stream to copy on; None, the default, is the legacy default
            stream.  Accepts what the arena's operations accept.

        Raises
        ------
        TypeError
            `ptr` is not an int, `data` is not a C-contiguous bytes-like
            object, or `stream` is not a stream.
        ValueError
            `ptr` or the stream handle is negative or does not fit 64 bits.
        MetraleError
            The driver refused the copy (for example an address range it
            does not know) or the synchronization.
        """
        cdef uintptr_t p = u64_arg(ptr, "ptr")
        cdef uintptr_t s = as_stream(stream)
        cdef const unsigned char[::1] mv = memoryview(data).cast("B")
        if mv.shape[0]:
            self.h2d(p, &mv[0], mv.shape[0], s)

    def download(self, ptr, n, stream=None):
        """Copy device memory to a new bytes object, and wait until it is done.

        The copy is enqueued on `stream`, which is then synchronized, so
        keep this out of the step loop.

        Parameters
        ----------
        ptr : int
            The device address to read from.
        n : int
            Bytes to copy (>= 0).
        stream : int, stream object or None, optional
            The stream to copy on; None, the default, is the legacy default
            stream.

        Returns
        -------
        bytes
            The `n` bytes at `ptr`.

        Raises
        ------
        TypeError
            `ptr` or `n` is not an int, or `stream` is not a stream.
        ValueError
            `ptr` or `n` is negative or too large.
        MemoryError
            The host cannot hold `n` bytes.
        MetraleError
            The driver refused the copy or the synchronization.
        """
        cdef uintptr_t p = u64_arg(ptr, "ptr")
        cdef uintptr_t s = as_stream(stream)
        n = index_arg(n, "n", 0, 0x7FFFFFFFFFFFFFFF)
        # Copied straight into the new bytes object, before anyone can see it.
        out = PyBytes_FromStringAndSize(NULL, n)
        if n:
            self.d2h(PyBytes_AS_STRING(out), p, n, s)
        return out

    def synchronize(self, stream=None):
        """Wait until all work enqueued on `stream` has finished.

        Parameters
        ----------
        stream : int, stream object or None, optional
            The stream to wait for; None, the default, is the legacy default
            stream.

        Raises
        ------
        TypeError
            `stream` is not a stream.
        ValueError
            The stream handle is negative or does not fit 64 bits.
        MetraleError
            The driver reports an error (also one left by earlier
            asynchronous work on the stream).
        """
        self.sync(as_stream(stream))

    def __repr__(self):
        return (f"CudaBackend(device={self.device_id}, sm_count={self._sm_count}, "
                f"cc={self._cc_major}.{self._cc_minor}, live_bytes={self.live_bytes})")
