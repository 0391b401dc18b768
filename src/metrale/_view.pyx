# cython: language_level=3, boundscheck=False, wraparound=False, binding=False
"""ArenaView: a typed window on one arena buffer for numpy, torch and CuPy,
through DLPack and the (CUDA) array interface, never copied.  Each live view
is counted in its arena's lifetime word, so the arena refuses to free the
memory under it."""

cimport cython
from cpython.pycapsule cimport PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer
from cpython.ref cimport Py_INCREF, Py_DECREF
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free

from metrale._common cimport MT_MAX_NDIM, index_arg
from metrale._core cimport (MT_LIFE_OK, MT_LIFE_RELEASED, mt_life, mt_life_export,
                            mt_life_unexport)
from metrale._dlpack cimport DLManagedTensor

from metrale._buffers import BUFFER_NAMES
from metrale.errors import MetraleError

# Private constructor key: views come from BufferArena.view().
cdef object _TOKEN = object()


cdef ArenaView make_view(object arena, mt_life *life, int buf, uint64_t nbytes, object ptr,
                         int dev_type, int dev_id, object dtype, object shape):
    cdef ArenaView v
    cdef int rc
    name = BUFFER_NAMES[buf]
    dname = _dtype_name(dtype)
    code, bits = _DTYPES[dname][1:]
    item = bits // 8
    shape, count = _view_shape(shape, nbytes, item, name)
    v = ArenaView.__new__(ArenaView, _TOKEN)
    rc = mt_life_export(life, buf)
    if rc == MT_LIFE_RELEASED:
        raise MetraleError("the buffer arena has been released")
    if rc != MT_LIFE_OK:
        raise MetraleError("too many live views of this arena")
    # Counted from here: the pointer stays valid until this view is gone.
    v._life = life
    v._buf = buf
    v.arena, v.name, v.dtype, v.shape = arena, name, dname, shape
    v.ptr, v.nbytes = ptr, count * item
    v._dev_type, v._dev_id = dev_type, dev_id
    v._code, v._bits = code, bits
    return v


# name -> (array-interface typestr, DLPack code, bits)
cdef dict _DTYPES = {
    "int8": ("|i1", 0, 8), "int16": ("<i2", 0, 16), "int32": ("<i4", 0, 32), "int64": ("<i8", 0, 64),
    "uint8": ("|u1", 1, 8), "uint16": ("<u2", 1, 16), "uint32": ("<u4", 1, 32), "uint64": ("<u8", 1, 64),
    "float16": ("<f2", 2, 16), "float32": ("<f4", 2, 32), "float64": ("<f8", 2, 64),
    "bfloat16": ("<V2", 4, 16),
}
_ALIASES = {"u8": "uint8", "i8": "int8", "f16": "float16", "half": "float16", "f32": "float32",
            "float": "float32", "f64": "float64", "double": "float64", "bf16": "bfloat16",
            "i32": "int32", "u32": "uint32", "i64": "int64", "u64": "uint64", "int": "int32"}


cdef str _dtype_name(object dtype):
    if isinstance(dtype, str):
        name = dtype
    else:
        name = getattr(dtype, "name", None)
        if not isinstance(name, str):
            name = getattr(dtype, "__name__", None) or str(dtype)
    name = name.replace("torch.", "")
    name = _ALIASES.get(name, name)
    if name not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(_DTYPES)}")
    return name


cdef void _dl_deleter(DLManagedTensor *t) noexcept nogil:
    with gil:
        Py_DECREF(<object>t.manager_ctx)
    free(t)


cdef void _dl_capsule_destructor(object capsule) noexcept:
    cdef DLManagedTensor *t
    if PyCapsule_IsValid(capsule, b"dltensor"):     # never consumed
        t = <DLManagedTensor *>PyCapsule_GetPointer(capsule, b"dltensor")
        t.deleter(t)


cdef tuple _view_shape(object shape, uint64_t nbytes, int item, str name):
    """(dims, element count) of `shape`, checked whole, as numpy and DLPack
    will take it, against a buffer of `nbytes`."""
    if shape is None:
        return (nbytes // item,), nbytes // item
    if isinstance(shape, (str, bytes)) or (not hasattr(shape, "__iter__") and not hasattr(type(shape), "__index__")):
        raise TypeError(f"shape must be an int or a sequence of ints, got {type(shape).__name__}")
    if hasattr(type(shape), "__index__"):
        shape = (shape,)
    dims = []
    for d in shape:
        if len(dims) == MT_MAX_NDIM:
            raise ValueError(f"shape has more than {MT_MAX_NDIM} dimensions")
        dims.append(index_arg(d, "shape", 0, 0x7FFFFFFFFFFFFFFF))
    count = 1
    nonzero = 1
    for d in dims:
        count *= d
        if d:
            nonzero *= d
    if nonzero * item > 0x7FFFFFFFFFFFFFFF:     # numpy: "array is too big"
        raise ValueError(f"shape {tuple(dims)} has more elements than an array can index")
    if count * item > nbytes:
        if nbytes == 0:
            raise MetraleError(f"{name} is NULL in this arena: only an empty view can be made")
        raise ValueError(f"shape {tuple(dims)} needs {count * item} bytes; {name} holds {nbytes}")
    return tuple(dims), count


# no_gc_clear: a view's arena must outlive it, or its dealloc would count an
# export off freed bookkeeping and its arrays would read a freed slab.
@cython.no_gc_clear
@cython.final
cdef class ArenaView:
    """A typed window on one arena buffer; consumed through DLPack or the
    (CUDA) array interface, never copied.  Alive, it keeps the arena's memory:
    release() refuses while it (or an array made from it) exists."""

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("use BufferArena.view(name, dtype, shape) to make a view")

    def __dealloc__(self):
        if self._life != NULL:        # set only once the export was counted
            mt_life_unexport(self._life, self._buf)

    def _interface(self):
        return {"shape": self.shape, "typestr": _DTYPES[self.dtype][0],
                "data": (self.ptr, False), "strides": None, "version": 3}

    @property
    def __array_interface__(self):
        if self._dev_type != 1:
            raise AttributeError("__array_interface__ is for host memory; this view is on a GPU")
        return self._interface()

    @property
    def __cuda_array_interface__(self):
        if self._dev_type != 2:
            raise AttributeError("__cuda_array_interface__ is for GPU memory; this view is on the host")
        d = self._interface()
        d["stream"] = None     # the arena's work is ordered by the caller's streams
        return d

    def __dlpack_device__(self):
        return (self._dev_type, self._dev_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        cdef DLManagedTensor *t
        cdef int64_t *shp
        cdef int nd = len(self.shape), i
        if copy:
            raise BufferError("an arena view cannot be copied by the producer")
        if dl_device is not None and tuple(dl_device) != (self._dev_type, self._dev_id):
            raise BufferError(f"the view lives on device {(self._dev_type, self._dev_id)}")
        t = <DLManagedTensor *>malloc(sizeof(DLManagedTensor) + sizeof(int64_t) * (nd if nd else 1))
        if t == NULL:
            raise MemoryError()
        shp = <int64_t *>(<char *>t + sizeof(DLManagedTensor))
        for i in range(nd):
            shp[i] = self.shape[i]
        t.dl_tensor.data = <void *><uintptr_t>self.ptr
        t.dl_tensor.device.device_type = self._dev_type
        t.dl_tensor.device.device_id = self._dev_id
        t.dl_tensor.ndim = nd
        t.dl_tensor.dtype.code = self._code
        t.dl_tensor.dtype.bits = self._bits
        t.dl_tensor.dtype.lanes = 1
        t.dl_tensor.shape = shp
        t.dl_tensor.strides = NULL       # compact row-major
        t.dl_tensor.byte_offset = 0
        t.manager_ctx = <void *>self
        t.deleter = _dl_deleter
        Py_INCREF(self)
        try:
            return PyCapsule_New(t, b"dltensor", _dl_capsule_destructor)
        except BaseException:
            Py_DECREF(self)
            free(t)
            raise

    def __repr__(self):
        return f"ArenaView({self.name}, {self.dtype}, shape={self.shape}, ptr={self.ptr:#x})"
