# cython: language_level=3, binding=False
"""Debug operations of a BufferArena (docs/debug.md): guard bands, poisoned
padding rows, NaN scans and fingerprints over its slab (the reference's float
checksum of the probed buffers is _checksum.pyx's).

Each operation gathers its byte ranges (items) from the layout in the C core
(debug.c: the guard bands; layout.c: the zero_all_rows row rule) and runs
them through the backend in one call: one kernel launch on CUDA
(kernels/debug_ops.cu), one C pass on the host (debug.c).  The element type
of each buffer comes from its spec in the arena's buffer set.
BufferArena binds its debug methods from here.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memcpy, memset

from metrale._arena._arena_state cimport ArenaState
from metrale._backends._backend cimport Backend
from metrale._base._common cimport as_stream, buffer_ids, u64_arg
from metrale._base._core cimport (
    MT_IN_ROWS, MT_IN_ZERO_ALL, MT_MAX_BUFFERS, mt_layout, mt_range, mt_rows_length, mt_rows_stride)
from metrale._base._life cimport mt_life_leave
from metrale._base._debug_core cimport (
    MT_DBG_CHECK, MT_DBG_FILL, MT_DBG_FINGERPRINT, MT_DBG_NONFINITE, MT_EL_BF16, MT_EL_F32,
    MT_EL_FP8_E4M3, MT_EL_I8, MT_EL_I32, MT_EL_I64, MT_EL_NONE, MT_EL_U32, MT_GUARD_BYTE,
    MT_DBG_MAX_ITEMS, mt_debug_args, mt_debug_result, mt_fp_final, mt_guard_ranges,
    mt_poison_pattern)

from metrale._sizing.debug import GuardDamage, NonFinite, NonFiniteScan
from metrale._base.errors import MetraleError

# The specs' dtype names -> the kernels' element codes (the others are untyped here).
_CODES = {"bfloat16": MT_EL_BF16, "float32": MT_EL_F32, "float8_e4m3fn": MT_EL_FP8_E4M3,
          "int8": MT_EL_I8, "int32": MT_EL_I32, "uint32": MT_EL_U32, "int64": MT_EL_I64}
# Element codes that find_nonfinite scans.
_FLOATS = frozenset((MT_EL_BF16, MT_EL_F32, MT_EL_FP8_E4M3))
# The float types it does not decode (metrale._base._dtypes names).
_OTHER_FLOATS = frozenset(("float16", "float64", "float8_e5m2", "complex64", "complex128"))


cdef tuple _elem_codes(object buffers):
    """The element code of every buffer of a set, by id (MT_EL_NONE where
    untyped), from its specs; made once per set."""
    codes = buffers._cache.get("elem_codes")
    if codes is None:
        codes = buffers._cache["elem_codes"] = tuple(_CODES.get(s.dtype, MT_EL_NONE)
                                                     for s in buffers)
    return codes


cdef tuple _scan_kinds(object buffers):
    """Per buffer of a set, by id: None where find_nonfinite can decode its
    element type, else the skip reason (metrale._sizing.debug SKIP_REASONS);
    made once per set."""
    kinds = buffers._cache.get("scan_kinds")
    if kinds is None:
        kinds = buffers._cache["scan_kinds"] = tuple(
            None if _CODES.get(s.dtype, MT_EL_NONE) in _FLOATS else
            "untyped" if s.dtype is None else
            "unsupported" if s.dtype in _OTHER_FLOATS else "not float" for s in buffers)
    return kinds


# The items of one operation, one per buffer at most: run in launches of
# MT_DBG_MAX_ITEMS (the kernels' parameter block) by _run.
cdef struct Items:
    int count
    uint64_t offset[MT_MAX_BUFFERS]
    uint64_t length[MT_MAX_BUFFERS]
    unsigned char pattern[MT_MAX_BUFFERS][16]
    unsigned char elem[MT_MAX_BUFFERS]


cdef inline int _add(Items *it, uint64_t offset, uint64_t length) except -1:
    if it.count >= MT_MAX_BUFFERS:      # one item per buffer: a layout has no more
        raise ValueError(f"a debug operation takes at most {MT_MAX_BUFFERS} items")
    it.offset[it.count] = offset
    it.length[it.count] = length
    it.count += 1
    return 0


cdef int _run(Backend be, int op, uintptr_t base, Items *it, mt_debug_result *out,
              uintptr_t stream) except -1:
    """Run `op` over the items, MT_DBG_MAX_ITEMS per launch; out[i] is item i's result."""
    cdef mt_debug_args a
    cdef int first, k, n
    for first in range(0, it.count, MT_DBG_MAX_ITEMS):
        n = min(it.count - first, MT_DBG_MAX_ITEMS)
        memset(&a, 0, sizeof(mt_debug_args))
        a.base = base
        a.count = n
        for k in range(n):
            a.offset[k] = it.offset[first + k]
            a.length[k] = it.length[first + k]
            a.elem[k] = it.elem[first + k]
            memcpy(a.pattern[k], it.pattern[first + k], 16)
        be.debug_run(op, &a, out + first, stream)
    return 0


cdef int _guards(const mt_layout *L, Items *it, int *ids) except -1:
    cdef mt_range r[MT_MAX_BUFFERS]
    cdef int n = mt_guard_ranges(L, ids, r), i, k
    for i in range(n):
        for k in range(16):
            it.pattern[it.count][k] = MT_GUARD_BYTE(k)
        _add(it, r[i].offset, r[i].length)
    return n


cdef int fill_guards(Backend be, const mt_layout *L, uintptr_t base, uintptr_t stream) except -1:
    """Write the guard pattern over every guard band (enqueued on `stream`)."""
    cdef Items it
    cdef mt_debug_result out[MT_MAX_BUFFERS]
    cdef int ids[MT_MAX_BUFFERS]
    it.count = 0
    if _guards(L, &it, ids):
        _run(be, MT_DBG_FILL, base, &it, out, stream)
    return 0


cdef int fill_spans(Backend be, uintptr_t base, list spans, uintptr_t stream) except -1:
    cdef Items it
    cdef mt_debug_result out[MT_MAX_BUFFERS]
    cdef const unsigned char *p
    cdef int first, k
    for first in range(0, len(spans), MT_MAX_BUFFERS):
        it.count = 0
        for offset, n, pattern in spans[first:first + MT_MAX_BUFFERS]:
            if len(<bytes?>pattern) != 16:
                raise ValueError("a fill pattern is 16 bytes")
            p = <bytes>pattern
            for k in range(16):
                it.pattern[it.count][k] = p[k]
            _add(&it, offset, n)
        _run(be, MT_DBG_FILL, base, &it, out, stream)
    return 0


cdef list _check_guards(ArenaState arena, uintptr_t stream):
    """The damaged guard bands, in slab order, as GuardDamage values."""
    cdef Items it
    cdef mt_debug_result out[MT_MAX_BUFFERS]
    cdef int ids[MT_MAX_BUFFERS]
    cdef int n, i
    it.count = 0
    n = _guards(&arena._layout, &it, ids)
    if n == 0:
        return []
    _run(arena._gpu, MT_DBG_CHECK, arena._base, &it, out, stream)
    names = arena._buffers.names
    return [GuardDamage(names[ids[i]], ~out[i].first_inv, out[i].count, it.length[i])
            for i in range(n) if out[i].count]


cdef int _poison_rows(ArenaState arena, uint64_t tokens, uintptr_t stream) except -1:
    """Fill the rows past `tokens` of every row-trimmed buffer with the
    poison of its element type (enqueued on `stream`)."""
    cdef Items it
    cdef mt_debug_result out[MT_MAX_BUFFERS]
    cdef const mt_layout *L = &arena._layout
    cdef uint64_t live, n
    cdef int b, i
    elems = _elem_codes(arena._buffers)
    it.count = 0
    for i in range(L.n):
        b = L.order[i]
        n = L.size[b]
        if not L.flags[b] & MT_IN_ROWS or n == 0:
            continue
        live = mt_rows_length(L, b, tokens)
        if live < n and mt_poison_pattern(elems[b], it.pattern[it.count]):
            _add(&it, L.offset[b] + live, n - live)
    if it.count:
        _run(arena._gpu, MT_DBG_FILL, arena._base, &it, out, stream)
    return 0


cdef object _row_of(const mt_layout *L, int b, uint64_t offset):
    """The token row holding byte `offset` of buffer b (by zero_all_rows' row
    bytes), or None for a buffer not made of rows."""
    cdef uint64_t row = mt_rows_stride(L, b)
    return offset // row if row else None


cdef object _find_nonfinite(ArenaState arena, uint64_t tokens, uintptr_t stream, list asked):
    """A NonFiniteScan of the float buffers zero_all_rows(tokens) clears (`asked`
    None; the row-trimmed over their live rows, the others whole) or of the
    buffers `asked` (ids), in the set's order."""
    cdef Items it
    cdef mt_debug_result out[MT_MAX_BUFFERS]
    cdef int ids[MT_MAX_BUFFERS]
    cdef bint want[MT_MAX_BUFFERS]
    cdef const mt_layout *L = &arena._layout
    cdef uint64_t live
    cdef int b, i
    elems = _elem_codes(arena._buffers)
    kinds = _scan_kinds(arena._buffers)
    names = arena._buffers.names
    for b in range(L.n):
        want[b] = asked is None
    if asked is not None:
        for b in asked:
            want[b] = True
    scanned, skipped = {}, {}
    it.count = 0
    for b in range(L.n):
        if not want[b]:
            continue
        why = "empty" if L.size[b] == 0 else kinds[b]
        if why is None and asked is None and not L.flags[b] & MT_IN_ZERO_ALL:
            why = "not cleared"     # stale bytes: scanned only when named
        if why is not None:
            skipped[names[b]] = why
            continue
        live = mt_rows_length(L, b, tokens)     # the size for any buffer not trimmed by rows
        scanned[names[b]] = live
        if live:
            ids[it.count] = b
            it.elem[it.count] = elems[b]
            _add(&it, L.offset[b], live)
    found = []
    if it.count:
        _run(arena._gpu, MT_DBG_NONFINITE, arena._base, &it, out, stream)
    for i in range(it.count):
        if out[i].count or out[i].extra:
            first = ~out[i].first_inv
            found.append(NonFinite(names[ids[i]], out[i].count, out[i].extra, first,
                                   _row_of(L, ids[i], first)))
    return NonFiniteScan(found, scanned, skipped)


cdef dict _fingerprint(ArenaState arena, list ids, uintptr_t stream):
    """name -> 64-bit fingerprint of each buffer of `ids` (in that order)."""
    cdef Items it
    cdef mt_debug_result out[MT_MAX_BUFFERS]
    cdef int slot[MT_MAX_BUFFERS]
    cdef const mt_layout *L = &arena._layout
    cdef int b, i
    if len(ids) > L.n:
        raise ValueError(f"fingerprint: at most {L.n} buffers, got {len(ids)}")
    it.count = 0
    for i in range(len(ids)):
        b = ids[i]
        if not 0 <= b < L.n:
            raise ValueError(f"fingerprint: no buffer has id {b}")
        slot[i] = -1
        if L.size[b]:
            slot[i] = it.count
            _add(&it, L.offset[b], L.size[b])
    if it.count:
        _run(arena._gpu, MT_DBG_FINGERPRINT, arena._base, &it, out, stream)
    names = arena._buffers.names
    result = {}
    for i in range(len(ids)):
        b = ids[i]
        result[names[b]] = mt_fp_final(out[slot[i]].count if slot[i] >= 0 else 0, L.size[b])
    return result


# -- the arena's debug methods (BufferArena binds them) ------------------------------------

cdef int refill_guards(ArenaState a, list ids=None) except -1:
    cdef mt_layout only
    cdef int i
    if a._layout.guard and a._base:
        if ids is None:
            fill_guards(a._gpu, &a._layout, a._base, 0)
        else:                   # the others' bands may have no memory (a class asleep)
            only = a._layout
            for i in range(only.n):
                if i not in ids:
                    only.size[i] = 0
            fill_guards(a._gpu, &only, a._base, 0)
        a._gpu.sync(0)
    return 0


@cython.binding(True)
def check_guards(ArenaState self, stream=None):
    """The guard bands that no longer hold their pattern.

    A debug arena has a guard band after every live buffer: from the
    buffer's end to the next 256-byte boundary, plus the guard bytes of
    its `DebugOptions`, filled with a known pattern when built and after
    `resize` and `wake`; no zeroing helper touches it.  This scans every
    band in one operation (one kernel launch, a small result copy and a
    synchronization of `stream` on CUDA; one C pass on the host).  Call
    it after the kernels you suspect, on their stream.

    Parameters
    ----------
    stream : int or stream object, optional
        Where the scan runs (after the work already enqueued there);
        None or 0 is the default stream.

    Returns
    -------
    list of GuardDamage
        One per damaged band, in slab order: the buffer it follows, the
        first damaged byte counted from that buffer's end, and how many
        bytes differ.  Empty when every band is intact.

    Raises
    ------
    MetraleError
        The arena is not a debug arena, is released or sleeps, or the
        driver failed.
    TypeError, ValueError
        `stream` is not a stream.
    """
    cdef ArenaState a = self
    if a._debug is None:
        raise MetraleError("check_guards: this arena has no guard bands (build it with debug=True)")
    cdef uintptr_t s = as_stream(stream)
    a._enter(None)
    try:
        return _check_guards(a, s)
    finally:
        mt_life_leave(a._life)


@cython.binding(True)
def verify_guards(ArenaState self, stream=None):
    """`check_guards`, raising when a guard band is damaged.

    Parameters
    ----------
    stream : int or stream object, optional
        Where the scan runs; None or 0 is the default stream.

    Raises
    ------
    MetraleError
        A band is damaged (the message names every buffer whose band is,
        with the first damaged offset and the byte count), or as
        `check_guards`.
    TypeError, ValueError
        `stream` is not a stream.
    """
    cdef ArenaState a = self
    damage = check_guards(a, stream)
    if damage:
        raise MetraleError(f"{len(damage)} guard band(s) overwritten: "
                           + "; ".join(str(d) for d in damage))
    return None


@cython.binding(True)
def poison_rows(ArenaState self, stream=None, tokens=None):
    """Fill the rows past `tokens` of the row-trimmed buffers with NaN.

    For each buffer `zero_all_rows` trims (its set's ``groups["rows"]``), the bytes
    past the live rows, exactly those `zero_all_rows(tokens=tokens)`
    leaves alone, get a pattern that is NaN in the buffer's element type
    (``0x7FD1`` per BF16 element, ``0x7FD17FD1`` per FP32 element; an
    invalid index in an integer buffer).  A kernel that reads a padding
    row then carries NaN into live rows, where `find_nonfinite` sees it.
    One operation enqueued on `stream` (one kernel launch on CUDA, which
    a CUDA graph can capture); nothing waits.  Debug mode is not needed.

    Parameters
    ----------
    stream : int or stream object, optional
        Where the work is enqueued; None or 0 is the default stream.
    tokens : int
        Live rows of the step (required); ``tokens >= max_batch_tokens``
        poisons nothing.

    Raises
    ------
    TypeError
        `tokens` is missing or not an int, or `stream` is not a stream.
    ValueError
        `tokens` is negative or does not fit 64 bits.
    MetraleError
        The arena is released or sleeps, or the driver failed.
    """
    cdef ArenaState a = self
    if tokens is None:
        raise TypeError("poison_rows() missing its tokens argument (the live rows)")
    cdef uint64_t t = u64_arg(tokens, "tokens")
    cdef uintptr_t s = as_stream(stream)
    a._enter(None)
    try:
        _poison_rows(a, t, s)
    finally:
        mt_life_leave(a._life)


@cython.binding(True)
def find_nonfinite(ArenaState self, stream=None, tokens=None, names=None):
    """NaN and Inf elements in the bytes `zero_all_rows(tokens)` clears.

    Decodes, as its element type (BF16, FP32 or FP8 E4M3), every float
    buffer that `zero_all_rows(tokens=tokens)` clears, exactly those bytes:
    the live rows of each row-trimmed buffer (``groups["rows"]``) and the
    whole of each buffer cleared whole (the other ``groups["zero_all"]``
    ones: ``logits``, ``splitk_workspace``, an own set's sampler buffer).
    One operation: one kernel launch (more past 64 buffers), a small
    result copy and a synchronization of `stream` on CUDA; one C pass on
    the host.  Debug mode is not needed.  The result says which buffers
    were scanned and why each other one was skipped.

    Parameters
    ----------
    stream : int or stream object, optional
        Where the scan runs; None or 0 is the default stream.
    tokens : int
        Live rows of the step (required); ``tokens >= max_batch_tokens``
        scans the row-trimmed buffers whole.
    names : str or iterable of str, optional
        Scan exactly these buffers instead (a row-trimmed one over its
        live rows, any other float buffer whole, cleared by a helper or
        not); None (the default): every float buffer `zero_all_rows`
        clears.

    Returns
    -------
    NonFiniteScan
        A list of `NonFinite`, one per buffer holding a NaN or Inf, in
        the set's order: the counts and where the first one is (byte
        offset, and the token row in a row-trimmed buffer).  Empty on a
        clean step.  Its ``scanned`` maps each buffer scanned to the bytes
        read; its ``skipped`` each other buffer asked for (every buffer of
        the set when `names` is None) to why: ``"empty"``, ``"untyped"``,
        ``"not float"``, ``"unsupported"`` (float16, float64 ...) or
        ``"not cleared"`` (in no zeroing helper, so possibly stale: name
        it to scan it).

    Raises
    ------
    TypeError
        `tokens` is missing or not an int, `names` holds something other
        than a str, or `stream` is not a stream.
    ValueError
        `tokens` is negative or does not fit 64 bits, or `names` holds an
        unknown buffer name.
    MetraleError
        The arena is released or sleeps, or the driver failed.
    """
    cdef ArenaState a = self
    if tokens is None:
        raise TypeError("find_nonfinite() missing its tokens argument (the live rows)")
    cdef uint64_t t = u64_arg(tokens, "tokens")
    cdef uintptr_t s = as_stream(stream)
    ids = None if names is None else buffer_ids(names, "names", a._buffers)
    a._enter(None)
    try:
        return _find_nonfinite(a, t, s, ids)
    finally:
        mt_life_leave(a._life)


@cython.binding(True)
def fingerprint(ArenaState self, stream=None, names=None):
    """A 64-bit hash of each buffer's bytes, computed where they live.

    One operation over all the buffers asked for: one kernel launch, a
    small result copy and a synchronization of `stream` on CUDA; one C
    pass on the host, which gives the same values for the same bytes.
    So two runs, two ranks, or a graph replay and an eager step can be
    compared without copying the buffers.  The hash (docs/debug.md) sums
    a bijective mix of each 8-byte word with its index, then mixes the
    sum with the byte count: any one changed word changes it.  It is no
    checksum of the reference's kind (`debug_buffer_checksum`).

    Parameters
    ----------
    stream : int or stream object, optional
        Where the work runs; None or 0 is the default stream.
    names : str or iterable of str, optional
        The buffers (an empty one hashes as 0 bytes); None (the default):
        every buffer with a non-zero size.

    Returns
    -------
    dict of str to int
        Buffer name -> fingerprint (0 .. 2**64 - 1), in the order asked
        (canonical order for None).

    Raises
    ------
    TypeError
        `names` holds something other than a str, or `stream` is not a
        stream.
    ValueError
        `names` holds an unknown buffer name.
    MetraleError
        The arena is released or sleeps, or the driver failed.
    """
    cdef ArenaState a = self
    cdef int i
    cdef uintptr_t s = as_stream(stream)
    ids = None if names is None else buffer_ids(names, "names", a._buffers)
    a._enter(None)
    try:
        if ids is None:
            ids = [i for i in range(a._layout.n) if a._layout.size[i]]
        return _fingerprint(a, ids, s)
    finally:
        mt_life_leave(a._life)
