# cython: language_level=3, binding=False
"""The slab plan: where every buffer of a BufferSizes sits in one allocation
and which byte ranges each zeroing helper clears.  Pure computation in the C
core (layout.c): nothing is allocated.  The C core's buffer table is made
here, from the buffer set (`table_into`)."""

cimport cython
from libc.stdint cimport uint64_t

from metrale._base._common cimport limit_arg, u64_arg
from metrale._base._core cimport (MT_ERR_OVERFLOW, MT_IN_CHECKSUM, MT_IN_PREFILL, MT_IN_ROWS,
                                  MT_IN_ZERO_ALL, MT_MAX_BUFFERS, MT_MAX_ROWS_ENTRIES, MT_OK,
                                  MT_ROWS_BY_M, MT_ROWS_BY_M16, MT_STEP_IDS, MT_STEP_IN, MT_STEP_META,
                                  mt_commit_needed, mt_layout, mt_layout_plan,
                                  mt_layout_plan_reserved, mt_layout_table, mt_range,
                                  mt_rows_length, mt_zero_rows_ranges)

import warnings

from metrale._sizing.buffers import MAX_BUFFERS, MAX_ZERO_ALL
from metrale._sizing.reference import REFERENCE
from metrale._sizing.sizes import BufferSizes

# Private constructor key: plans come from plan_layout().
cdef object _TOKEN = object()
# The C flags of each row rule (metrale/_sizing/buffers.py ROW_RULES).
# Every row-trimmed buffer says its row count; "auto", deprecated, is trimmed
# as "M|Mp" (a superset of what its old divisibility guess cleared).
cdef dict _ROW_FLAGS = {"whole": 0, "M": MT_IN_ROWS | MT_ROWS_BY_M,
                        "Mp": MT_IN_ROWS | MT_ROWS_BY_M16,
                        "M|Mp": MT_IN_ROWS | MT_ROWS_BY_M | MT_ROWS_BY_M16,
                        "auto": MT_IN_ROWS | MT_ROWS_BY_M | MT_ROWS_BY_M16}

# The sets metrale.buffers checks against the core's fixed tables.
assert MAX_BUFFERS == MT_MAX_BUFFERS and MAX_ZERO_ALL == MT_MAX_ROWS_ENTRIES - 1


cdef tuple c_table(object buffers):
    """(flags, aligns) of a BufferSet for the C core, made once per set."""
    t = buffers._cache.get("c_table")
    if t is None:
        flags = []
        for s in buffers:
            f = _ROW_FLAGS[s.rows]
            if s.zero_all:
                f |= MT_IN_ZERO_ALL
            if s.prefill:
                f |= MT_IN_PREFILL
            if s.checksum:
                f |= MT_IN_CHECKSUM
            if s.step == "token_ids":
                f |= MT_STEP_IDS
            elif s.step == "decode_meta":
                f |= MT_STEP_META
            elif s.step:
                f |= MT_STEP_IN
            flags.append(f)
        t = buffers._cache["c_table"] = (tuple(flags), tuple(s.align for s in buffers))
    return t


cdef int table_into(mt_layout *L, object buffers) except -1:
    cdef unsigned flags[MT_MAX_BUFFERS]
    cdef uint64_t align[MT_MAX_BUFFERS]
    cdef int i, n
    fl, al = c_table(buffers)
    n = len(fl)
    if n > MT_MAX_BUFFERS:          # BufferSet refuses such a set
        raise ValueError(f"a buffer set holds at most {MT_MAX_BUFFERS} buffers")
    for i in range(n):
        flags[i], align[i] = fl[i], al[i]
    if mt_layout_table(L, n, flags, align) != MT_OK:
        raise ValueError("the buffer table has an alignment that is not a power of two >= 256")
    return 0


cdef int plan_into(mt_layout *L, object sizes, object max_batch_tokens, uint64_t guard=0) except -1:
    cdef uint64_t raw[MT_MAX_BUFFERS]
    cdef uint64_t m
    cdef int i
    if not isinstance(sizes, BufferSizes):
        raise TypeError(f"sizes must be a BufferSizes, got {type(sizes).__name__}")
    m = u64_arg(max_batch_tokens, "max_batch_tokens", 1)
    table_into(L, sizes.buffers)
    values = sizes.as_tuple()
    for i in range(L.n):
        raw[i] = values[i]
    if mt_layout_plan(L, raw, m, guard) != MT_OK:
        raise ValueError(f"the slab of these sizes exceeds 2^64 - 1 bytes (max_batch_tokens={m})")
    return 0


@cython.final
cdef class SlabPlan:
    """Where each buffer sits in the arena's one allocation, and the byte
    ranges the zeroing helpers clear.

    Offsets are relative to the slab's base.  Made by `plan_layout` (or
    `plan_reserved`, for a reserved arena), which allocates nothing; an
    arena built from the same sizes and max_batch_tokens places its buffers
    exactly so.
    """

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("use plan_layout(sizes)")

    @property
    def buffers(self):
        """The buffer set the plan places (BufferSet)."""
        return self.buffer_set

    @property
    def sizes(self):
        """The sizes the plan places (BufferSizes): with their limits, shape
        and target, everything the plan was made from."""
        return self._sizes

    @property
    def slab_bytes(self):
        """Bytes of the one allocation, placement padding included, and the
        room to align its base (`base_align`) (int)."""
        return self.L.slab_bytes

    @property
    def base_align(self):
        """The alignment the slab's base needs (int): the largest of its
        buffers' (a reserved plan's: and the granularity).  `slab_bytes`
        holds the room to move an allocation aligned to 256 bytes (a
        reservation to the granularity) up to it."""
        return self.L.base_align

    @property
    def max_batch_tokens(self):
        """The max_batch_tokens the plan was made for (int)."""
        return self.L.max_batch_tokens

    @property
    def reserved(self):
        """Whether this is a reserved arena's plan (`plan_reserved`): then
        `slab_bytes` is the reservation (bool)."""
        return bool(self.L.reserved)

    @property
    def committed_bytes(self):
        """Bytes of memory the arena maps for the plan's sizes (int): the
        slab for a plain plan; for a reserved one each buffer's bytes
        rounded up to the granularity, guard bands included, as a freshly
        built reserved arena maps them."""
        cdef mt_range need[MT_MAX_BUFFERS]
        cdef int n, i
        cdef uint64_t total = 0
        if not self.L.reserved:
            return self.L.slab_bytes
        n = mt_commit_needed(&self.L, self.gran, need)
        for i in range(n):
            total += need[i].length
        return total

    @property
    def offsets(self):
        """Buffer name -> byte offset in the slab, or None for an empty
        (NULL) buffer (dict, every name of the set in its order)."""
        names = self.buffer_set.names
        return {names[i]: (self.L.offset[i] if self.L.size[i] else None)
                for i in range(self.L.n)}

    @property
    def slab_order(self):
        """The buffer names in the order they are placed (tuple of str)."""
        names = self.buffer_set.names
        return tuple(names[self.L.order[i]] for i in range(self.L.n))

    @property
    def zero_all(self):
        """``(offset, length)`` of the one range ``zero_all`` clears: its
        buffers sit back to back at the start of the slab."""
        return (self.L.zero_all.offset, self.L.zero_all.length)

    @property
    def zero_prefill(self):
        """``(offset, length)`` of the one range ``zero_prefill_essentials``
        clears."""
        return (self.L.zero_prefill.offset, self.L.zero_prefill.length)

    @property
    def groups(self):
        """Helper -> the buffers it covers, from the buffer set (dict).

        Keys: ``"zero_all"`` (cleared by ``zero_all``), ``"prefill"``
        (cleared by ``zero_prefill_essentials``), ``"rows"`` (the token-major
        ones ``zero_all_rows`` trims to the live rows) and ``"checksum"``
        (probed by ``debug_buffer_checksum``); values are tuples of names.
        """
        groups = self.buffer_set.groups
        return {g: groups[g] for g in ("zero_all", "prefill", "rows", "checksum")}

    def rows_ranges(self, tokens):
        """The ranges ``zero_all_rows(tokens=tokens)`` clears.

        Token-major buffers are trimmed to their first `tokens` rows, the
        others cleared whole; adjacent ranges are merged.

        Parameters
        ----------
        tokens : int
            Live tokens of the step; at or above max_batch_tokens the one
            `zero_all` range is returned.

        Returns
        -------
        list of (int, int)
            ``(offset, length)`` pairs in slab order, at most one per
            zero_all buffer; empty ranges are left out.

        Raises
        ------
        TypeError
            `tokens` is not an int.
        ValueError
            `tokens` is negative or does not fit 64 bits.
        """
        cdef mt_range r[MT_MAX_BUFFERS]
        cdef int n = mt_zero_rows_ranges(&self.L, u64_arg(tokens, "tokens"), r)
        return [(r[i].offset, r[i].length) for i in range(n)]

    def rows_length(self, name, tokens):
        """Bytes of buffer `name`, from its start, that ``zero_all_rows(tokens=tokens)`` clears.

        The rule of `rows_ranges` for one buffer: the first `tokens` rows of
        a token-major buffer (rounded up to 16 rows for the GEMM-tiled
        ones), the whole of any other.

        Parameters
        ----------
        name : str
            A buffer of the plan's set.
        tokens : int
            Live tokens of the step.

        Returns
        -------
        int

        Raises
        ------
        KeyError
            `name` is not a buffer of the set.
        TypeError, ValueError
            `tokens` is not an int, negative or does not fit 64 bits.
        """
        if name not in self.buffer_set:
            raise KeyError(name)
        return mt_rows_length(&self.L, self.buffer_set.index(name), u64_arg(tokens, "tokens"))

    def __repr__(self):
        return (f"<SlabPlan {self.L.slab_bytes} bytes, max_batch_tokens={self.L.max_batch_tokens}, "
                f"zero_all={self.zero_all}>")


def plan_layout(sizes, max_batch_tokens=None, *, guard_bytes=0):
    """The slab plan of an arena built from `sizes`, without allocating.

    Parameters
    ----------
    sizes : BufferSizes
        The buffer sizes; made by `BufferSizes.from_config`, they carry the
        max_batch_tokens that decides the rows the zeroing helpers trim to.
    max_batch_tokens : int, optional
        Only for sizes built by hand (which carry no limits): the arena's
        max_batch_tokens (>= 1).  Given with sizes that carry their limits
        it is deprecated (write ``plan_layout(sizes)``) and, as before,
        the plan is made for it.
    guard_bytes : int, optional
        A debug arena's guard bytes after every live buffer
        (`DebugOptions.guard_bytes`; 0: no guard bands).

    Returns
    -------
    SlabPlan
        The placement of every buffer and the zeroing ranges; ``.sizes`` is
        `sizes`.

    Raises
    ------
    TypeError
        `sizes` is not a BufferSizes, `max_batch_tokens` not an int, or
        missing for sizes built by hand.
    ValueError
        `max_batch_tokens` is 0, negative or does not fit 64 bits, or the
        slab would exceed 2**64 - 1 bytes.
    """
    cdef SlabPlan plan = SlabPlan.__new__(SlabPlan, _TOKEN)
    if not isinstance(sizes, BufferSizes):
        raise TypeError(f"sizes must be a BufferSizes, got {type(sizes).__name__}")
    lim = sizes.limits
    if max_batch_tokens is None:
        max_batch_tokens = limit_arg(None, "max_batch_tokens", 1, lim, "plan_layout")
    elif lim is not None:           # as before: planned for the max_batch_tokens given
        warnings.warn("plan_layout(sizes, max_batch_tokens) is deprecated: the sizes carry "
                      "their limits; write plan_layout(sizes)", DeprecationWarning,
                      stacklevel=1)        # the caller: this function has no Python frame
    plan_into(&plan.L, sizes, max_batch_tokens, u64_arg(guard_bytes, "guard_bytes"))
    plan.buffer_set = sizes.buffers
    plan._sizes = sizes
    return plan


def plan_reserved(sizes, reserve_sizes, max_batch_tokens, granularity, *, guard_bytes=0):
    """The plan of a reserved arena: each buffer a sub-range sized for
    `reserve_sizes`, of which `sizes` are mapped.

    Parameters
    ----------
    sizes : BufferSizes
        The current sizes (each <= its entry in `reserve_sizes`).
    reserve_sizes : BufferSizes
        Each buffer's largest size: its room in the reservation.
    max_batch_tokens : int
        The arena's max_batch_tokens for `sizes` (>= 1).
    granularity : int
        The backend's allocation granularity: a power of two >= 256 (the
        host's page size; 2 MiB on H100 / H200).
    guard_bytes : int, optional
        A debug arena's guard bytes after every live buffer.

    Returns
    -------
    SlabPlan
        With `slab_bytes` the reservation and `committed_bytes` what the
        arena maps for `sizes`.

    Raises
    ------
    TypeError
        An argument of the wrong type.
    ValueError
        A size above its reserved size, a granularity that is not a power
        of two >= 256, or a reservation over 2**64 - 1 bytes.
    """
    cdef uint64_t cur[MT_MAX_BUFFERS]
    cdef uint64_t top[MT_MAX_BUFFERS]
    cdef SlabPlan plan = SlabPlan.__new__(SlabPlan, _TOKEN)
    cdef int i, rc
    for arg, value in (("sizes", sizes), ("reserve_sizes", reserve_sizes)):
        if not isinstance(value, BufferSizes):
            raise TypeError(f"{arg} must be a BufferSizes, got {type(value).__name__}")
    if reserve_sizes.buffers != sizes.buffers:
        raise ValueError("reserve_sizes are for another buffer set than sizes")
    names, values, tops = sizes.buffers.names, sizes.as_tuple(), reserve_sizes.as_tuple()
    for i in range(len(values)):
        if values[i] > tops[i]:
            raise ValueError(f"{names[i]}: {values[i]} bytes exceed its reserved "
                             f"{tops[i]} bytes")
        cur[i], top[i] = values[i], tops[i]
    table_into(&plan.L, sizes.buffers)
    plan.buffer_set = sizes.buffers
    plan._sizes = sizes
    plan.gran = u64_arg(granularity, "granularity", 1)
    rc = mt_layout_plan_reserved(&plan.L, cur, top, u64_arg(max_batch_tokens, "max_batch_tokens", 1),
                                 plan.gran, u64_arg(guard_bytes, "guard_bytes"))
    if rc == MT_ERR_OVERFLOW:
        raise ValueError("the reservation of these sizes exceeds 2^64 - 1 bytes")
    if rc != MT_OK:
        raise ValueError(f"granularity must be a power of two >= 256, got {plan.gran}")
    return plan


def zero_rows_ranges(sizes, max_batch_tokens, tokens):
    """The ranges ``zero_all_rows(tokens=tokens)`` clears in an arena of `sizes`.

    The same as ``plan_layout(sizes).rows_ranges(tokens)`` for sizes that
    carry these limits.

    Parameters
    ----------
    sizes : BufferSizes
        The buffer sizes.
    max_batch_tokens : int
        The arena's max_batch_tokens (>= 1).
    tokens : int
        Live tokens of the step (>= 0).

    Returns
    -------
    list of (int, int)
        ``(offset, length)`` pairs relative to the slab, in slab order.

    Raises
    ------
    TypeError
        An argument of the wrong type.
    ValueError
        An integer out of range, or a slab over 2**64 - 1 bytes.
    """
    cdef SlabPlan plan = SlabPlan.__new__(SlabPlan, _TOKEN)
    plan_into(&plan.L, sizes, max_batch_tokens)
    plan.buffer_set = sizes.buffers
    plan._sizes = sizes
    return plan.rows_ranges(tokens)


def buffer_table(buffers=None):
    """The C core's buffer table of a buffer set, as the arena gives it.

    For the tests that check it against the specs.

    Parameters
    ----------
    buffers : BufferSet, optional
        None means `REFERENCE`.

    Returns
    -------
    tuple of (str, int, int)
        ``(name, flags, alignment)`` of every buffer in the set's order; the
        flags are the bits of `FLAG_BITS`.
    """
    if buffers is None:
        buffers = REFERENCE
    flags, align = c_table(buffers)
    return tuple(zip(buffers.names, flags, align))


# The bits of the C table's flags, by name (arena_core.h).
FLAG_BITS = {"zero_all": MT_IN_ZERO_ALL, "rows": MT_IN_ROWS, "prefill": MT_IN_PREFILL,
             "checksum": MT_IN_CHECKSUM, "rows_by_m": MT_ROWS_BY_M,
             "rows_by_m16": MT_ROWS_BY_M16, "step_ids": MT_STEP_IDS, "step_in": MT_STEP_IN,
             "step_meta": MT_STEP_META}
