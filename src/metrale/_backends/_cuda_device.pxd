# The device a CudaBackend drives (see _cuda_device.pyx): its fields, for
# CudaBackend (_cuda.pyx) and the backend that fails on demand (_faulty_cuda).
from cuda.bindings cimport cydriver
from metrale._backends cimport _kernels, _vmm
from metrale._backends._backend cimport Backend


cdef class CudaDevice(Backend):
    cdef cydriver.CUdevice _dev
    cdef cydriver.CUcontext _ctx
    cdef bint _retained
    cdef unsigned long _fork_gen     # fork()s this process descends from, when made
    cdef int _sm_count, _cc_major, _cc_minor
    cdef size_t _gran                # allocation granularity, asked once (0: not yet)
    cdef size_t _stack0              # the threads' stack when made (trim_stack's default)
    cdef readonly Py_ssize_t launch_count
    cdef _kernels.ZeroKernels _zero      # loaded at construction
    cdef _kernels.DebugKernels _debug    # loaded by the first debug operation
    cdef _kernels.PeerKernels _peer      # loaded when an arena is first shared
    cdef _kernels.CopyKernels _copy      # loaded by the first copy_runs outside a capture
    cdef object _debug_lock              # serializes the calls that use _debug's results
    cdef cydriver.CUstream _side         # non-blocking: copies beside a wake's zeroing
    cdef _vmm.pool_device _pool_dev      # what the pools' operations make current

    # Make the backend's context current on the calling thread: the step
    # before every checked driver call, without the GIL.
    cdef int _current(self) except -1 nogil
    # Whether stream `s` is being captured into a graph (context current).
    cdef bint _capturing(self, cydriver.CUstream s) except -1 nogil
