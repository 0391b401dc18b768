# cython: language_level=3, binding=False
"""StepInputs: the host side of what an engine uploads every step
(docs/step-inputs.md).

The slab places token_ids first and scratch right after it (src/layout.c),
so token_ids, the int32 token count at scratch + 32,752 and the decode
metadata at scratch + 32,768 lie in one device span: one pinned host buffer
laid out byte for byte like that span, copied by one cuMemcpyHtoDAsync.
BufferArena binds `step_inputs`, which makes them, from here.
"""

cimport cython
from libc.stdint cimport int32_t, uint64_t, uintptr_t
from libc.string cimport memcpy, memset as c_memset

from metrale._arena._arena_state cimport ArenaState, reshapes
from metrale._backends._backend cimport Backend
from metrale._base._common cimport as_stream, u64_arg
from metrale._base._core cimport (
    MT_LIFE_FORKED, MT_LIFE_OK, MT_LIFE_RELEASED, MT_WAIT_ALL, mt_life, mt_rows_args,
    mt_rows_args_init)
from metrale._base._life cimport (
    mt_life_close, mt_life_enter, mt_life_exports, mt_life_forked, mt_life_leave,
    mt_life_released, mt_life_reopen, mt_life_unexport, raise_life, wait_life)
from metrale._base._debug_core cimport MT_GUARD_BYTE
from metrale._backends._staging cimport _export, _Staging, staging_new

from metrale._base.errors import MetraleError
from metrale._sizing.decode_meta import _DECODE_META_OFFSET, _STEP_COUNT_OFFSET, kv_blocks_per_seq

# Private constructor key: step inputs come from BufferArena.step_inputs().
cdef object _TOKEN = object()

# numpy dtype name -> the values it holds, for the range check of fill().
_INT_RANGES = {"uint32": (0, 2**32 - 1), "int32": (-2**31, 2**31 - 1),
               "int64": (-2**63, 2**63 - 1)}
cdef dict _SAFE = {}         # (array dtype, region dtype) -> every value fits
# Regions that hold lengths: never negative, whatever their type could hold.
_LENGTHS = frozenset(["seq_lens"])


cdef bint _fits(object have, str want) except -1:
    """Whether every value of dtype `have` fits `want` (then fill() skips the
    range scan: the common case, arrays of the region's own type)."""
    key = (have, want)
    ok = _SAFE.get(key)
    if ok is None:
        import numpy
        ok = bool(numpy.can_cast(have, want, "safe"))
        if len(_SAFE) < 256:
            _SAFE[key] = ok
    return ok

# decode metadata region -> (numpy dtype name, its offset method of DecodeMetaLayout)
_META_REGIONS = (
    ("positions", "uint32", "positions_offset"),
    ("seq_slot", "int32", "seq_slot_offset"),
    ("slots", "int64", "slots_offset"),
    ("seq_lens", "int32", "seq_lens_offset"),
)


# no_gc_clear: the finalizer destroys the event through _gpu; an engine object
# that holds its StepInputs in a reference cycle is collected by the cyclic
# collector, which would otherwise clear _gpu first.
@cython.no_gc_clear
@cython.final
cdef class StepInputs:
    """StepInputs(...)
--

Pinned host staging for one step's inputs, uploaded with one copy.

    Made by `BufferArena.step_inputs`.  The staging is page-locked host
    memory laid out byte for byte like one device span of the arena: the
    ``token_ids`` buffer, the int32 token count at ``scratch + 32,752`` and
    the batched-decode metadata at ``scratch + 32,768`` (the
    `DecodeMetaLayout` of the arena's ``max_batch_size``).  Fill it through
    the named numpy views (or `fill`), then `upload` moves the whole span
    with one ``cuMemcpyHtoDAsync`` and, by default, enqueues the zeroing of
    ``zero_all_rows`` for the count just uploaded, read on the device.  Both
    can be captured in a CUDA graph: each replay uploads whatever the host
    wrote into the staging since, and zeroes for that count, so one graph
    serves every batch size.

    The copy runs in stream order, after `upload` returns: until it has
    run the host must not write the staging (the copy could carry a mix of
    old and new values).  `wait` (or `event`, to order another stream)
    says when it has.  The views stay valid until `release`, which refuses
    while one is alive.

    Attributes
    ----------
    layout : DecodeMetaLayout
        The decode metadata's layout (its rows are R).
    max_blocks : int
        Columns of ``block_table`` (KV blocks per sequence).
    max_batch_tokens : int
        Rows of ``token_ids``.
    nbytes : int
        Bytes of the staging, and of each upload's copy.
    """

    cdef ArenaState _arena
    cdef Backend _gpu
    cdef _Staging _staging        # the pinned memory and its lifetime word
    cdef mt_life *_life           # _staging's word: views, operations, released
    cdef unsigned char *_host
    cdef readonly uint64_t nbytes
    cdef uintptr_t _dst, _event
    cdef uint64_t _count_off, _built_at
    cdef bint _has_event
    cdef mt_rows_args _rows
    cdef dict _regions, _views
    cdef readonly object layout
    cdef readonly uint64_t max_blocks, max_batch_tokens

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("StepInputs is made by BufferArena.step_inputs()")
        self._views = {}

    cdef int _build(self, ArenaState arena, uint64_t max_blocks, int ids, int scratch) except -1:
        cdef uint64_t tok = arena._layout.offset[ids], scr = arena._layout.offset[scratch]
        cdef uint64_t span, i
        cdef _Staging staging
        layout = arena._decode_meta
        meta = layout.meta_bytes(max_blocks)        # a Python int: may exceed 64 bits
        if _DECODE_META_OFFSET + meta > arena._layout.size[scratch]:
            raise ValueError(f"max_blocks={max_blocks}: the decode metadata ({meta} bytes at "
                             f"scratch + {_DECODE_META_OFFSET}) does not fit scratch "
                             f"({arena._layout.size[scratch]} bytes)")
        if arena._layout.size[ids] == 0 or arena._layout.size[scratch] == 0 or scr < tok:
            raise MetraleError("step_inputs: this arena's token_ids or scratch is empty, or its "
                               "slab does not place scratch after token_ids")
        span = scr - tok + _DECODE_META_OFFSET + meta
        self._arena = arena
        self._gpu = arena._gpu
        self.layout = layout
        self.max_blocks = max_blocks
        # token_ids' rows: max_batch_tokens, unless from_sizes gave it fewer bytes
        self.max_batch_tokens = min(arena._layout.size[ids] // 4, arena._layout.max_batch_tokens)
        self._built_at = reshapes(arena)
        self._dst = arena._base + tok
        self._count_off = scr - tok + _STEP_COUNT_OFFSET
        m = scr - tok + _DECODE_META_OFFSET
        R = layout.rows()
        self._regions = {
            "token_ids": ("uint32", 0, (self.max_batch_tokens,)),
            "count": ("int32", self._count_off, (1,)),
            "block_table": ("int32", m + layout.block_table_offset(), (R, max_blocks)),
        }
        for name, dtype, method in _META_REGIONS:
            self._regions[name] = (dtype, m + getattr(layout, method)(), (R,))
        staging = staging_new(self._gpu)
        self._gpu.host_alloc(span, <void **>&staging._host)
        staging.nbytes = span
        self._staging = staging
        self._life = staging._life
        self._host = staging._host
        self.nbytes = span
        c_memset(self._host, 0, span)
        # A debug arena's guard band after token_ids lies in the span: the
        # staging carries its pattern, so an upload leaves it intact.
        if arena._layout.guard:
            for i in range(arena._layout.size[ids], scr - tok):
                self._host[i] = MT_GUARD_BYTE(tok + i)
        self._gpu.event_create(&self._event)
        self._has_event = True
        # The zeroing upload() enqueues spares the span: it was just written.
        if mt_rows_args_init(&arena._layout, tok, tok + span, &self._rows) < 0:
            raise MetraleError("step_inputs: more zero_all buffers than one launch holds")
        self._rows.base = arena._base
        self._rows.count_at = self._dst + self._count_off
        return 0

    def __dealloc__(self):
        # The staging (and its memory) lives on while a view of it does.
        if self._has_event and not (self._life != NULL and mt_life_forked(self._life)
                                    and self._gpu.device_type != 1):
            self._gpu.event_destroy(self._event)

    cdef int _check(self) except -1:
        """Refuse (with the lifetime word's reason) unless usable."""
        if self._life == NULL:
            raise MetraleError("these step inputs were not built")
        if mt_life_released(self._life):
            raise_life(MT_LIFE_RELEASED, "these step inputs", "")
        return 0

    cdef object _view(self, str name):
        v = self._views.get(name)
        if v is not None:
            return v
        self._check()
        import numpy
        dtype, off, shape = self._regions[name]
        n = 1
        for d in shape:
            n *= d
        v = numpy.frombuffer(self._staging, dtype=dtype, count=n, offset=off).reshape(shape)
        self._views[name] = v
        return v

    @property
    def token_ids(self):
        """numpy.ndarray of uint32, shape (max_batch_tokens,): the token ids."""
        return self._view("token_ids")

    @property
    def count(self):
        """numpy.ndarray of int32, shape (1,): the token count (see `tokens`)."""
        return self._view("count")

    @property
    def positions(self):
        """numpy.ndarray of uint32, shape (R,): each row's position."""
        return self._view("positions")

    @property
    def seq_slot(self):
        """numpy.ndarray of int32, shape (R,): each row's LoRA slot."""
        return self._view("seq_slot")

    @property
    def slots(self):
        """numpy.ndarray of int64, shape (R,): each row's KV slot."""
        return self._view("slots")

    @property
    def seq_lens(self):
        """numpy.ndarray of int32, shape (R,): each row's sequence length."""
        return self._view("seq_lens")

    @property
    def block_table(self):
        """numpy.ndarray of int32, shape (R, max_blocks): the block tables."""
        return self._view("block_table")

    @property
    def tokens(self):
        """The token count the next upload carries (int, 0 .. 2**31 - 1).

        The zeroing of `upload` reads it on the device; so may the step's
        kernels, at `count_at`.
        """
        cdef int32_t v
        self._enter()
        memcpy(&v, self._host + self._count_off, 4)
        mt_life_leave(self._life)
        return v

    @tokens.setter
    def tokens(self, value):
        cdef int32_t v = <int32_t>u64_arg(value, "tokens", 0, 0x7FFFFFFF)
        self._enter()
        memcpy(self._host + self._count_off, &v, 4)
        mt_life_leave(self._life)

    cdef int _enter(self) except -1:
        rc = mt_life_enter(self._life)
        if rc != MT_LIFE_OK:
            raise_life(rc, "these step inputs", "")
        return 0

    # The staging as a buffer (memoryview(st)): counted like the named views.
    def __getbuffer__(self, Py_buffer *view, int flags):
        _export(view, flags, self, self._life, self._host, self.nbytes)

    def __releasebuffer__(self, Py_buffer *view):
        mt_life_unexport(self._life, 0)

    @property
    def count_at(self):
        """Device address of the uploaded int32 token count (int)."""
        return self._dst + self._count_off

    @property
    def device_span(self):
        """``(address, nbytes)`` of the device span `upload` writes."""
        return (self._dst, self.nbytes)

    @property
    def event(self):
        """The event `upload` records once its copy has run (int handle).

        A ``CUevent`` on CUDA, for ``cuStreamWaitEvent`` on another stream;
        inside a captured graph it is an event-record node, so each replay
        records it.  On the host backend work runs at the call: 1.
        """
        return self._event

    # -- filling -------------------------------------------------------------------
    def fill(self, token_ids=None, positions=None, seq_slot=None, slots=None, seq_lens=None,
             block_table=None, tokens=None):
        """Write one step's inputs into the staging, checked against its layout.

        Every array is checked before anything is written: its dimension,
        its shape against its region, and its values against the region's
        element type (no value is wrapped).  Each then goes to the first
        rows of its region (the rows after them keep what they held);
        `tokens` is set too.

        Parameters
        ----------
        token_ids : array_like of int, 1-D, optional
            At most ``max_batch_tokens`` token ids, each in 0 .. 2**32 - 1.
            May be left out when `tokens` is given (only the metadata
            changes).
        positions : array_like of int, 1-D, optional
            At most R values, each in 0 .. 2**32 - 1.
        seq_slot, seq_lens : array_like of int, 1-D, optional
            At most R values each, int32 (a length in `seq_lens` >= 0).
        slots : array_like of int, 1-D, optional
            At most R values, int64.
        block_table : array_like of int, 2-D, optional
            At most R rows of at most ``max_blocks`` columns, int32.
        tokens : int, optional
            The token count; the length of `token_ids` when None.

        Raises
        ------
        ValueError
            An array of the wrong dimension, longer than its region, or with
            a value its region's type cannot hold (each named), or `tokens`
            out of range; nothing is written.
        TypeError
            Neither `token_ids` nor `tokens`, or an array that is not of
            integers (bool included); nothing is written.
        MetraleError
            The step inputs are released.
        """
        if token_ids is None and tokens is None:
            raise TypeError("fill() needs token_ids, or tokens= (the count) when only the "
                            "metadata changes")
        checked = []
        for name, value in (("token_ids", token_ids), ("positions", positions),
                            ("seq_slot", seq_slot), ("slots", slots), ("seq_lens", seq_lens),
                            ("block_table", block_table)):
            if value is not None:
                checked.append((name, self._checked(name, value)))
        n = u64_arg(checked[0][1].shape[0] if tokens is None else tokens, "tokens", 0, 0x7FFFFFFF)
        targets = [(self._view(name), a) for name, a in checked if a.size]   # before any write
        for dst, a in targets:
            if a.ndim == 1:
                dst[:a.shape[0]] = a
            else:
                dst[:a.shape[0], :a.shape[1]] = a
        self.tokens = n

    cdef object _checked(self, str name, object value):
        """`value` as a numpy array that region `name` can take exactly."""
        import numpy
        a = numpy.asarray(value)
        dtype, _off, shape = self._regions[name]
        if a.ndim != len(shape):
            raise ValueError(f"{name} must be {len(shape)}-D, got shape {a.shape}")
        for have, most in zip(a.shape, shape):
            if have > most:
                raise ValueError(f"{name} of shape {a.shape} does not fit its region "
                                 f"of shape {shape}")
        if a.size == 0:
            return a                # nothing to write, whatever its type ([] is float64)
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
        if not _fits(a.dtype, dtype) or name in _LENGTHS:
            lo, hi = _INT_RANGES[dtype]
            if name in _LENGTHS:
                lo = 0
            least, most = int(a.min()), int(a.max())
            if least < lo or most > hi:
                raise ValueError(f"{name}: values must lie in [{lo}, {hi}] ({dtype}), got "
                                 f"{least} .. {most}")
        return a

    # -- the upload ----------------------------------------------------------------
    def upload(self, stream=None, *, zero=True):
        """Copy the staging to the device in one copy; then zero for its count.

        Enqueues on `stream`: one host-to-device copy of the whole span,
        the record of `event`, and (with `zero`) ``zero_all_rows`` reading
        the uploaded count on the device, leaving the bytes just uploaded
        in place.  The slab then holds what ``zero_all_rows(tokens=n)``
        followed by writing the staging would give.  All of it can be
        captured in a CUDA graph.  The host backend does the same at the
        call.

        Parameters
        ----------
        stream : int or stream object, optional
            Where the work is enqueued; None or 0 is the default stream
            (which a graph capture does not capture: pass the capturing one).
        zero : bool, keyword-only
            Also enqueue the zeroing (default True).

        Raises
        ------
        MetraleError
            The step inputs or the arena are released, the arena sleeps or
            was resized after these step inputs were made, or the driver
            refused the work.
        """
        cdef uintptr_t s = as_stream(stream)
        cdef bint zeroing = zero
        cdef ArenaState arena = self._arena
        self._enter()
        try:
            arena._enter(None)
            try:
                if reshapes(arena) != self._built_at:
                    raise MetraleError("the arena was resized after these step inputs were made: "
                                       "make new ones with arena.step_inputs()")
                self._gpu.copy_h2d(self._dst, self._host, self.nbytes, s)
                self._gpu.event_record(self._event, s)
                if zeroing:
                    self._gpu.zero_rows_at(&self._rows, s)
            finally:
                mt_life_leave(arena._life)
        finally:
            mt_life_leave(self._life)

    def wait(self):
        """Block until the copy of the last `upload` has run.

        Then the host may write the staging again.

        Raises
        ------
        MetraleError
            The step inputs are released, or the driver reported an error.
        """
        self._enter()
        try:
            self._gpu.event_wait(self._event)
        finally:
            mt_life_leave(self._life)

    # -- lifetime ------------------------------------------------------------------
    def release(self):
        """Free the pinned staging and the event; idempotent.

        Waits for the last upload's copy first.  Refused while a view of
        the staging (or an array made from one) is alive; from then on no
        new view can be made, so a release after those views are gone
        succeeds.

        Raises
        ------
        BufferError
            A view is alive; nothing was freed.
        MetraleError
            Called from inside an operation on these step inputs.
        """
        self._views.clear()
        rc = mt_life_close(self._life)
        if rc == MT_LIFE_RELEASED:
            return None
        if rc == MT_LIFE_FORKED and self._gpu.device_type != 1:
            self._has_event = False             # the parent's CUDA objects: not touched
            self._staging._host = NULL
            return None
        if rc == MT_LIFE_OK:
            try:
                wait_life(self._life, MT_WAIT_ALL)
            except BaseException:       # interrupted: nothing freed
                mt_life_reopen(self._life)
                raise
        elif rc != MT_LIFE_FORKED:
            k = mt_life_exports(self._life, 0)
            raise_life(rc, "these step inputs", "release", f"{k} view{'s' if k != 1 else ''}")
        try:
            if self._has_event:
                self._gpu.event_wait(self._event)
        finally:
            if self._has_event:
                self._gpu.event_destroy(self._event)
                self._has_event = False
            self._host = NULL
            self._staging._free()
        return None

    def is_released(self):
        """Whether `release` has run (bool)."""
        return bool(mt_life_released(self._life))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.release()
        return False

    def __repr__(self):
        state = "released" if mt_life_released(self._life) else f"{self.nbytes} bytes"
        return (f"StepInputs(max_batch_tokens={self.max_batch_tokens}, "
                f"rows={self.layout.rows()}, max_blocks={self.max_blocks}, {state})")


@cython.binding(True)
def step_inputs(ArenaState self, max_blocks=None):
    """Pinned host staging for the inputs this arena's engine uploads every step.

    See `StepInputs`: token ids, the token count and the decode metadata,
    laid out like their device span so that `StepInputs.upload` is one
    copy (plus, by default, the zeroing for the uploaded count).

    Parameters
    ----------
    max_blocks : int, optional
        Columns of the block table: KV blocks per sequence.  None takes
        them from the arena's limits (``max_seq_len // kv_block_size +
        1``, 256 for ``kv_block_size`` 0); an arena whose sizes record no
        limits (made by hand) must be given them.

    Returns
    -------
    StepInputs
        Owns its pinned memory until `StepInputs.release` (or garbage
        collection).

    Raises
    ------
    TypeError
        `max_blocks` is missing where the sizes record no limits, or not an
        int.
    ValueError
        The decode metadata for `max_blocks` does not fit ``scratch``.
    OutOfMemoryError
        The pinned host memory was refused.
    MetraleError
        The arena's buffer set lacks ``token_ids`` or ``scratch`` (the
        message names which), or the arena is released or sleeps.
    """
    cdef ArenaState a = self
    cdef StepInputs st
    ids, scratch = a._index.get("token_ids"), a._index.get("scratch")
    if ids is None or scratch is None:
        missing = " and ".join(n for n, i in (("token_ids", ids), ("scratch", scratch)) if i is None)
        raise MetraleError(f"step_inputs: the arena's buffer set has no {missing}: the step "
                           "inputs upload the token ids into token_ids and the count and decode "
                           "metadata into scratch (add them to the set: docs/buffer-sets.md)")
    if max_blocks is None:
        if a._limits is None:
            raise TypeError("step_inputs: the arena's sizes record no max_seq_len and "
                            "kv_block_size (made by hand): pass max_blocks")
        max_blocks = kv_blocks_per_seq(a._limits[1], a._limits[2])
    cdef uint64_t blocks = u64_arg(max_blocks, "max_blocks")
    a._enter(None)
    try:
        st = StepInputs.__new__(StepInputs, _TOKEN)
        st._build(a, blocks, ids, scratch)
    finally:
        mt_life_leave(a._life)
    return st
