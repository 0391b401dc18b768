# cython: language_level=3, binding=False
"""StepInputs: the host side of what an engine uploads every step
(docs/step-inputs.md).

The slab places the buffers that hold step inputs first, back to back
(src/layout.c; the reference's token_ids, then its scratch, whose front holds
the int32 token count at + 32,752 and the decode metadata at + 32,768), so
they lie in one device span: one pinned host buffer laid out byte for byte
like that span (metrale._sizing._step_plan says where each region lies),
copied by one cuMemcpyHtoDAsync.  BufferArena binds `step_inputs`, which
makes them, from here.
"""

cimport cython
from libc.stdint cimport int32_t, uint64_t, uintptr_t
from libc.string cimport memcpy, memset as c_memset

from metrale._arena._arena_state cimport ArenaState, reshapes, rows_queue
from metrale._arena._view cimport own_shape
from metrale._backends._backend cimport Backend
from metrale._base._common cimport as_stream, u64_arg
from metrale._base._core cimport (
    MT_LIFE_FORKED, MT_LIFE_OK, MT_LIFE_RELEASED, MT_WAIT_ALL, mt_layout, mt_life, mt_rows_args,
    mt_rows_args_init)
from metrale._base._life cimport (
    mt_life_close, mt_life_enter, mt_life_exports, mt_life_forked, mt_life_leave,
    mt_life_released, mt_life_reopen, mt_life_unexport, raise_life, wait_life)
from metrale._base._debug_core cimport MT_GUARD_BYTE
from metrale._backends._staging cimport _export, _Staging, staging_new

from metrale._base.errors import MetraleError
from metrale._sizing._step_plan import fill_arrays, plan_step

# Private constructor key: step inputs come from BufferArena.step_inputs().
cdef object _TOKEN = object()

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
    buffers of its set that hold step inputs (their spec's ``step``),
    which the slab places first, back to back.  In the reference set they
    are ``token_ids`` and ``scratch``, whose front holds the int32 token
    count (at ``+ 32,752``) and the batched-decode metadata (at
    ``+ 32,768``: the `DecodeMetaLayout` of the arena's
    ``max_batch_size``); an engine's own set names its own token ids,
    count, positions and metadata buffers.  Fill it through the named
    numpy views (or `fill`), then `upload` moves the whole span with one
    ``cuMemcpyHtoDAsync`` and, by default, enqueues the zeroing of
    ``zero_all_rows`` for the count just uploaded, read on the device.
    Both can be captured in a CUDA graph: each replay uploads whatever the
    host wrote into the staging since, and zeroes for that count, so one
    graph serves every batch size.

    The copy runs in stream order, after `upload` returns: until it has
    run the host must not write the staging (the copy could carry a mix of
    old and new values).  `wait` (or `event`, to order another stream)
    says when it has.  The views stay valid until `release`, which refuses
    while one is alive.

    Attributes
    ----------
    layout : DecodeMetaLayout or None
        The reference's decode metadata layout (its rows are R); None
        without it.
    max_blocks : int
        Columns of ``block_table`` (KV blocks per sequence); 0 without it.
    max_batch_tokens : int
        Rows of ``token_ids``; 0 without them.
    nbytes : int
        Bytes of the staging, and of each upload's copy.
    """

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("StepInputs is made by BufferArena.step_inputs()")
        self._views = {}
        self._alias = {}

    cdef int _build(self, ArenaState arena, object max_blocks) except -1:
        cdef const mt_layout *L = &arena._layout
        cdef uint64_t lo, hi, i
        cdef int b, k
        cdef _Staging staging
        specs = arena._buffers.specs
        steps = []              # each step input, in slab order
        for k in range(L.n):
            b = L.order[k]
            if specs[b].step:
                steps.append((specs[b], L.offset[b], L.size[b]))
        plan = plan_step(steps, L.max_batch_tokens, lambda name: own_shape(arena, name),
                         arena._decode_meta, arena._limits, max_blocks)
        lo, hi = plan.lo, plan.hi
        # The slab places the step inputs first, back to back (src/layout.c):
        # no other buffer lies in the span one copy writes.
        for b in range(L.n):
            if not specs[b].step and L.size[b] and L.offset[b] < hi and L.offset[b] + L.size[b] > lo:
                raise MetraleError(f"step_inputs: buffer {specs[b].name} lies inside the step "
                                   "inputs' span; the slab does not place them back to back")
        self._arena = arena
        self._gpu = arena._gpu
        self._built_at = reshapes(arena)
        self._dst = arena._base + lo
        self._count_off = plan.count_at - lo
        self.layout, self.max_blocks = plan.layout, plan.max_blocks
        ids = plan.regions.get("token_ids")
        self.max_batch_tokens = ids[2][0] if ids is not None else 0
        start = plan.lo         # a Python int: None stays None below
        self._regions = {name: (t, None if o is None else o - start, sh)
                         for name, (t, o, sh) in plan.regions.items()}
        self._alias = plan.alias
        staging = staging_new(self._gpu)
        self._gpu.host_alloc(hi - lo, <void **>&staging._host)
        staging.nbytes = hi - lo
        self._staging = staging
        self._life = staging._life
        self._host = staging._host
        self.nbytes = hi - lo
        c_memset(self._host, 0, self.nbytes)
        # A debug arena's guard bands lie in the span: the staging carries
        # their pattern, so an upload leaves them intact.
        if L.guard:
            i = lo
            for start, end in plan.live + [(hi, hi)]:       # ascending
                while i < start:
                    self._host[i - lo] = MT_GUARD_BYTE(i)
                    i += 1
                i = max(i, end)
        self._gpu.event_create(&self._event)
        self._has_event = True
        # The zeroing upload() enqueues spares the span: it was just written.
        if mt_rows_args_init(L, lo, hi, &self._rows) < 0:
            raise MetraleError("step_inputs: more zero_all buffers than one launch holds")
        self._rows.base = arena._base
        self._rows.count_at = arena._base + plan.count_at
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
        name = self._alias.get(name, name)
        v = self._views.get(name)
        if v is not None:
            return v
        self._check()
        import numpy
        region = self._regions.get(name)
        if region is None:
            raise AttributeError(f"these step inputs have no region {name!r}; they hold "
                                 + ", ".join(self._regions))
        dtype, off, shape = region
        if off is None:         # an empty buffer: nothing staged
            return numpy.zeros(shape, dtype)
        n = 1
        for d in shape:
            n *= d
        v = numpy.frombuffer(self._staging, dtype=dtype, count=n, offset=off).reshape(shape)
        self._views[name] = v
        return v

    def view(self, name):
        """The staging of one region, as a numpy array over the pinned memory.

        Parameters
        ----------
        name : str
            A region (`names`), or the name of the buffer that holds it.

        Returns
        -------
        numpy.ndarray
            Of the region's element type and shape: the buffer's own shape
            at the arena's limits where its spec has one, else 1-D.

        Raises
        ------
        AttributeError
            No such region.
        MetraleError
            The step inputs are released.
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        return self._view(name)

    @property
    def names(self):
        """The regions of the staging (tuple of str).

        ``token_ids``, ``count`` and ``positions`` by their role; the
        reference's decode metadata as ``seq_slot``, ``slots``,
        ``seq_lens`` and ``block_table``; every other per-step buffer
        (``step="metadata"``) by its own name.
        """
        return tuple(self._regions)

    @property
    def token_ids(self):
        """numpy.ndarray, shape (max_batch_tokens,): the token ids (uint32 in the reference)."""
        return self._view("token_ids")

    @property
    def count(self):
        """numpy.ndarray of int32, shape (1,): the token count (see `tokens`)."""
        return self._view("count")

    @property
    def positions(self):
        """numpy.ndarray: the positions (the reference's: uint32, shape (R,), a row's each)."""
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
             block_table=None, tokens=None, **buffers):
        """Write one step's inputs into the staging, checked against its layout.

        Every array is checked before anything is written: its dimension,
        its shape against its region, and its values against the region's
        element type (no value is wrapped).  Each then goes to the first
        rows of its region (the rows after them keep what they held);
        `tokens` is set too.

        Parameters
        ----------
        token_ids : array_like of int, 1-D, optional
            At most ``max_batch_tokens`` token ids, each one the region's
            type holds (0 .. 2**32 - 1 in the reference).  May be left out
            when `tokens` is given (only the other regions change).
        positions : array_like of int, optional
            The positions (the reference's: at most R values, uint32).
        seq_slot, seq_lens : array_like of int, 1-D, optional
            The reference's: at most R values each, int32 (a length in
            `seq_lens` >= 0).
        slots : array_like of int, 1-D, optional
            The reference's: at most R values, int64.
        block_table : array_like of int, 2-D, optional
            The reference's: at most R rows of at most ``max_blocks``
            columns, int32.
        tokens : int, optional
            The token count; the length of `token_ids` when None.
        **buffers : array_like
            A per-step buffer of the set's own (``step="metadata"``) by its
            name, or a role's region by its buffer's name; the same checks
            (float regions take integers and floats within their range).

        Raises
        ------
        ValueError
            Something that is no rectangular array (ragged rows, an
            ``__array__`` that gives no array), an array of the wrong
            dimension, longer than its region, or with a value its region's
            type cannot hold (each named as given), or `tokens` out of
            range; nothing is written.
        TypeError
            Neither `token_ids` nor `tokens`, a region these step inputs do
            not have, a region given twice (by its role and by its buffer's
            name), or an array that is not of numbers of the region's kind
            (bool included); nothing is written.
        MetraleError
            The step inputs are released.
        """
        given = [("token_ids", token_ids), ("positions", positions), ("seq_slot", seq_slot),
                 ("slots", slots), ("seq_lens", seq_lens), ("block_table", block_table)]
        given.extend(buffers.items())
        checked, n = fill_arrays(self._regions, self._alias, given, tokens)
        targets = [(self._view(name), a) for name, a in checked if a.size]   # before any write
        for dst, a in targets:
            dst[tuple(slice(0, d) for d in a.shape)] = a
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
                    self._gpu.zero_rows_at(&self._rows, rows_queue(arena), s)
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
        if self.layout is None:
            return f"StepInputs({', '.join(self._regions)}; {state})"
        return (f"StepInputs(max_batch_tokens={self.max_batch_tokens}, "
                f"rows={self.layout.rows()}, max_blocks={self.max_blocks}, {state})")


@cython.binding(True)
def step_inputs(ArenaState self, max_blocks=None):
    """Pinned host staging for the inputs this arena's engine uploads every step.

    See `StepInputs`: the buffers of the set that hold step inputs (their
    spec's ``step``: the reference's ``token_ids`` and ``scratch``, or an
    engine's own token ids, count, positions and metadata), laid out like
    their device span so that `StepInputs.upload` is one copy (plus, by
    default, the zeroing for the uploaded count).

    Parameters
    ----------
    max_blocks : int, optional
        With the reference's decode metadata only: columns of the block
        table (KV blocks per sequence).  None takes them from the arena's
        limits (``max_seq_len // kv_block_size + 1``, 256 for
        ``kv_block_size`` 0); an arena whose sizes record no limits (made
        by hand) must be given them.

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
        The decode metadata for `max_blocks` does not fit ``scratch``, or
        `max_blocks` is given where there is no decode metadata.
    OutOfMemoryError
        The pinned host memory was refused.
    MetraleError
        No buffer of the set holds the token count (``step="count"``, or
        the reference's scratch), or it is empty at these limits; or the
        arena is released or sleeps.
    """
    cdef ArenaState a = self
    cdef StepInputs st
    blocks = None if max_blocks is None else u64_arg(max_blocks, "max_blocks")   # user code: first
    a._enter(None)
    try:
        st = StepInputs.__new__(StepInputs, _TOKEN)
        st._build(a, blocks)
    finally:
        mt_life_leave(a._life)
    return st
