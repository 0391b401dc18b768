# Device memory as the CUDA driver maps it (reserved and tensor-parallel
# arenas, docs/stable-addresses.md): reserve address space, create, map and
# release physical handles, share them as POSIX file descriptors, ask what an
# address range is.  Module functions, called without the GIL by CudaBackend's
# thin methods, which make the context current and keep the counters.
from libc.stdint cimport uint64_t, uintptr_t

from cuda.bindings cimport cydriver
from metrale._base._core cimport mt_pool_ops

# Whether [p, p + n) lies inside one allocation of device memory on `device`
# that the driver knows, mapped at both ends (CudaBackend.check_range).
cdef bint inside(uintptr_t p, size_t n, int device) noexcept nogil

# The allocation unit: every size and address below is a multiple of it.
cdef int granularity(int device, size_t *out) except -1 nogil
# [*out, *out + n) of address space, aligned to `align`; any refusal is an
# OutOfMemoryError (no memory, or no room in the address space).
cdef int reserve(size_t n, size_t align, uintptr_t *out) except -1 nogil
cdef int unreserve(uintptr_t p, size_t n) except -1 nogil
# A physical handle of n bytes on `device`; `exportable` requests a POSIX file
# descriptor handle type, the only kind export_fd can share.
cdef int create(int device, size_t n, bint exportable, uint64_t *handle) except -1 nogil
# A physical handle of n bytes of host memory (the device's NUMA node) that
# the device maps as its own (sleep(offload=...)); n a multiple of its unit.
cdef int create_host(int device, size_t n, uint64_t *handle) except -1 nogil
cdef int release(uint64_t handle) except -1 nogil
# Map `handle` whole at p and make it read/write for `device`; on failure
# nothing stays mapped.
cdef int map(uintptr_t p, size_t n, uint64_t handle, int device) except -1 nogil
cdef int unmap(uintptr_t p, size_t n) except -1 nogil
# A new file descriptor for `handle` (the caller closes it), and a handle of a
# peer's descriptor (the caller still closes the descriptor).
cdef int export_fd(uint64_t handle, int *fd) except -1 nogil
cdef int import_fd(int fd, uint64_t *handle) except -1 nogil

# The same operations for an arena's pool (src/pool.c), which torch's allocator
# calls from any thread: no GIL, no exception, the driver's CUresult returned
# (0: success); each makes `ctx`'s context current first.  `dev` must outlive
# the pool (the backend holds it).
ctypedef struct pool_device:
    int device
    cydriver.CUcontext ctx
cdef void pool_ops(mt_pool_ops *ops, pool_device *dev) noexcept nogil
