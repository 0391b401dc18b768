# cython: language_level=3, boundscheck=False, wraparound=False, binding=False
"""BufferArena: the buffers of one forward pass, carved from one backend slab.

The C core (arena_core.c) places the buffers and computes every zero range;
this layer holds the pointers as prebuilt Python ints, so an accessor is one
tuple load, and drives the backend through cdef calls.
"""

cimport cython
from cpython.long cimport PyLong_FromSize_t
from cpython.pycapsule cimport PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer
from cpython.ref cimport Py_INCREF, Py_DECREF, PyObject
from libc.stdint cimport uint8_t, uint16_t, int32_t, int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free

# Buffer ids (MT_HIDDEN_STATES ...) come with the generated accessors below.
from metrale._core cimport (
    MT_IN_CHECKSUM, MT_LIFE_EXPORTED, MT_LIFE_IN_FLIGHT, MT_LIFE_OK,
    MT_LIFE_RELEASED, MT_N_ZERO_ALL, MT_NBUF, MT_OK, mt_buffer_flags, mt_buffer_names, mt_checksum_f32, mt_cursor,
    mt_cursor_free, mt_cursor_new, mt_cursor_take, mt_layout, mt_layout_plan, mt_life,
    mt_life_close, mt_life_drain, mt_life_enter, mt_life_export, mt_life_exports,
    mt_life_free, mt_life_in_flight, mt_life_leave, mt_life_new, mt_life_released,
    mt_life_unexport, mt_range, mt_zero_rows_ranges)
from metrale._backend cimport Backend
from metrale._common cimport MT_MAX_NDIM, as_stream, index_arg, u64_arg, mt_py_finalizing

cdef extern from "Python.h":
    # C-level warning: a finalizer must not import the warnings module.
    int PyErr_ResourceWarning(object source, Py_ssize_t stack_level, const char *fmt, ...) except -1

from metrale.config import ModelConfig
from metrale.errors import MetraleError, OutOfMemoryError
from metrale._buffers import BUFFER_NAMES, GROUPS
from metrale.sizes import BufferSizes, DecodeMetaLayout, moe_fp8_layout

include "_accessors.pxi"

cdef object _log = None

cdef object _logger():
    global _log
    if _log is None:
        import logging
        _log = logging.getLogger("metrale")
    return _log

cdef dict _INDEX = {n: i for i, n in enumerate(BUFFER_NAMES)}
cdef tuple _ZEROS = (0,) * MT_NBUF


cdef int _plan(mt_layout *L, tuple sizes, uint64_t max_batch_tokens) except -1:
    cdef uint64_t raw[MT_NBUF]
    cdef int i
    for i in range(MT_NBUF):
        raw[i] = sizes[i]
    if mt_layout_plan(L, raw, max_batch_tokens) != MT_OK:
        raise ValueError(f"the slab of these sizes exceeds 2^64 - 1 bytes "
                         f"(max_batch_tokens={max_batch_tokens})")
    return 0


def plan_layout(sizes, max_batch_tokens):
    """The slab placement of `sizes` without allocating: a dict with
    `slab_bytes`, `offsets` (name -> offset or None), `slab_order`,
    `zero_all` and `zero_prefill` (offset, length) ranges, and `groups`
    (helper -> the buffer names it covers)."""
    cdef mt_layout L
    if not isinstance(sizes, BufferSizes):
        raise TypeError(f"sizes must be a BufferSizes, got {type(sizes).__name__}")
    _plan(&L, sizes.as_tuple(), u64_arg(max_batch_tokens, "max_batch_tokens", 1))
    offsets = {}
    for i in range(MT_NBUF):
        offsets[BUFFER_NAMES[i]] = L.offset[i] if L.size[i] else None
    return {
        "slab_bytes": L.slab_bytes,
        "offsets": offsets,
        "slab_order": tuple(BUFFER_NAMES[L.order[i]] for i in range(MT_NBUF)),
        "zero_all": (L.zero_all.offset, L.zero_all.length),
        "zero_prefill": (L.zero_prefill.offset, L.zero_prefill.length),
        # Helper membership (ARENA.md §5, §7), from the buffer table.
        "groups": {g: GROUPS[g] for g in ("zero_all", "prefill", "rows", "checksum")},
    }


def buffer_table():
    """The compiled C buffer table: ((name, flags), ...) in canonical order, for
    the tests that check the generated Python and the stubs against it."""
    return tuple((mt_buffer_names[i].decode(), mt_buffer_flags[i]) for i in range(MT_NBUF))


def zero_rows_ranges(sizes, max_batch_tokens, tokens):
    """The (offset, length) ranges, relative to the slab, that
    zero_all_rows(tokens) clears for an arena of `sizes`."""
    cdef mt_layout L
    cdef mt_range r[MT_N_ZERO_ALL]
    if not isinstance(sizes, BufferSizes):
        raise TypeError(f"sizes must be a BufferSizes, got {type(sizes).__name__}")
    _plan(&L, sizes.as_tuple(), u64_arg(max_batch_tokens, "max_batch_tokens", 1))
    n = mt_zero_rows_ranges(&L, u64_arg(tokens, "tokens"), r)
    return [(r[i].offset, r[i].length) for i in range(n)]


# Private constructor key: BufferArena and ArenaView are made only by this module.
cdef object _TOKEN = object()


class MoeFp8Scratch:
    """Device addresses of the FP8 MoE regions for one (config, rows)."""
    __slots__ = ("activation", "scales", "worklist", "total_tiles", "worklist_bytes",
                 "small_worklist", "small_total_tiles", "small_worklist_bytes")

    def __init__(self, activation, scales, worklist, total_tiles, worklist_bytes,
                 small_worklist, small_total_tiles, small_worklist_bytes):
        s = object.__setattr__
        s(self, "activation", activation); s(self, "scales", scales)
        s(self, "worklist", worklist); s(self, "total_tiles", total_tiles)
        s(self, "worklist_bytes", worklist_bytes); s(self, "small_worklist", small_worklist)
        s(self, "small_total_tiles", small_total_tiles)
        s(self, "small_worklist_bytes", small_worklist_bytes)

    def __setattr__(self, name, value):
        raise AttributeError("MoeFp8Scratch is read-only")

    def _key(self):
        return tuple(getattr(self, n) for n in MoeFp8Scratch.__slots__)

    def __eq__(self, other):
        if type(other) is not MoeFp8Scratch:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return "MoeFp8Scratch(" + ", ".join(f"{n}={getattr(self, n):#x}" if n in ("activation", "scales", "worklist", "total_tiles", "small_worklist", "small_total_tiles") else f"{n}={getattr(self, n)}" for n in MoeFp8Scratch.__slots__) + ")"


# no_gc_clear: the finalizer frees the slab through _gpu, which a gc clear
# would have set to None first (the RMM #931 pattern).
@cython.no_gc_clear
@cython.final
cdef class BufferArena(_BufferAccessors):
    """The GPU buffers of one forward pass (ARENA.md), in one backend slab.

    Lifetime: the arena owns its slab until `release(gpu)`.  A live view (and
    every array made from one) keeps the slab: `release` then raises
    BufferError and frees nothing.  An operation running on another thread
    keeps it until it returns: `release` waits for it.  Nothing starts on a
    released arena.
    """

    cdef Backend _gpu
    cdef object _config, _sizes, _decode_meta, _mbt
    cdef mt_layout _L
    cdef uintptr_t _base
    cdef mt_cursor *_cursor       # row-wise carve cursor (ARENA.md §6)
    cdef mt_life *_life           # released flag, live views, operations in flight
    cdef dict _moe_cache
    cdef object __weakref__

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("use BufferArena.new(...) or BufferArena.from_sizes(...)")
        self._ptrs = _ZEROS
        self._bytes = _ZEROS
        self._cursor = mt_cursor_new()
        self._life = mt_life_new()
        if self._cursor == NULL or self._life == NULL:
            raise OutOfMemoryError("cannot allocate the arena's bookkeeping")

    # -- construction ------------------------------------------------------------
    @staticmethod
    def new(config, max_batch_tokens, max_seq_len, kv_block_size, max_batch_size, gpu):
        """Size the buffers with BufferSizes.from_config for `gpu.target()` and allocate them."""
        if not isinstance(gpu, Backend):
            raise TypeError(f"gpu must be a backend (HostBackend or CudaBackend), got {type(gpu).__name__}")
        sizes = BufferSizes.from_config(config, max_batch_tokens, max_seq_len, kv_block_size,
                                        max_batch_size, target=gpu.target(), env=None)
        return BufferArena.from_sizes(config, sizes, max_batch_tokens, max_batch_size, gpu)

    @staticmethod
    def from_sizes(config, sizes, max_batch_tokens, max_batch_size, gpu):
        """BufferArena.new with the sizes passed in (trusted as given)."""
        cdef BufferArena self
        cdef Backend be
        cdef uintptr_t base = 0
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        if not isinstance(sizes, BufferSizes):
            raise TypeError(f"sizes must be a BufferSizes, got {type(sizes).__name__}")
        if not isinstance(gpu, Backend):
            raise TypeError(f"gpu must be a backend (HostBackend or CudaBackend), got {type(gpu).__name__}")
        max_batch_tokens = index_arg(max_batch_tokens, "max_batch_tokens", 1)
        decode_meta = DecodeMetaLayout.for_max_batch_size(max_batch_size)
        be = <Backend>gpu
        self = BufferArena.__new__(BufferArena, _TOKEN)
        self._gpu = be
        self._config = config
        self._sizes = sizes
        self._mbt = max_batch_tokens
        self._decode_meta = decode_meta
        self._moe_cache = {}
        cdef tuple values = sizes.as_tuple()
        _plan(&self._L, values, max_batch_tokens)
        self._bytes = values
        if self._L.slab_bytes:
            try:
                be.alloc(self._L.slab_bytes, &base)
            except OutOfMemoryError as e:
                live = sum(1 for v in values if v)
                raise OutOfMemoryError(
                    f"buffer arena slab: cannot allocate {self._L.slab_bytes} bytes "
                    f"for {live} buffers (max_batch_tokens={max_batch_tokens}): {e}") from e
            # Past this point any failure frees the slab before it propagates.
            try:
                if self._L.size[MT_NORM_UNIT_W]:
                    be.memset(base + self._L.offset[MT_NORM_UNIT_W], self._L.size[MT_NORM_UNIT_W], 0)
                    be.sync(0)
            except BaseException:
                try:
                    be.free(base, self._L.slab_bytes)
                except Exception as fe:
                    _logger().warning("buffer arena: free after a failed construction failed: %s", fe)
                raise
        self._base = base
        self._ptrs = tuple(PyLong_FromSize_t(base + self._L.offset[i]) if self._L.size[i] else 0
                           for i in range(MT_NBUF))
        _logger().info(
            "Buffer arena: %d tokens x %.1f MiB total (attn_out=%d, ssm_deint=%d, kv_lora_rank=%d)",
            max_batch_tokens, sizes.total_bytes() / 1048576.0, sizes.attn_output,
            sizes.ssm_deinterleaved, config.kv_lora_rank)
        return self

    # -- teardown ----------------------------------------------------------------
    def label(self):
        return "buffer arena"

    def release(self, gpu):
        """Free the slab. Idempotent; afterwards every pointer accessor returns 0.

        Operations already running on other threads are waited for (with the
        GIL released); any started later raise MetraleError.  Refused, freeing
        nothing: BufferError while a view of the arena (or an array made from
        one) is alive; MetraleError when called from inside an operation (a
        logging handler, a stream callback) while one is running here.
        """
        if gpu is not self._gpu:
            raise MetraleError("release: this backend is not the arena's own")
        rc = mt_life_close(self._life)
        if rc == MT_LIFE_RELEASED:
            return None
        if rc == MT_LIFE_EXPORTED:
            raise BufferError(f"release: the arena's memory is still exported ({self._exported()}); "
                              "nothing was freed: drop those views and every array made from them "
                              "(numpy, DLPack, __cuda_array_interface__), then release again")
        if rc == MT_LIFE_IN_FLIGHT:
            raise MetraleError(
                f"release: called from inside an operation (a logging handler or stream callback) "
                f"while {mt_life_in_flight(self._life)} operation(s) on this arena are still "
                "running; nothing was freed: release after they return")
        with nogil:
            mt_life_drain(self._life)
        base, n = self._base, self._L.slab_bytes
        self._base = 0
        self._ptrs = _ZEROS
        if base:
            self._gpu.free(base, n)   # raises MetraleError with the driver's error name
        return None

    cdef str _exported(self):
        cdef uint64_t k
        parts = []
        for i in range(MT_NBUF):
            k = mt_life_exports(self._life, i)
            if k:
                parts.append(f"{BUFFER_NAMES[i]}: {k} view{'s' if k > 1 else ''}")
        return ", ".join(parts) or "views being dropped right now"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release(self._gpu)
        return False

    def __del__(self):
        # At exit the warnings machinery may be gone: free silently then.
        if self._base and not mt_life_released(self._life) and not mt_py_finalizing():
            # source None: a recorded warning must not keep the arena alive.
            PyErr_ResourceWarning(None, 1, "unreleased buffer arena (%llu bytes) freed by the "
                                  "garbage collector; call release(gpu) or use it as a context manager",
                                  <unsigned long long>self._L.slab_bytes)

    def __dealloc__(self):
        # No view and no operation can be alive here: each holds a reference.
        if self._life != NULL and not mt_life_released(self._life) and self._base and self._gpu is not None:
            self._gpu.free_quiet(self._base, self._L.slab_bytes)
            self._base = 0
        if self._cursor != NULL:
            mt_cursor_free(self._cursor)
            self._cursor = NULL
        if self._life != NULL:
            mt_life_free(self._life)
            self._life = NULL

    cdef inline int _enter(self, object gpu) except -1:
        """Start an operation that touches the slab; pair with mt_life_leave."""
        if gpu is not self._gpu:
            raise MetraleError("this backend is not the arena's own (pass the backend the arena was built with)")
        if mt_life_enter(self._life) != MT_LIFE_OK:
            raise MetraleError("the buffer arena has been released")
        return 0

    # -- zeroing (ARENA.md §5) -------------------------------------------------------
    cdef int _zero_range(self, object gpu, object stream, const mt_range *r) except -1:
        """One memset over a range of the slab that the layout made contiguous."""
        cdef uintptr_t s
        self._enter(gpu)
        try:
            s = as_stream(stream)
            if r.length:
                self._gpu.memset(self._base + r.offset, r.length, s)
        finally:
            mt_life_leave(self._life)
        return 0

    def zero_all(self, gpu, stream):
        """Zero the 18 zero_all buffers whole: one operation over their contiguous range."""
        self._zero_range(gpu, stream, &self._L.zero_all)

    def zero_prefill_essentials(self, gpu, stream):
        """Zero hidden_states, residual, gate_logits, the expert outputs and moe_output: one operation."""
        self._zero_range(gpu, stream, &self._L.zero_prefill)

    def zero_all_rows(self, gpu, stream, tokens):
        """zero_all limited to rows 0..tokens of each token-major buffer (ARENA.md §5.2)."""
        cdef mt_range r[MT_N_ZERO_ALL]
        cdef int n
        cdef uintptr_t s
        cdef uint64_t t
        self._enter(gpu)
        try:
            t = u64_arg(tokens, "tokens")
            s = as_stream(stream)
            n = mt_zero_rows_ranges(&self._L, t, r)
            if n:
                self._gpu.zero_ranges(self._base, r, n, s)
        finally:
            mt_life_leave(self._life)

    # -- checksum (ARENA.md §7) ---------------------------------------------------------
    def debug_buffer_checksum(self, gpu, stream, tag):
        """Log sum, sum of squares and sum of |x| of the 16 probed buffers, read as f32 lanes."""
        cdef double out[3]
        cdef void *host = NULL
        cdef uint64_t most = 0, n
        cdef uintptr_t s, base
        cdef int b
        if not isinstance(tag, str):
            raise TypeError(f"tag must be a str, got {type(tag).__name__}")
        # Held across the loop, log calls included: a handler that releases
        # the arena is refused instead of freeing the slab under the copies.
        self._enter(gpu)
        try:
            s = as_stream(stream)
            base = self._base
            try:
                self._gpu.sync(s)
            except Exception:
                pass
            for b in range(MT_NBUF):
                if mt_buffer_flags[b] & MT_IN_CHECKSUM and self._L.size[b] > most:
                    most = self._L.size[b]
            if most == 0:
                return None
            host = malloc(most)
            if host == NULL:
                _logger().warning("METRALE_BUF_CKSUM[%s] skipped: no %d-byte host buffer", tag, most)
                return None
            log = _logger()
            for b in range(MT_NBUF):     # canonical order is the order of §7
                n = self._L.size[b]
                if not mt_buffer_flags[b] & MT_IN_CHECKSUM or n == 0:
                    continue
                try:
                    self._gpu.d2h(host, base + self._L.offset[b], n, s)
                except Exception:
                    continue     # a failed copy skips that buffer (ARENA.md §7)
                with nogil:
                    mt_checksum_f32(host, n, out)
                log.warning("METRALE_BUF_CKSUM[%s] %s bytes=%d sum=%.6f ssq=%.6f sabs=%.6f",
                            tag, BUFFER_NAMES[b], n, out[0], out[1], out[2])
        finally:
            free(host)
            mt_life_leave(self._life)
        return None

    # -- FP8 MoE scratch (ARENA.md §4.9) ------------------------------------------------------
    def moe_fp8_scratch(self, config, rows):
        """Fixed offsets of the FP8 MoE slab for (config, rows); pure, allocates nothing."""
        # Keyed on exact ints only: True == 1 and hashes alike, but must still raise.
        key = (config, rows)
        hit = None
        released = mt_life_released(self._life)
        if type(rows) is int:
            try:
                hit = self._moe_cache.get(key)
            except TypeError:        # an unhashable config: validated below
                pass
        if hit is not None and not released:
            return hit
        layout = moe_fp8_layout(config, rows)      # checks config and rows
        cap = self._bytes[MT_MOE_FP8_SCRATCH]
        base = self._ptrs[MT_MOE_FP8_SCRATCH]
        if rows > self._mbt or layout.bytes == 0 or layout.bytes > cap or base == 0:
            why = " (the arena was released)" if released else ""
            raise MetraleError(
                f"FP8 MoE scratch does not fit the arena: rows={rows} (max_batch_tokens="
                f"{self._mbt}) needs {layout.bytes} bytes, capacity {cap} bytes{why}")
        small = layout.small_bytes > 0
        result = MoeFp8Scratch(
            base, base + layout.scale, base + layout.worklist, base + layout.counter,
            layout.counter - layout.worklist,
            base + layout.small_worklist if small else 0,
            base + layout.small_counter if small else 0, layout.small_bytes)
        if type(key[1]) is int and len(self._moe_cache) < 64:
            self._moe_cache[key] = result
        return result

    # -- row-wise slab (ARENA.md §6) ---------------------------------------------------------
    def take_ssm_rowwise_w_bf16(self, nbytes):
        """Carve the next `nbytes` of the row-wise slab (one atomic cursor step)."""
        cdef uint64_t base = 0, want, size
        want = u64_arg(nbytes, "bytes")
        size = self._L.size[MT_SSM_ROWWISE_W_BF16]
        if size == 0 or mt_life_enter(self._life) != MT_LIFE_OK:
            raise MetraleError(
                f"row-wise BF16 weight slab is absent: cannot carve {want} bytes; the arena was "
                "sized without METRALE_FP8_ROWWISE=1 (or has been released). The weight loader "
                "and this slab read the same lever, so they cannot legitimately disagree")
        try:
            if mt_cursor_take(self._cursor, want, size, &base) != 0:
                raise MetraleError(
                    f"row-wise BF16 weight slab exhausted: cannot carve {want} bytes at offset "
                    f"{base} of a {size}-byte slab; the slab is sized for num_ssm_layers x "
                    "(in_proj_qkvz + out_proj), so this is a sizing bug")
            return PyLong_FromSize_t(self._base + self._L.offset[MT_SSM_ROWWISE_W_BF16] + base)
        finally:
            mt_life_leave(self._life)

    # -- views -------------------------------------------------------------------------
    def view(self, name, dtype, shape=None):
        """A zero-copy view of buffer `name` for numpy / torch / CuPy (DLPack and
        the array interfaces).  While the view, or any array made from it, is
        alive, release() refuses with BufferError: the memory stays valid."""
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        i = _INDEX.get(name)
        if i is None:
            raise ValueError(f"unknown buffer name {name!r}")
        return ArenaView._make(self, i, dtype, shape)

    # -- plain accessors ---------------------------------------------------------------------
    def max_batch_tokens(self):
        return self._mbt

    def decode_meta(self):
        return self._decode_meta

    def sizes(self):
        return self._sizes

    def slab_bytes(self):
        """Bytes of the one backend allocation (footprint, padding included)."""
        return self._L.slab_bytes

    def is_released(self):
        return bool(mt_life_released(self._life))

    def __repr__(self):
        state = "released" if mt_life_released(self._life) else f"{self._L.slab_bytes} bytes at {self._base:#x}"
        return f"<BufferArena max_batch_tokens={self._mbt} {state}>"


# ---- DLPack / array-interface views ----------------------------------------------------

cdef struct DLDevice:
    int32_t device_type
    int32_t device_id

cdef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

cdef struct DLTensor:
    void *data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t *shape
    int64_t *strides
    uint64_t byte_offset

cdef struct DLManagedTensor:
    DLTensor dl_tensor
    void *manager_ctx
    void (*deleter)(DLManagedTensor *) noexcept nogil

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
    cdef readonly object arena
    cdef readonly str name
    cdef readonly str dtype
    cdef readonly tuple shape
    cdef readonly object ptr
    cdef readonly object nbytes
    cdef int _dev_type, _dev_id, _code, _bits, _buf
    cdef mt_life *_life           # the arena's, once this view is counted in it

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("use BufferArena.view(name, dtype, shape) to make a view")

    @staticmethod
    cdef ArenaView _make(BufferArena arena, int buf, dtype, shape):
        cdef ArenaView v
        cdef int rc
        name = BUFFER_NAMES[buf]
        nbytes = arena._bytes[buf]
        dname = _dtype_name(dtype)
        typestr, code, bits = _DTYPES[dname]
        item = bits // 8
        shape, count = _view_shape(shape, nbytes, item, name)
        v = ArenaView.__new__(ArenaView, _TOKEN)
        rc = mt_life_export(arena._life, buf)
        if rc == MT_LIFE_RELEASED:
            raise MetraleError("the buffer arena has been released")
        if rc != MT_LIFE_OK:
            raise MetraleError("too many live views of this arena")
        # Counted from here: the pointer stays valid until this view is gone.
        v._life = arena._life
        v._buf = buf
        v.arena, v.name, v.dtype, v.shape = arena, name, dname, shape
        v.ptr, v.nbytes = arena._ptrs[buf], count * item
        v._dev_type, v._dev_id = arena._gpu.device_type, arena._gpu.device_id
        v._code, v._bits = code, bits
        return v

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
