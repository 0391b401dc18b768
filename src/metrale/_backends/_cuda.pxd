# CudaBackend (see _cuda.pyx): a CudaDevice (its fields: _cuda_device.pxd) with
# the backend's operations, for the backend that fails on demand
# (metrale._backends._faulty_cuda, a subclass).
from libc.stdint cimport uint64_t

from metrale._backends._cuda_device cimport CudaDevice


cdef class CudaBackend(CudaDevice):
    cdef int _create(self, size_t n, bint exportable, uint64_t *handle) except -1
