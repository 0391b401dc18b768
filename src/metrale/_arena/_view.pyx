# cython: language_level=3, binding=False
"""Views: a typed window (ArenaView) on one arena buffer for numpy, torch and
CuPy, through DLPack and the (CUDA) array interface, never copied, and each
buffer's own element type and shape.  Each live view is counted in its
arena's lifetime word, so the arena refuses to free the memory under it.
The FP8 MoE scratch regions (`moe_fp8_scratch`) are windows on one buffer
too.  BufferArena binds `view` and `moe_fp8_scratch` from here."""

cimport cython
from cpython.pycapsule cimport PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer
from cpython.ref cimport Py_INCREF, Py_DECREF
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free

from metrale._arena._arena_state cimport ArenaState, refuse
from metrale._base._common cimport MT_MAX_NDIM, dtype_info, index_arg
from metrale._base._core cimport MT_LIFE_OK, mt_life
from metrale._base._life cimport mt_life_export, mt_life_released, mt_life_unexport
from metrale._base._dlpack cimport DLManagedTensor, DLManagedTensorVersioned, DLTensor

from metrale._base.errors import MetraleError
from metrale._sizing.moe import MoeFp8Scratch, moe_fp8_layout

# Private constructor key: views come from BufferArena.view().
cdef object _TOKEN = object()


cdef tuple buffer_dtypes(object buffers):
    return tuple(s.dtype for s in buffers)


@cython.binding(True)
def view(ArenaState self, name, dtype=None, shape=None):
    """A typed, zero-copy view of one buffer for numpy, torch or CuPy.

    The view exports the buffer through DLPack (``np.from_dlpack``,
    ``torch.from_dlpack``, ``cupy.from_dlpack``) and the array interface
    of its device (``__array_interface__`` on the host,
    ``__cuda_array_interface__`` on a GPU).  While the view, or any array
    made from it, is alive, `release` refuses with BufferError: the
    memory stays valid.

    Parameters
    ----------
    name : str
        A buffer of the arena's set.
    dtype : str, numpy.dtype, type or torch.dtype, optional
        Element type, as numpy reads it (``'float32'``, ``'<f4'``,
        ``np.float16``, ``float`` is float64), or ``'bfloat16'``,
        ``'float8_e4m3fn'``, ``'float8_e5m2'``.  None (the default): the
        buffer's own element type (``buffers[name].dtype``, its spec's;
        docs/buffers.md for the reference buffers); a buffer of raw bytes
        or mixed elements has none and needs one given.
    shape : int or tuple of int, optional
        Row-major shape; at most the buffer's bytes.  None: the buffer's
        own shape at the arena's limits (``[max_batch_tokens,
        hidden_size]`` for ``hidden_states``, per rank) when the element
        type has the spec's size (its own type, or another of that width:
        ``"uint16"`` for the bits of a bf16 buffer); all of it, 1-D, for
        another size, or where the buffer's spec has no exact shape.

    Returns
    -------
    ArenaView

    Raises
    ------
    TypeError, ValueError
        Unknown buffer, unsupported dtype, no dtype for a buffer that
        has none, or a shape that is malformed or larger than the buffer.
    MetraleError
        The arena is released, or the buffer is empty and the shape not.
    """
    cdef ArenaState a = self
    if type(name) is not str:      # a str subclass could run code in the lookup
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    i = a._index.get(name)
    if i is None:
        raise ValueError(f"name: {a._buffers._unknown(name)}")
    if dtype is None:
        dtype = a._buffers.specs[i].dtype
        if dtype is None:
            raise TypeError(f"view: {name} holds raw bytes or mixed elements and has no "
                            "element type of its own (its spec's dtype is None): give a dtype")
    request = view_request(dtype, shape)       # may run user code: before anything is read
    if shape is None and request[0][3] // 8 == a._buffers.specs[i].itemsize:
        # Elements of the spec's size (its own type, or another of that width:
        # uint16 for bf16's bits): the spec's shape, as the buffer is laid out.
        own = own_shape(a, name)
        if own is not None:
            request = (request[0], _dims(own, request[0][3] // 8))
    rc = mt_life_export(a._life, i)
    if rc != MT_LIFE_OK:
        refuse(a, rc, "view", i)
    try:        # counted: no reshape can change the buffer until the view is gone
        return make_view(a, a._life, i, name, a._bytes[i], a._ptrs[i], a._gpu.device_type,
                         a._gpu.device_id, request)
    except BaseException:
        mt_life_unexport(a._life, i)
        raise


cdef object own_shape(ArenaState a, str name):
    """The spec's shape of buffer `name` at the arena's limits, or None
    (then the view is 1-D) where it has none or the limits are unknown."""
    if a._limits is None:
        return None
    from metrale._sizing.catalogue import shape_of, symbols
    values = symbols(a._config, *a._limits, target=a._gpu.target(), env=a._sizes.levers(),
                     tp_size=a._tp)
    shape = shape_of(name, values, buffers=a._buffers)
    if shape is not None:
        n = a._buffers[name].itemsize
        for d in shape:
            n *= d
        if n > a._bytes[a._index[name]]:
            return None     # sizes made for another target or by hand: 1-D, all of it
    return shape


@cython.binding(True)
def moe_fp8_scratch(ArenaState self, config, rows):
    """The regions of the grouped FP8 MoE scratch for `rows` tokens.

    Pure: fixed offsets inside the ``moe_fp8_scratch`` buffer
    (activations, scales, work lists and their counters); cached per
    (config, rows).

    Parameters
    ----------
    config : ModelConfig
        The model's shape (its experts set the work list sizes).
    rows : int
        Tokens of the MoE layer call (<= max_batch_tokens).

    Returns
    -------
    MoeFp8Scratch
        Device pointers (ints) and sizes of each region.

    Raises
    ------
    TypeError, ValueError
        A bad `config` or `rows`.
    MetraleError
        The layout does not fit this arena's buffer (rows above
        max_batch_tokens, a dense model, or a released arena).
    """
    cdef ArenaState a = self
    key = (config, rows)            # exact ints only: True == 1 but must still raise
    released = mt_life_released(a._life)
    hit = None
    if type(rows) is int:
        try:
            hit = a._moe_cache.get(key)
        except TypeError:           # an unhashable config: validated below
            pass
    if hit is not None and not released:
        return hit
    layout = moe_fp8_layout(config, rows)      # checks config and rows
    i = a._index.get("moe_fp8_scratch")
    cap, base = (0, 0) if i is None else (a._bytes[i], a._ptrs[i])
    if rows > a._max_tokens or layout.bytes == 0 or layout.bytes > cap or base == 0:
        raise MetraleError(
            f"FP8 MoE scratch does not fit the arena: rows={rows} (max_batch_tokens="
            f"{a._max_tokens}) needs {layout.bytes} bytes, capacity {cap} bytes"
            + (" (the arena was released)" if released else "")
            + (" (its buffer set has no moe_fp8_scratch)" if i is None else ""))
    small = layout.small_bytes > 0
    result = MoeFp8Scratch(
        base, base + layout.scale, base + layout.worklist, base + layout.counter,
        layout.counter - layout.worklist, base + layout.small_worklist if small else 0,
        base + layout.small_counter if small else 0, layout.small_bytes)
    if type(rows) is int and len(a._moe_cache) < 64:
        a._moe_cache[key] = result
    return result


cdef tuple view_request(object dtype, object shape):
    """(dtype_info(dtype), dims or None) of a view request: every conversion
    that can run user code (a dtype's hash or name, a shape element's
    __index__), done before the arena's state is read."""
    info = dtype_info(dtype)
    return info, None if shape is None else _dims(shape, info[3] // 8)


cdef ArenaView make_view(object arena, mt_life *life, int buf, str name, uint64_t nbytes,
                         object ptr, int dev_type, int dev_id, tuple request):
    """A view of `request` over buffer `buf`; the caller has counted its
    export in `life` (the view then owns it; on an exception the caller
    still does) and read `nbytes` and `ptr` after counting it."""
    cdef ArenaView v
    info, dims = request
    dname, typestr, code, bits = info
    item = bits // 8
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
