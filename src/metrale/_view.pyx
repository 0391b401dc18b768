# cython: language_level=3, binding=False
"""ArenaView: a typed window on one arena buffer for numpy, torch and CuPy,
through DLPack and the (CUDA) array interface, never copied.  Each live view
is counted in its arena's lifetime word, so the arena refuses to free the
memory under it."""

cimport cython
from cpython.pycapsule cimport PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer
from cpython.ref cimport Py_INCREF, Py_DECREF
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free

from metrale._common cimport MT_MAX_NDIM, dtype_info, index_arg
from metrale._core cimport mt_life, mt_life_unexport
from metrale._dlpack cimport DLManagedTensor, DLManagedTensorVersioned, DLTensor

from metrale._buffers import BUFFER_NAMES
from metrale.errors import MetraleError

# Private constructor key: views come from BufferArena.view().
cdef object _TOKEN = object()


cdef tuple view_request(object dtype, object shape):
    """(dtype_info(dtype), dims or None) of a view request: every conversion
    that can run user code (a dtype's hash or name, a shape element's
    __index__), done before the arena's state is read."""
    info = dtype_info(dtype)
    return info, None if shape is None else _dims(shape, info[3] // 8)


cdef ArenaView make_view(object arena, mt_life *life, int buf, uint64_t nbytes, object ptr,
                         int dev_type, int dev_id, tuple request):
    """A view of `request` over buffer `buf`; the caller has counted its
    export in `life` (the view then owns it; on an exception the caller
    still does) and read `nbytes` and `ptr` after counting it."""
    cdef ArenaView v
    info, dims = request
    dname, typestr, code, bits = info
    item = bits // 8
    name = BUFFER_NAMES[buf]
    shape, count = _fit(dims, nbytes, item, name)
    v = ArenaView.__new__(ArenaView, _TOKEN)
    # Counted: the pointer stays valid until this view is gone.
    v._life = life
    v._buf = buf
    v.arena, v.name, v.dtype, v.shape = arena, name, dname, shape
    v._typestr = typestr
    v.ptr, v.nbytes = ptr, count * item
    v._dev_type, v._dev_id = dev_type, dev_id
    v._code, v._bits = code, bits
    return v


cdef void _dl_deleter(DLManagedTensor *t) noexcept nogil:
    with gil:
        Py_DECREF(<object>t.manager_ctx)
    free(t)


cdef void _dl_deleter_v1(DLManagedTensorVersioned *t) noexcept nogil:
    with gil:
        Py_DECREF(<object>t.manager_ctx)
    free(t)


cdef void _dl_capsule_destructor(object capsule) noexcept:
    cdef DLManagedTensor *t
    if PyCapsule_IsValid(capsule, b"dltensor"):     # never consumed
        t = <DLManagedTensor *>PyCapsule_GetPointer(capsule, b"dltensor")
        t.deleter(t)


cdef void _dl_capsule_destructor_v1(object capsule) noexcept:
    cdef DLManagedTensorVersioned *t
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):     # never consumed
        t = <DLManagedTensorVersioned *>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        t.deleter(t)


cdef bint _wants_versioned(object max_version) except -1:
    """DLPack: a consumer that passes max_version (major, minor) with
    major >= 1 gets a versioned capsule; None (or 0.x) the legacy one."""
    if max_version is None:
        return False
    if not isinstance(max_version, tuple) or len(max_version) != 2:
        raise TypeError(f"max_version must be a (major, minor) tuple or None, got {max_version!r}")
    major = max_version[0]
    if isinstance(major, bool) or not isinstance(major, int):
        raise TypeError(f"max_version must be a (major, minor) tuple of ints, got {max_version!r}")
    return major >= 1


cdef tuple _dims(object shape, int item):
    """`shape` (an int or a sequence of ints) as a tuple of ints, checked as
    numpy and DLPack will take it, whatever buffer it will be laid over."""
    if isinstance(shape, (str, bytes)) or (not hasattr(shape, "__iter__") and not hasattr(type(shape), "__index__")):
        raise TypeError(f"shape must be an int or a sequence of ints, got {type(shape).__name__}")
    if hasattr(type(shape), "__index__"):
        shape = (shape,)
    dims = []
    for d in shape:
        if len(dims) == MT_MAX_NDIM:
            raise ValueError(f"shape has more than {MT_MAX_NDIM} dimensions")
        dims.append(index_arg(d, "shape", 0, 0x7FFFFFFFFFFFFFFF))
    nonzero = 1
    for d in dims:
        if d:
            nonzero *= d
    if nonzero * item > 0x7FFFFFFFFFFFFFFF:     # numpy: "array is too big"
        raise ValueError(f"shape {tuple(dims)} has more elements than an array can index")
    return tuple(dims)


cdef tuple _fit(object dims, uint64_t nbytes, int item, str name):
    """(dims, element count) of the request over a buffer of `nbytes`:
    all of it, 1-D, for None.  Plain arithmetic on converted ints."""
    if dims is None:
        return (nbytes // item,), nbytes // item
    count = 1
    for d in dims:
        count *= d
    if count * item > nbytes:
        if nbytes == 0:
            raise MetraleError(f"{name} is NULL in this arena: only an empty view can be made")
        raise ValueError(f"shape {dims} needs {count * item} bytes; {name} holds {nbytes}")
    return dims, count


# no_gc_clear: a view's arena must outlive it, or its dealloc would count an
# export off freed bookkeeping and its arrays would read a freed slab.
@cython.no_gc_clear
@cython.final
cdef class ArenaView:
    """A typed window on one arena buffer, made by `BufferArena.view`.

    Consumed through DLPack (``np.from_dlpack(v)``, ``torch.from_dlpack(v)``,
    ``cupy.from_dlpack(v)``) or the array interface of its device
    (``np.asarray(v)`` on the host, ``__cuda_array_interface__`` on a GPU),
    never copied.  Alive, it keeps the arena's memory: `BufferArena.release`
    refuses while it, or an array made from it, exists.

    Attributes
    ----------
    arena : BufferArena
        The arena it views.
    name : str
        The buffer.
    dtype : str
        Canonical element type name (``'float32'``, ``'bfloat16'``, ...).
    shape : tuple of int
        Row-major shape.
    ptr : int
        Device pointer of the first element.
    nbytes : int
        Bytes the view covers.
    """

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("use BufferArena.view(name, dtype, shape) to make a view")

    def __dealloc__(self):
        if self._life != NULL:        # set only once the export was counted
            mt_life_unexport(self._life, self._buf)

    def _interface(self):
        return {"shape": self.shape, "typestr": self._typestr,
                "data": (self.ptr, False), "strides": None, "version": 3}

    @property
    def __array_interface__(self):
        """numpy's array interface (version 3) for a host view.

        bfloat16 and the FP8 types appear as raw bytes of their width
        (``'<V2'``, ``'|V1'``): numpy has no code for them.

        Raises
        ------
        AttributeError
            The view is of GPU memory.
        """
        if self._dev_type != 1:
            raise AttributeError("__array_interface__ is for host memory; this view is on a GPU")
        return self._interface()

    @property
    def __cuda_array_interface__(self):
        """The CUDA array interface (version 3) for a GPU view; ``stream`` is
        None: the arena's work is ordered by the caller's streams.

        Raises
        ------
        AttributeError
            The view is of host memory.
        """
        if self._dev_type != 2:
            raise AttributeError("__cuda_array_interface__ is for GPU memory; this view is on the host")
        d = self._interface()
        d["stream"] = None     # the arena's work is ordered by the caller's streams
        return d

    def __dlpack_device__(self):
        """The DLPack device of the view: ``(1, 0)`` host, ``(2, n)`` CUDA device n.

        Returns
        -------
        tuple of (int, int)
        """
        return (self._dev_type, self._dev_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export the view as a DLPack capsule (the array API's protocol).

        Parameters
        ----------
        stream : int or None, optional
            The consumer's stream.  Ignored: the arena enqueues nothing of
            its own, so the order of work is the order of the caller's streams.
        max_version : tuple of (int, int) or None, optional
            The highest DLPack version the consumer reads.  ``(1, x)`` or
            later gives a versioned capsule (``"dltensor_versioned"``, DLPack
            1.1, writable); None gives the legacy ``"dltensor"`` capsule.
        dl_device : tuple of (int, int) or None, optional
            The device the consumer wants; only the view's own is possible.
        copy : bool or None, optional
            True is refused: a view shares the arena's memory, never copies.

        Returns
        -------
        PyCapsule
            Owned by the consumer; it keeps this view, and so the arena's
            memory, alive until the consumer's tensor is deleted.

        Raises
        ------
        BufferError
            `copy` is True, or `dl_device` is another device.
        TypeError
            `max_version` is not a (major, minor) tuple.
        """
        cdef DLManagedTensor *t = NULL
        cdef DLManagedTensorVersioned *tv = NULL
        cdef DLTensor *dl
        cdef int64_t *shp
        cdef int nd = len(self.shape), i
        cdef size_t head
        cdef char *mem
        cdef bint versioned = _wants_versioned(max_version)
        if copy:
            raise BufferError("an arena view cannot be copied by the producer (copy=True)")
        if dl_device is not None and tuple(dl_device) != (self._dev_type, self._dev_id):
            raise BufferError(f"the view lives on device {(self._dev_type, self._dev_id)}, "
                              f"not {tuple(dl_device)}")
        head = sizeof(DLManagedTensorVersioned) if versioned else sizeof(DLManagedTensor)
        # The shape lives in the same allocation, right after the struct.
        mem = <char *>malloc(head + sizeof(int64_t) * (nd if nd else 1))
        if mem == NULL:
            raise MemoryError()
        if versioned:
            tv = <DLManagedTensorVersioned *>mem
            tv.version.major = 1
            tv.version.minor = 1       # the FP8 type codes are DLPack 1.1's
            tv.flags = 0               # writable, not a copy
            tv.manager_ctx = <void *>self
            tv.deleter = _dl_deleter_v1
            dl = &tv.dl_tensor
        else:
            t = <DLManagedTensor *>mem
            t.manager_ctx = <void *>self
            t.deleter = _dl_deleter
            dl = &t.dl_tensor
        shp = <int64_t *>(mem + head)
        for i in range(nd):
            shp[i] = self.shape[i]
        dl.data = <void *><uintptr_t>self.ptr
        dl.device.device_type = self._dev_type
        dl.device.device_id = self._dev_id
        dl.ndim = nd
        dl.dtype.code = self._code
        dl.dtype.bits = self._bits
        dl.dtype.lanes = 1
        dl.shape = shp
        dl.strides = NULL       # compact row-major
        dl.byte_offset = 0
        Py_INCREF(self)
        try:
            if versioned:
                return PyCapsule_New(tv, b"dltensor_versioned", _dl_capsule_destructor_v1)
            return PyCapsule_New(t, b"dltensor", _dl_capsule_destructor)
        except BaseException:
            Py_DECREF(self)
            free(mem)
            raise

    def __repr__(self):
        return f"ArenaView({self.name}, {self.dtype}, shape={self.shape}, ptr={self.ptr:#x})"
