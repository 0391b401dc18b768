# cython: language_level=3, binding=False
"""FaultyCudaBackend: a CudaBackend whose operations fail on demand, for
testing failure paths on a GPU as FaultyBackend does on the host (the
shipped backend never asks "should I fail?")."""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t

from metrale._backends._cuda cimport CudaBackend
from metrale._base._core cimport mt_copy_run, mt_pool_ops
from metrale._backends.testing cimport Faults


@cython.no_gc_clear         # as every backend (see _backend.pyx)
@cython.final
cdef class FaultyCudaBackend(CudaBackend):
    """FaultyCudaBackend(device=0)
--

A CudaBackend whose nth next operation of a kind fails, on demand.

    The kinds, the way a failure raises (``OutOfMemoryError`` for what
    allocates or maps, ``MetraleError`` starting ``INJECTED_FAULT``
    otherwise) and the calls are those of ``metrale.testing.FaultyBackend``;
    a failing operation makes no driver call.

    Parameters
    ----------
    device : int, optional
        The device ordinal (default 0).
    """
    cdef Faults _armed

    def __cinit__(self, device=0):
        self._armed = Faults()

    def inject_fault(self, op, nth=1):
        """Arm a failure of the `nth` next operation of kind `op`.

        Parameters
        ----------
        op : str
            One of ``metrale.testing.OPERATIONS``.
        nth : int, optional
            Which of the next operations of that kind fails (1: the next).
        """
        self._armed.arm(op, nth)

    def inject_call(self, op, fn, nth=1):
        """Call `fn()` at the start of the `nth` next operation of kind `op`.

        Parameters
        ----------
        op : str
            One of ``metrale.testing.OPERATIONS``.
        fn : callable
            Called with no arguments.
        nth : int, optional
            Which of the next operations of that kind calls it (1: the next).
        """
        self._armed.arm_call(op, fn, nth)

    def clear_faults(self):
        """Disarm every armed failure and call."""
        self._armed.clear()

    cdef int alloc(self, size_t n, uintptr_t *out) except -1:
        self._armed.check("alloc", f"device allocation of {n} bytes")
        return CudaBackend.alloc(self, n, out)

    cdef int free(self, uintptr_t p, size_t n) except -1:
        self._armed.check("free", f"free of {n} bytes at {p:#x}")
        return CudaBackend.free(self, p, n)

    cdef int memset(self, uintptr_t p, size_t n, uintptr_t stream) except -1:
        self._armed.check("memset", "memset")
        return CudaBackend.memset(self, p, n, stream)

    cdef int d2h(self, void *dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        self._armed.check("d2h", "copy to the host")
        return CudaBackend.d2h(self, dst, src, n, stream)

    cdef int h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        self._armed.check("h2d", "copy to the device")
        return CudaBackend.h2d(self, dst, src, n, stream)

    cdef int copy_h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        self._armed.check("h2d", "copy to the device")
        return CudaBackend.copy_h2d(self, dst, src, n, stream)

    cdef int sync(self, uintptr_t stream) except -1:
        self._armed.check("sync", "synchronize")
        return CudaBackend.sync(self, stream)

    cdef int reserve(self, size_t n, uintptr_t *out) except -1:
        self._armed.check("reserve", f"reservation of {n} bytes")
        return CudaBackend.reserve(self, n, out)

    cdef int unreserve(self, uintptr_t p, size_t n) except -1:
        self._armed.check("unreserve", "unreserve")
        return CudaBackend.unreserve(self, p, n)

    cdef int create(self, size_t n, uint64_t *handle) except -1:
        self._armed.check("create", f"physical handle of {n} bytes")
        return CudaBackend.create(self, n, handle)

    cdef int create_exportable(self, size_t n, uint64_t *handle) except -1:
        self._armed.check("create", f"shareable handle of {n} bytes")
        return CudaBackend.create_exportable(self, n, handle)

    cdef int create_host(self, size_t n, uint64_t *handle) except -1:
        self._armed.check("create", f"host handle of {n} bytes")
        return CudaBackend.create_host(self, n, handle)

    cdef int release_handle(self, uint64_t handle, size_t n) except -1:
        self._armed.check("release_handle", "release of a physical handle")
        return CudaBackend.release_handle(self, handle, n)

    cdef int release_host(self, uint64_t handle, size_t n) except -1:
        self._armed.check("release_handle", "release of a host handle")
        return CudaBackend.release_host(self, handle, n)

    cdef int pool_ops(self, mt_pool_ops *ops) except -1:
        return 0        # a pool calls the methods here, which fail on demand

    cdef int map(self, uintptr_t p, size_t n, uint64_t handle) except -1:
        self._armed.check("map", f"mapping {n} bytes at {p:#x}")
        CudaBackend.map(self, p, n, handle)
        try:
            self._armed.check("set_access", f"access to {n} bytes at {p:#x}")
        except BaseException:
            CudaBackend.unmap(self, p, n)
            raise
        return 0

    cdef int unmap(self, uintptr_t p, size_t n) except -1:
        self._armed.check("unmap", "unmap")
        return CudaBackend.unmap(self, p, n)

    cdef int copy(self, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        self._armed.check("copy", "copy")
        return CudaBackend.copy(self, dst, src, n, stream)

    cdef int copy_runs(self, const mt_copy_run *runs, Py_ssize_t n, uintptr_t stream) except -1:
        self._armed.check("copy", "copy")
        return CudaBackend.copy_runs(self, runs, n, stream)

    cdef int host_alloc(self, size_t n, void **out) except -1:
        self._armed.check("host_alloc", f"host copy buffer of {n} bytes")
        return CudaBackend.host_alloc(self, n, out)

    cdef int export_handle(self, uint64_t handle, size_t n, int *fd) except -1:
        self._armed.check("export", "export of a physical handle")
        return CudaBackend.export_handle(self, handle, n, fd)

    cdef int import_handle(self, int fd, size_t n, uint64_t *handle) except -1:
        self._armed.check("import", "import of a peer's handle")
        return CudaBackend.import_handle(self, fd, n, handle)

    def __repr__(self):
        return f"FaultyCudaBackend(device={self.device_id}, {self._armed!r})"
