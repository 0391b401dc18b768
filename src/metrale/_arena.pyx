# cython: language_level=3, boundscheck=False, wraparound=False, binding=False
"""BufferArena: the buffers of one forward pass, carved from one backend slab.

The C core places the buffers (_layout) and computes every zero range; this
layer holds the pointers as prebuilt Python ints, so an accessor is one tuple
load, drives the backend through cdef calls, and keeps the slab alive while
an operation or a view (_view) uses it.
"""

cimport cython
from cpython.long cimport PyLong_FromSize_t
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport malloc, free

# Buffer ids (MT_HIDDEN_STATES ...) come with the generated accessors below.
from metrale._core cimport (
    MT_IN_CHECKSUM, MT_LIFE_EXPORTED, MT_LIFE_IN_FLIGHT, MT_LIFE_OK, MT_LIFE_RELEASED,
    MT_N_ZERO_ALL, MT_NBUF, mt_buffer_flags, mt_checksum_f32, mt_cursor, mt_cursor_free,
    mt_cursor_new, mt_cursor_take, mt_layout, mt_life, mt_life_close, mt_life_drain,
    mt_life_enter, mt_life_exports, mt_life_free, mt_life_in_flight, mt_life_leave,
    mt_life_new, mt_life_released, mt_range, mt_zero_rows_ranges)
from metrale._backend cimport Backend
from metrale._common cimport as_stream, index_arg, u64_arg, mt_py_finalizing
from metrale._layout cimport plan_into
from metrale._view cimport make_view

cdef extern from "Python.h":
    # C-level warning: a finalizer must not import the warnings module.
    int PyErr_ResourceWarning(object source, Py_ssize_t stack_level, const char *fmt, ...) except -1

from metrale._buffers import BUFFER_NAMES
from metrale.config import ModelConfig
from metrale.errors import MetraleError, OutOfMemoryError
from metrale.moe import MoeFp8Scratch, moe_fp8_layout
from metrale.sizes import BufferSizes, DecodeMetaLayout

cdef object _log = None

cdef object _logger():
    global _log
    if _log is None:
        import logging
        _log = logging.getLogger("metrale")
    return _log

cdef dict _INDEX = {n: i for i, n in enumerate(BUFFER_NAMES)}
cdef tuple _ZEROS = (0,) * MT_NBUF


# Private constructor key: arenas come from BufferArena.new / from_sizes.
cdef object _TOKEN = object()


# no_gc_clear: the finalizer frees the slab through _gpu, which a gc clear
# would have set to None first (the RMM #931 pattern).
@cython.no_gc_clear
cdef class _Arena:
    """The GPU buffers of one forward pass, in one backend slab: everything of
    BufferArena but its per-buffer accessors (generated onto the final class,
    at the end of this module, from src/buffers.h).

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
    cdef tuple _ptrs              # prebuilt pointer ints, by buffer id: an accessor is one tuple load
    cdef tuple _bytes             # recorded sizes, by buffer id
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
        cdef _Arena self
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
        plan_into(&self._L, sizes, max_batch_tokens)
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
        return make_view(self, self._life, i, self._bytes[i], self._ptrs[i],
                         self._gpu.device_type, self._gpu.device_id, dtype, shape)

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


include "_accessors.pxi"
