# cython: language_level=3, boundscheck=False, wraparound=False, binding=False
"""The slab plan: where every buffer of a BufferSizes sits in one allocation
and which byte ranges each zeroing helper clears.  Pure computation in the C
core (layout.c): nothing is allocated."""

cimport cython
from libc.stdint cimport uint64_t

from metrale._common cimport u64_arg
from metrale._core cimport (MT_N_ZERO_ALL, MT_NBUF, MT_OK, mt_buffer_flags, mt_buffer_names,
                            mt_layout, mt_layout_plan, mt_range, mt_zero_rows_ranges)

from metrale._buffers import BUFFER_NAMES, GROUPS
from metrale.sizes import BufferSizes

# Private constructor key: plans come from plan_layout().
cdef object _TOKEN = object()


cdef int plan_into(mt_layout *L, object sizes, object max_batch_tokens) except -1:
    cdef uint64_t raw[MT_NBUF]
    cdef uint64_t m
    cdef int i
    if not isinstance(sizes, BufferSizes):
        raise TypeError(f"sizes must be a BufferSizes, got {type(sizes).__name__}")
    m = u64_arg(max_batch_tokens, "max_batch_tokens", 1)
    values = sizes.as_tuple()
    for i in range(MT_NBUF):
        raw[i] = values[i]
    if mt_layout_plan(L, raw, m) != MT_OK:
        raise ValueError(f"the slab of these sizes exceeds 2^64 - 1 bytes (max_batch_tokens={m})")
    return 0


@cython.final
cdef class SlabPlan:
    """Where each buffer sits in the arena's one allocation (offsets relative
    to its base), and the ranges the zeroing helpers clear."""

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("use plan_layout(sizes, max_batch_tokens)")

    @property
    def slab_bytes(self):
        """Bytes of the one allocation, placement padding included."""
        return self.L.slab_bytes

    @property
    def max_batch_tokens(self):
        return self.L.max_batch_tokens

    @property
    def offsets(self):
        """Buffer name -> offset in the slab, or None for an empty (NULL) buffer."""
        return {BUFFER_NAMES[i]: (self.L.offset[i] if self.L.size[i] else None)
                for i in range(MT_NBUF)}

    @property
    def slab_order(self):
        """The buffer names in the order they are placed."""
        return tuple(BUFFER_NAMES[self.L.order[i]] for i in range(MT_NBUF))

    @property
    def zero_all(self):
        """(offset, length) of the one range zero_all clears."""
        return (self.L.zero_all.offset, self.L.zero_all.length)

    @property
    def zero_prefill(self):
        """(offset, length) of the one range zero_prefill_essentials clears."""
        return (self.L.zero_prefill.offset, self.L.zero_prefill.length)

    @property
    def groups(self):
        """Helper -> the buffers it covers (ARENA.md §5, §7), from the buffer table."""
        return {g: GROUPS[g] for g in ("zero_all", "prefill", "rows", "checksum")}

    def rows_ranges(self, tokens):
        """The (offset, length) ranges zero_all_rows(tokens) clears, in slab order."""
        cdef mt_range r[MT_N_ZERO_ALL]
        cdef int n = mt_zero_rows_ranges(&self.L, u64_arg(tokens, "tokens"), r)
        return [(r[i].offset, r[i].length) for i in range(n)]

    def __repr__(self):
        return (f"<SlabPlan {self.L.slab_bytes} bytes, max_batch_tokens={self.L.max_batch_tokens}, "
                f"zero_all={self.zero_all}>")


def plan_layout(sizes, max_batch_tokens):
    """The SlabPlan of an arena built from `sizes` (a BufferSizes) for
    `max_batch_tokens`, without allocating anything."""
    cdef SlabPlan plan = SlabPlan.__new__(SlabPlan, _TOKEN)
    plan_into(&plan.L, sizes, max_batch_tokens)
    return plan


def zero_rows_ranges(sizes, max_batch_tokens, tokens):
    """The ranges, relative to the slab, that zero_all_rows(tokens) clears for
    an arena of `sizes`: plan_layout(...).rows_ranges(tokens)."""
    return plan_layout(sizes, max_batch_tokens).rows_ranges(tokens)


def buffer_table():
    """The compiled C buffer table: ((name, flags), ...) in canonical order, for
    the tests that check the generated Python and the stubs against it."""
    return tuple((mt_buffer_names[i].decode(), mt_buffer_flags[i]) for i in range(MT_NBUF))
