# cython: language_level=3, binding=False
"""Device memory as the CUDA driver maps it: the virtual-memory calls.

Address reservations, physical handles, their mappings, their sharing with
peer processes as POSIX file descriptors, and the driver's view of an address
range, as module functions (declared in _vmm.pxd) that CudaBackend calls
without the GIL; cuda.core keeps virtual memory in a module of its own the
same way.  The caller makes the context current and keeps the backend's
counters.
"""

from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memset

from cuda.bindings cimport cydriver
from metrale._base._core cimport mt_pool_ops
from metrale._base._driver cimport check, raise_error


cdef inline void _prop(cydriver.CUmemAllocationProp *prop, int device) noexcept nogil:
    memset(prop, 0, sizeof(prop[0]))
    prop.type = cydriver.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device


cdef bint inside(uintptr_t p, size_t n, int device) noexcept nogil:
    # The driver knows every allocation's extent: [p, p + n) must lie in one
    # that is device memory of `device`.
    cdef cydriver.CUdeviceptr start = 0
    cdef size_t size = 0
    cdef int ordinal = -1, mapped_first = 0, mapped_last = 0
    cdef unsigned int mtype = 0
    cdef cydriver.CUpointer_attribute attrs[4]
    cdef void *data[4]
    cdef cydriver.CUresult err
    attrs[:] = [cydriver.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, cydriver.CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                cydriver.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, cydriver.CU_POINTER_ATTRIBUTE_MEMORY_TYPE]
    data[:] = [&start, &size, &ordinal, &mtype]
    # For an address the driver does not know this succeeds with start 0; the
    # singular query below would fail instead (an API error under
    # compute-sanitizer), so it runs only inside a known extent.
    err = cydriver.cuPointerGetAttributes(4, attrs, data, <cydriver.CUdeviceptr>p)
    if (err != cydriver.CUDA_SUCCESS or start == 0 or p < start or n > size or p - start > size - n
            or ordinal != device or mtype != cydriver.CU_MEMORYTYPE_DEVICE):
        return False
    # Virtual-memory ranges (reserved arenas): both ends must be mapped,
    # whatever extent the driver reports for the range.
    err = cydriver.cuPointerGetAttribute(&mapped_first, cydriver.CU_POINTER_ATTRIBUTE_MAPPED,
                                         <cydriver.CUdeviceptr>p)
    if err == cydriver.CUDA_SUCCESS:
        err = cydriver.cuPointerGetAttribute(&mapped_last, cydriver.CU_POINTER_ATTRIBUTE_MAPPED,
                                             <cydriver.CUdeviceptr>(p + n - 1))
    return err == cydriver.CUDA_SUCCESS and mapped_first != 0 and mapped_last != 0


cdef int granularity(int device, size_t *out) except -1 nogil:
    cdef cydriver.CUmemAllocationProp prop
    cdef size_t g = 0
    _prop(&prop, device)
    check(cydriver.cuMemGetAllocationGranularity(&g, &prop, cydriver.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity")
    if g == 0:
        with gil:
            from metrale._base.errors import MetraleError
            raise MetraleError("cuMemGetAllocationGranularity: the driver reported 0")
    out[0] = g
    return 0


cdef int reserve(size_t n, size_t align, uintptr_t *out) except -1 nogil:
    cdef cydriver.CUdeviceptr p = 0
    cdef cydriver.CUresult err = cydriver.cuMemAddressReserve(&p, n, align, 0, 0)
    if err != cydriver.CUDA_SUCCESS:
        # Whatever the driver's reason (out of memory, or no room in the
        # address space), a refused reservation is an out-of-memory.
        return raise_error(err, "cuMemAddressReserve", NULL, n, True)
    out[0] = <uintptr_t>p
    return 0


cdef int unreserve(uintptr_t p, size_t n) except -1 nogil:
    return check(cydriver.cuMemAddressFree(<cydriver.CUdeviceptr>p, n), "cuMemAddressFree")


cdef int create(int device, size_t n, bint exportable, uint64_t *handle) except -1 nogil:
    cdef cydriver.CUmemAllocationProp prop
    cdef cydriver.CUmemGenericAllocationHandle h = 0
    cdef const char *what = NULL
    _prop(&prop, device)
    if exportable:
        # Requested at creation: only such a handle can be exported as an fd.
        prop.requestedHandleTypes = cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        what = "POSIX file descriptor handle"
    check(cydriver.cuMemCreate(&h, n, &prop, 0), "cuMemCreate", what, n)
    handle[0] = <uint64_t>h
    return 0


cdef int create_host(int device, size_t n, uint64_t *handle) except -1 nogil:
    # Host memory on the device's own NUMA node (node 0 where the driver
    # knows none), which the device maps as it maps its own.
    cdef cydriver.CUmemAllocationProp prop
    cdef cydriver.CUmemGenericAllocationHandle h = 0
    cdef int node = -1
    cdef size_t g = 0
    if cydriver.cuDeviceGetAttribute(&node, cydriver.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID,
                                     <cydriver.CUdevice>device) != cydriver.CUDA_SUCCESS or node < 0:
        node = 0
    memset(&prop, 0, sizeof(prop))
    prop.type = cydriver.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cydriver.CU_MEM_LOCATION_TYPE_HOST_NUMA
    prop.location.id = node
    check(cydriver.cuMemGetAllocationGranularity(&g, &prop, cydriver.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity")
    if g == 0 or n % g:
        with gil:
            from metrale._base.errors import MetraleError
            raise MetraleError(f"host memory for offloaded buffers comes in units of {g} bytes "
                               f"on this machine, which {n} is not a multiple of")
    check(cydriver.cuMemCreate(&h, n, &prop, 0), "cuMemCreate", "host NUMA memory", n)
    handle[0] = <uint64_t>h
    return 0


cdef int release(uint64_t handle) except -1 nogil:
    return check(cydriver.cuMemRelease(<cydriver.CUmemGenericAllocationHandle>handle), "cuMemRelease")


cdef int map(uintptr_t p, size_t n, uint64_t handle, int device) except -1 nogil:
    cdef cydriver.CUmemAccessDesc desc
    cdef cydriver.CUresult err
    memset(&desc, 0, sizeof(desc))
    desc.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = device
    desc.flags = cydriver.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    check(cydriver.cuMemMap(<cydriver.CUdeviceptr>p, n, 0,
                            <cydriver.CUmemGenericAllocationHandle>handle, 0), "cuMemMap", NULL, n)
    err = cydriver.cuMemSetAccess(<cydriver.CUdeviceptr>p, n, &desc, 1)
    if err != cydriver.CUDA_SUCCESS:
        cydriver.cuMemUnmap(<cydriver.CUdeviceptr>p, n)
    return check(err, "cuMemSetAccess", NULL, n)


cdef int unmap(uintptr_t p, size_t n) except -1 nogil:
    return check(cydriver.cuMemUnmap(<cydriver.CUdeviceptr>p, n), "cuMemUnmap")


cdef int export_fd(uint64_t handle, int *fd) except -1 nogil:
    cdef int out = -1
    check(cydriver.cuMemExportToShareableHandle(
        <void *>&out, <cydriver.CUmemGenericAllocationHandle>handle,
        cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "cuMemExportToShareableHandle")
    fd[0] = out
    return 0


cdef int import_fd(int fd, uint64_t *handle) except -1 nogil:
    cdef cydriver.CUmemGenericAllocationHandle h = 0
    check(cydriver.cuMemImportFromShareableHandle(
        &h, <void *><uintptr_t>fd, cydriver.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle")
    handle[0] = <uint64_t>h
    return 0


# -- the pool's operations: no GIL, no exception -----------------------------------------

cdef inline cydriver.CUresult _enter(pool_device *d) noexcept nogil:
    cdef cydriver.CUcontext cur = NULL
    cdef cydriver.CUresult err = cydriver.cuCtxGetCurrent(&cur)
    if err != cydriver.CUDA_SUCCESS or cur == d.ctx:
        return err
    return cydriver.cuCtxSetCurrent(d.ctx)


cdef int _pool_create(void *ctx, uint64_t n, uint64_t *handle) noexcept nogil:
    cdef pool_device *d = <pool_device *>ctx
    cdef cydriver.CUmemAllocationProp prop
    cdef cydriver.CUmemGenericAllocationHandle h = 0
    cdef cydriver.CUresult err = _enter(d)
    if err == cydriver.CUDA_SUCCESS:
        _prop(&prop, d.device)
        err = cydriver.cuMemCreate(&h, n, &prop, 0)
        handle[0] = <uint64_t>h
    return <int>err


cdef int _pool_release(void *ctx, uint64_t handle, uint64_t n) noexcept nogil:
    cdef cydriver.CUresult err = _enter(<pool_device *>ctx)
    if err == cydriver.CUDA_SUCCESS:
        err = cydriver.cuMemRelease(<cydriver.CUmemGenericAllocationHandle>handle)
    return <int>err


cdef int _pool_map(void *ctx, uint64_t p, uint64_t n, uint64_t handle) noexcept nogil:
    cdef pool_device *d = <pool_device *>ctx
    cdef cydriver.CUmemAccessDesc desc
    cdef cydriver.CUresult err = _enter(d)
    if err != cydriver.CUDA_SUCCESS:
        return <int>err
    memset(&desc, 0, sizeof(desc))
    desc.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = d.device
    desc.flags = cydriver.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    err = cydriver.cuMemMap(<cydriver.CUdeviceptr>p, n, 0,
                            <cydriver.CUmemGenericAllocationHandle>handle, 0)
    if err != cydriver.CUDA_SUCCESS:
        return <int>err
    err = cydriver.cuMemSetAccess(<cydriver.CUdeviceptr>p, n, &desc, 1)
    if err != cydriver.CUDA_SUCCESS:
        cydriver.cuMemUnmap(<cydriver.CUdeviceptr>p, n)
    return <int>err


cdef int _pool_unmap(void *ctx, uint64_t p, uint64_t n) noexcept nogil:
    cdef cydriver.CUresult err = _enter(<pool_device *>ctx)
    if err == cydriver.CUDA_SUCCESS:
        err = cydriver.cuMemUnmap(<cydriver.CUdeviceptr>p, n)
    return <int>err


cdef void pool_ops(mt_pool_ops *ops, pool_device *dev) noexcept nogil:
    ops.ctx = <void *>dev
    ops.create = _pool_create
    ops.release = _pool_release
    ops.map = _pool_map
    ops.unmap = _pool_unmap
