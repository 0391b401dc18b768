# cython: language_level=3, binding=False
"""Copies between host bytes and device memory, and a stream's wait, for tests,
debugging and small tables: written once over the backend interface
(`Backend.h2d`, `d2h`, `sync`); CudaBackend binds them as its `upload`,
`download` and `synchronize`.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uintptr_t

from metrale._backends._backend cimport Backend
from metrale._base._common cimport as_stream, index_arg, u64_arg


@cython.binding(True)
def upload(Backend self, ptr, data, stream=None):
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

@cython.binding(True)
def download(Backend self, ptr, n, stream=None):
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

@cython.binding(True)
def synchronize(Backend self, stream=None):
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
