# cython: language_level=3, binding=False
"""The pinned host memory of one StepInputs (_step.pyx), and its export as a
byte buffer: what the numpy views of the step inputs hold."""

cimport cython
from libc.stdint cimport uint64_t

from metrale._backends._backend cimport Backend
from metrale._base._core cimport MT_LIFE_OK, mt_life
from metrale._base._life cimport (mt_life_export, mt_life_forked, mt_life_free, mt_life_new,
                                  mt_life_unexport, raise_life)

# Private constructor key: a staging comes from staging_new (StepInputs').
cdef object _TOKEN = object()


cdef _Staging staging_new(Backend gpu):
    cdef _Staging staging = _Staging.__new__(_Staging, _TOKEN)
    staging._gpu = gpu
    return staging


cdef int _export(Py_buffer *view, int flags, object owner, mt_life *life, unsigned char *host,
                 uint64_t nbytes) except -1:
    """Export the staging as a 1-D byte buffer owned by `owner`, counted in
    `life` (the staging's word, whichever object exports it)."""
    rc = mt_life_export(life, 0)
    if rc != MT_LIFE_OK:
        raise_life(rc, "these step inputs", "")
    view.buf = host
    view.obj = owner
    view.len = nbytes
    view.readonly = 0
    view.itemsize = 1
    view.format = NULL
    if flags & 4:                               # PyBUF_FORMAT
        view.format = b"B"
    view.ndim = 1
    view.shape = NULL
    view.strides = NULL
    view.suboffsets = NULL
    view.internal = NULL
    return 0


# no_gc_clear: the finalizer frees through _gpu (see BufferArena).
@cython.no_gc_clear
@cython.final
cdef class _Staging:
    """The pinned host memory of one StepInputs, exported to the numpy views.

    Apart from StepInputs so that the views (numpy arrays, which the cyclic
    collector does not see) hold this and not the StepInputs: no reference
    cycle runs through them, and memory a view still holds outlives the
    StepInputs.  Its lifetime word counts the views and the StepInputs'
    operations on it."""

    # its fields: _staging.pxd

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("_Staging is made by BufferArena.step_inputs()")
        self._life = mt_life_new(1)
        if self._life == NULL:
            raise MemoryError()

    cdef int _free(self) except -1:
        host, self._host = self._host, NULL
        if host != NULL:
            self._gpu.host_free(host)
        return 0

    def __getbuffer__(self, Py_buffer *view, int flags):
        _export(view, flags, self, self._life, self._host, self.nbytes)

    def __releasebuffer__(self, Py_buffer *view):
        mt_life_unexport(self._life, 0)

    def __dealloc__(self):
        # No view is alive here (each holds a reference).  In a forked child
        # pinned memory belongs to the parent's CUDA context.
        if self._host != NULL and self._gpu is not None and not (
                mt_life_forked(self._life) and self._gpu.device_type != 1):
            self._gpu.host_free(self._host)
        self._host = NULL
        if self._life != NULL:
            mt_life_free(self._life)
