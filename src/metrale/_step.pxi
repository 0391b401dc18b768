# StepInputs: the host side of what an engine uploads every step.  Included
# by _arena.pyx (it reads the arena's layout, lifetime and backend directly).
#
# The slab places token_ids first and scratch right after it (src/layout.c),
# so token_ids, the int32 token count at scratch + 32,752 and the decode
# metadata at scratch + 32,768 lie in one device span: one pinned host buffer
# laid out byte for byte like that span, copied by one cuMemcpyHtoDAsync.

from libc.stdint cimport int32_t
from libc.string cimport memcpy, memset as c_memset

from metrale._debug_core cimport MT_GUARD_BYTE

from metrale.sizes import _DECODE_META_OFFSET, _STEP_COUNT_OFFSET, kv_blocks_per_seq

# decode metadata region -> (numpy dtype name, its offset method of DecodeMetaLayout)
_META_REGIONS = (
    ("positions", "uint32", "positions_offset"),
    ("seq_slot", "int32", "seq_slot_offset"),
    ("slots", "int64", "slots_offset"),
    ("seq_lens", "int32", "seq_lens_offset"),
)


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

    cdef BufferArena _arena
    cdef Backend _gpu
    cdef mt_life *_life
    cdef unsigned char *_host
    cdef readonly uint64_t nbytes
    cdef uintptr_t _dst, _event
    cdef uint64_t _count_off, _gen
    cdef bint _has_event
    cdef mt_rows_args _rows
    cdef dict _regions, _views
    cdef readonly object layout
    cdef readonly uint64_t max_blocks, max_batch_tokens

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("StepInputs is made by BufferArena.step_inputs()")
        self._life = mt_life_new()
        if self._life == NULL:
            raise MemoryError()
        self._views = {}

    cdef int _build(self, BufferArena arena, uint64_t max_blocks) except -1:
        cdef uint64_t tok = arena._L.offset[MT_TOKEN_IDS], scr = arena._L.offset[MT_SCRATCH]
        cdef uint64_t meta, span, i
        layout = arena._decode_meta
        meta = layout.meta_bytes(max_blocks)
        if _DECODE_META_OFFSET + meta > arena._L.size[MT_SCRATCH]:
            raise ValueError(f"max_blocks={max_blocks}: the decode metadata ({meta} bytes at "
                             f"scratch + {_DECODE_META_OFFSET}) does not fit scratch "
                             f"({arena._L.size[MT_SCRATCH]} bytes)")
        if arena._L.size[MT_TOKEN_IDS] == 0 or scr < tok:
            raise MetraleError("this arena's slab does not place scratch after token_ids")
        span = scr - tok + _DECODE_META_OFFSET + meta
        self._arena = arena
        self._gpu = arena._gpu
        self.layout = layout
        self.max_blocks = max_blocks
        # token_ids' rows: max_batch_tokens, unless from_sizes gave it fewer bytes
        self.max_batch_tokens = min(arena._L.size[MT_TOKEN_IDS] // 4, arena._L.max_batch_tokens)
        self._gen = arena._gen
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
        self._gpu.host_alloc(span, <void **>&self._host)
        self.nbytes = span
        c_memset(self._host, 0, span)
        # A debug arena's guard band after token_ids lies in the span: the
        # staging carries its pattern, so an upload leaves it intact.
        if arena._L.guard:
            for i in range(arena._L.size[MT_TOKEN_IDS], scr - tok):
                self._host[i] = MT_GUARD_BYTE(tok + i)
        self._gpu.event_create(&self._event)
        self._has_event = True
        # The zeroing upload() enqueues spares the span: it was just written.
        mt_rows_args_init(&arena._L, tok, tok + span, &self._rows)
        self._rows.base = arena._base
        self._rows.count_at = self._dst + self._count_off
        return 0

    def __dealloc__(self):
        if self._has_event:
            self._gpu.event_destroy(self._event)
        if self._host != NULL:
            self._gpu.host_free(self._host)
        if self._life != NULL:
            mt_life_free(self._life)

    # -- the buffer the views are made from ------------------------------------------
    def __getbuffer__(self, Py_buffer *view, int flags):
        if mt_life_export(self._life, 0) != MT_LIFE_OK:
            raise MetraleError("these step inputs have been released")
        view.buf = self._host
        view.obj = self
        view.len = self.nbytes
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

    def __releasebuffer__(self, Py_buffer *view):
        mt_life_unexport(self._life, 0)

    cdef object _view(self, str name):
        v = self._views.get(name)
        if v is not None:
            return v
        if mt_life_released(self._life):
            raise MetraleError("these step inputs have been released")
        import numpy
        dtype, off, shape = self._regions[name]
        n = 1
        for d in shape:
            n *= d
        v = numpy.frombuffer(self, dtype=dtype, count=n, offset=off).reshape(shape)
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
        if mt_life_enter(self._life) != MT_LIFE_OK:
            raise MetraleError("these step inputs have been released")
        memcpy(&v, self._host + self._count_off, 4)
        mt_life_leave(self._life)
        return v

    @tokens.setter
    def tokens(self, value):
        cdef int32_t v = <int32_t>u64_arg(value, "tokens", 0, 0x7FFFFFFF)
        if mt_life_enter(self._life) != MT_LIFE_OK:
            raise MetraleError("these step inputs have been released")
        memcpy(self._host + self._count_off, &v, 4)
        mt_life_leave(self._life)

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
    def fill(self, token_ids, positions=None, seq_slot=None, slots=None, seq_lens=None,
             block_table=None, tokens=None):
        """Write one step's inputs into the staging, checked against its layout.

        Each array goes to the first rows of its region (the rows after
        them keep what they held); `tokens` is set too.

        Parameters
        ----------
        token_ids : array_like of int, 1-D
            At most ``max_batch_tokens`` token ids.
        positions, seq_slot, slots, seq_lens : array_like of int, 1-D, optional
            At most R values each.
        block_table : array_like of int, 2-D, optional
            At most R rows of at most ``max_blocks`` columns.
        tokens : int, optional
            The token count; the length of `token_ids` when None.

        Raises
        ------
        ValueError
            An array of the wrong dimension or longer than its region (named),
            or `tokens` out of range.
        TypeError
            An array that is not of integers.
        MetraleError
            The step inputs are released.
        """
        import numpy
        checked = []
        for name, value in (("token_ids", token_ids), ("positions", positions),
                            ("seq_slot", seq_slot), ("slots", slots), ("seq_lens", seq_lens),
                            ("block_table", block_table)):
            if value is None:
                continue
            a = numpy.asarray(value)
            if a.dtype.kind not in "iub":
                raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
            shape = self._regions[name][2]
            if a.ndim != len(shape):
                raise ValueError(f"{name} must be {len(shape)}-D, got shape {a.shape}")
            for have, most in zip(a.shape, shape):
                if have > most:
                    raise ValueError(f"{name} of shape {a.shape} does not fit its region "
                                     f"of shape {shape}")
            checked.append((name, a))
        n = len(checked[0][1]) if tokens is None else tokens
        u64_arg(n, "tokens", 0, 0x7FFFFFFF)
        for name, a in checked:
            dst = self._view(name)
            if a.ndim == 1:
                dst[:a.shape[0]] = a
            else:
                dst[:a.shape[0], :a.shape[1]] = a
        self.tokens = n

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
        cdef BufferArena arena = self._arena
        if mt_life_enter(self._life) != MT_LIFE_OK:
            raise MetraleError("these step inputs have been released")
        try:
            arena._enter(None)
            try:
                if arena._gen != self._gen:
                    raise MetraleError("the arena was resized after these step inputs were made: "
                                       "make new ones with arena.step_inputs()")
                self._gpu.copy_h2d(self._dst, self._host, self.nbytes, s)
                self._gpu.event_record(self._event, s)
                if zero:
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
        if mt_life_enter(self._life) != MT_LIFE_OK:
            raise MetraleError("these step inputs have been released")
        try:
            self._gpu.event_wait(self._event)
        finally:
            mt_life_leave(self._life)

    # -- lifetime ------------------------------------------------------------------
    def release(self):
        """Free the pinned staging and the event; idempotent.

        Waits for the last upload's copy first.  Refused while a view of
        the staging (or an array made from one) is alive.

        Raises
        ------
        BufferError
            A view is alive; nothing was freed.
        """
        self._views.clear()
        rc = mt_life_close(self._life)
        if rc == MT_LIFE_RELEASED:
            return None
        if rc == MT_LIFE_EXPORTED:
            raise BufferError("release: views of these step inputs are alive "
                              f"({mt_life_exports(self._life, 0)}); drop them and every "
                              "array made from them")
        if rc != MT_LIFE_OK:
            raise MetraleError("release: called from inside an operation; nothing was freed")
        with nogil:
            mt_life_drain(self._life)
        try:
            if self._has_event:
                self._gpu.event_wait(self._event)
        finally:
            if self._has_event:
                self._gpu.event_destroy(self._event)
                self._has_event = False
            if self._host != NULL:
                self._gpu.host_free(self._host)
                self._host = NULL
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
