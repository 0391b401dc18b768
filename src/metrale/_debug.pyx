# cython: language_level=3, binding=False
"""Debug arenas (docs/debug.md): guard bands, poisoned padding rows, NaN
scans and fingerprints over an arena's slab.

Each operation gathers its byte ranges (items) from the layout in the C core
(debug.c: the guard bands; layout.c: the zero_all_rows row rule) and runs
them through the backend in one call: one kernel launch on CUDA
(kernels/debug_ops.cu), one C pass on the host (debug.c).  The element type
of each buffer comes from the catalogue (metrale.catalogue), read once.
"""

from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memset

from metrale._backend cimport Backend
from metrale._core cimport (MT_IN_ROWS, MT_NBUF, mt_buffer_flags, mt_layout, mt_range,
                            mt_rows_length, mt_rows_stride)
from metrale._debug_core cimport (
    MT_DBG_CHECK, MT_DBG_FILL, MT_DBG_FINGERPRINT, MT_DBG_NONFINITE, MT_EL_BF16, MT_EL_F32,
    MT_EL_FP8_E4M3, MT_EL_I8, MT_EL_I32, MT_EL_I64, MT_EL_NONE, MT_EL_U32, MT_GUARD_BYTE,
    MT_DBG_MAX_ITEMS, mt_debug_args, mt_debug_result, mt_fp_final, mt_guard_ranges,
    mt_poison_pattern)

from metrale._buffers import BUFFER_NAMES
from metrale.debug import GuardDamage, NonFinite

# The catalogue's dtype names -> the kernels' element codes.
_CODES = {"bfloat16": MT_EL_BF16, "float32": MT_EL_F32, "float8_e4m3fn": MT_EL_FP8_E4M3,
          "int8": MT_EL_I8, "int32": MT_EL_I32, "uint32": MT_EL_U32, "int64": MT_EL_I64}
# Element codes that find_nonfinite scans.
_FLOATS = frozenset((MT_EL_BF16, MT_EL_F32, MT_EL_FP8_E4M3))

cdef tuple _elems = None


cdef tuple _elem_codes():
    """The element code of every buffer, by id (MT_EL_NONE where untyped)."""
    global _elems
    if _elems is None:
        from metrale.catalogue import CATALOGUE
        _elems = tuple(_CODES[CATALOGUE[n].dtype] if CATALOGUE[n].dtype else MT_EL_NONE
                       for n in BUFFER_NAMES)
    return _elems


cdef inline void _start(mt_debug_args *a, uintptr_t base) noexcept:
    memset(a, 0, sizeof(mt_debug_args))
    a.base = base


cdef inline int _add(mt_debug_args *a, uint64_t offset, uint64_t length) except -1:
    if a.count >= MT_DBG_MAX_ITEMS:      # the parameter block's arrays are that long
        raise ValueError(f"a debug operation takes at most {MT_DBG_MAX_ITEMS} items")
    a.offset[a.count] = offset
    a.length[a.count] = length
    a.count += 1
    return 0


cdef int _guards(const mt_layout *L, mt_debug_args *a, int *ids) except -1:
    cdef mt_range r[MT_NBUF]
    cdef int n = mt_guard_ranges(L, ids, r), i, k
    for i in range(n):
        for k in range(16):
            a.pattern[i][k] = MT_GUARD_BYTE(k)
        _add(a, r[i].offset, r[i].length)
    return n


cdef int fill_guards(Backend be, const mt_layout *L, uintptr_t base, uintptr_t stream) except -1:
    """Write the guard pattern over every guard band (enqueued on `stream`)."""
    cdef mt_debug_args a
    cdef mt_debug_result out[MT_NBUF]
    cdef int ids[MT_NBUF]
    _start(&a, base)
    if _guards(L, &a, ids):
        be.debug_run(MT_DBG_FILL, &a, out, stream)
    return 0


cdef list check_guards(Backend be, const mt_layout *L, uintptr_t base, uintptr_t stream):
    """The damaged guard bands, in slab order, as GuardDamage values."""
    cdef mt_debug_args a
    cdef mt_debug_result out[MT_NBUF]
    cdef int ids[MT_NBUF]
    cdef int n, i
    _start(&a, base)
    n = _guards(L, &a, ids)
    if n == 0:
        return []
    be.debug_run(MT_DBG_CHECK, &a, out, stream)
    return [GuardDamage(BUFFER_NAMES[ids[i]], ~out[i].first_inv, out[i].count, a.length[i])
            for i in range(n) if out[i].count]


cdef int poison_rows(Backend be, const mt_layout *L, uintptr_t base, uint64_t tokens,
                     uintptr_t stream) except -1:
    """Fill the rows past `tokens` of every row-trimmed buffer with the
    poison of its element type (enqueued on `stream`)."""
    cdef mt_debug_args a
    cdef mt_debug_result out[MT_NBUF]
    cdef uint64_t live, n
    cdef int b, i
    elems = _elem_codes()
    _start(&a, base)
    for i in range(MT_NBUF):
        b = L.order[i]
        n = L.size[b]
        if not mt_buffer_flags[b] & MT_IN_ROWS or n == 0:
            continue
        live = mt_rows_length(L, b, tokens)
        if live < n and mt_poison_pattern(elems[b], a.pattern[a.count]):
            _add(&a, L.offset[b] + live, n - live)
    if a.count:
        be.debug_run(MT_DBG_FILL, &a, out, stream)
    return 0


cdef object _row_of(const mt_layout *L, int b, uint64_t offset):
    """The token row holding byte `offset` of buffer b (by zero_all_rows' row
    bytes), or None for a buffer not made of rows."""
    cdef uint64_t row = mt_rows_stride(L, b)
    return offset // row if row else None


cdef list find_nonfinite(Backend be, const mt_layout *L, uintptr_t base, uint64_t tokens,
                         uintptr_t stream):
    """NonFinite values of the row-trimmed float buffers whose live rows hold
    NaN or Inf, in canonical order."""
    cdef mt_debug_args a
    cdef mt_debug_result out[MT_NBUF]
    cdef int ids[MT_NBUF]
    cdef uint64_t live
    cdef int b, i
    elems = _elem_codes()
    _start(&a, base)
    for b in range(MT_NBUF):
        if not mt_buffer_flags[b] & MT_IN_ROWS or L.size[b] == 0 or elems[b] not in _FLOATS:
            continue
        live = mt_rows_length(L, b, tokens)
        if live:
            ids[a.count] = b
            a.elem[a.count] = elems[b]
            _add(&a, L.offset[b], live)
    if a.count == 0:
        return []
    be.debug_run(MT_DBG_NONFINITE, &a, out, stream)
    found = []
    for i in range(a.count):
        if out[i].count or out[i].extra:
            first = ~out[i].first_inv
            found.append(NonFinite(BUFFER_NAMES[ids[i]], out[i].count, out[i].extra, first,
                                   _row_of(L, ids[i], first)))
    return found


cdef dict fingerprint(Backend be, const mt_layout *L, uintptr_t base, list ids, uintptr_t stream):
    """name -> 64-bit fingerprint of each buffer of `ids` (in that order)."""
    cdef mt_debug_args a
    cdef mt_debug_result out[MT_NBUF]
    cdef int slot[MT_NBUF]
    cdef int b, i
    if len(ids) > MT_NBUF:
        raise ValueError(f"fingerprint: at most {MT_NBUF} buffers, got {len(ids)}")
    _start(&a, base)
    for i in range(len(ids)):
        b = ids[i]
        if not 0 <= b < MT_NBUF:
            raise ValueError(f"fingerprint: no buffer has id {b}")
        slot[i] = -1
        if L.size[b]:
            slot[i] = a.count
            _add(&a, L.offset[b], L.size[b])
    if a.count:
        be.debug_run(MT_DBG_FINGERPRINT, &a, out, stream)
    result = {}
    for i in range(len(ids)):
        b = ids[i]
        result[BUFFER_NAMES[b]] = mt_fp_final(out[slot[i]].count if slot[i] >= 0 else 0, L.size[b])
    return result
