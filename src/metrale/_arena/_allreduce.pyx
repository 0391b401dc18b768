# cython: language_level=3, binding=False
"""The tensor-parallel all-reduce of a shared BufferArena
(``arena.peer_all_reduce``, docs/tensor-parallel.md): the live rows of
token-major buffers summed over the ranks of the group, read through the
peers' slabs that sharing mapped once, in one launch that reads the token
count when it runs (capturable: one graph for every batch size).

The algorithm and its barriers are kernels/peer_reduce.h; the kernel
peer_reduce.cu, the host implementation src/peer.c.  This module checks the
arguments, builds each call's parameter block once (cached on the sharing by
buffer ids) and hands it to the backend.
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memset

from metrale._arena._arena_state cimport ArenaState
from metrale._arena._peers cimport Peers
from metrale._base._common cimport as_stream, buffer_ids, u64_arg
from metrale._base._debug_core cimport MT_EL_BF16, MT_EL_F32
from metrale._base._life cimport mt_life_leave
from metrale._base._peer_core cimport (MT_RED_MAX_ITEMS, MT_RED_MAX_RANKS, MT_RED_STATUS_OFFSET,
                                       MT_RED_TIMEOUT, mt_reduce_args)

from metrale._base._common import seconds_arg
from metrale._sizing._spec import dims_of
from metrale._base.errors import MetraleError

# The element types it sums, and the first dimensions that make a buffer
# token-major (rows of max_batch_tokens, or of ceil16 of it).
_ELEM = {"bfloat16": MT_EL_BF16, "float32": MT_EL_F32}
_BY_M = ("M", "max_batch_tokens")
_BY_MP = ("Mp",)
_CACHED = 64            # parameter blocks kept per shared arena


@cython.final
cdef class _Plan:
    """One call's parameter block, less the count and the timeout, and the
    byte ranges it reads and writes (from the base), for the tokens_at check."""
    cdef mt_reduce_args args
    cdef list spans


cdef tuple _names_arg(object names, str arg):
    """`names` (a buffer name, or a list or tuple of them) as a tuple of str,
    before anything else looks at it."""
    if isinstance(names, str):
        return (names,)
    if not isinstance(names, (list, tuple)):
        raise TypeError(f"{arg} must be a buffer name or a list of buffer names, "
                        f"got {type(names).__name__}")
    out = tuple(names)
    for n in out:
        if type(n) is not str:
            raise TypeError(f"{arg}: buffer names must be str, got {type(n).__name__}")
    if not 1 <= len(out) <= MT_RED_MAX_ITEMS:
        raise ValueError(f"{arg}: 1 to {MT_RED_MAX_ITEMS} buffers per call, got {len(out)}")
    return out


cdef tuple _rows_of(ArenaState a, int i, str arg):
    """(element code, bytes of a row, rows) of buffer `i`, or ValueError
    saying why peer_all_reduce cannot sum it."""
    spec = a._buffers.specs[i]
    name = spec.name
    elem = _ELEM.get(spec.dtype)
    if elem is None:
        raise ValueError(f"{arg}: {name!r} holds {spec.dtype or 'raw bytes'}; peer_all_reduce "
                         "sums bfloat16 and float32 buffers")
    first = dims_of(spec.shape)[0] if spec.shape_exact else None
    m = a._layout.max_batch_tokens
    if first in _BY_M:
        rows = m
    elif first in _BY_MP:
        rows = (m + 15) // 16 * 16
    else:
        raise ValueError(f"{arg}: {name!r} is not token-major (its shape is "
                         f"{spec.shape!r}, not [M, ...] or [Mp, ...]): it has no live rows to sum")
    size = a._layout.size[i]
    if size == 0 or rows == 0:
        raise ValueError(f"{arg}: {name!r} is empty in this arena")
    if size % rows or (size // rows) % 16:
        raise ValueError(f"{arg}: {name!r} has {size} bytes for {rows} rows; peer_all_reduce "
                         "needs rows of a multiple of 16 bytes")
    return elem, size // rows, rows


cdef _Plan _plan(ArenaState a, Peers sharing, tuple ids, tuple outs):
    cdef _Plan p = _Plan()
    cdef int k, i, o
    memset(&p.args, 0, sizeof(p.args))
    names = a._buffers.names
    p.spans = []
    for k in range(len(ids)):
        i, o = ids[k], outs[k]
        elem, row, rows = _rows_of(a, i, "names")
        if o != i:
            if o in ids:
                raise ValueError(f"out: {names[o]!r} is also an input of this call; give each "
                                 "buffer once (out=None sums in place)")
            oelem, orow, orows = _rows_of(a, o, "out")
            if (oelem, orow) != (elem, row):
                raise ValueError(f"out: {names[o]!r} does not have the rows of {names[i]!r} "
                                 f"({orow} bytes of {a._buffers.specs[o].dtype}, not {row} of "
                                 f"{a._buffers.specs[i].dtype})")
            rows = min(rows, orows)
        p.args.in_off[k] = a._layout.offset[i]
        p.args.out_off[k] = a._layout.offset[o]
        p.args.row_bytes[k] = row
        p.args.rows[k] = rows
        p.args.elem[k] = elem
        for j in (i, o):
            p.spans.append((a._layout.offset[j], a._layout.offset[j] + a._layout.size[j], names[j]))
    p.args.items = len(ids)
    p.args.ranks = sharing.size
    p.args.me = sharing.rank
    p.args.blocks = 1
    for r in range(sharing.size):
        p.args.base[r] = sharing.bases[r]
        p.args.signal[r] = sharing.signals.get(r, 0)
    return p


cdef Peers _sharing(ArenaState a, str what, bint attached=True):
    """The arena's sharing, if peer_all_reduce can run on it (`attached`:
    and its peers' memory is mapped)."""
    cdef Peers s = a._peers
    if s is None:
        raise MetraleError(f"{what}: the arena is not shared (build it with group=...)")
    if len(s.local) != s.size:
        raise MetraleError(f"{what}: ranks {sorted(set(range(s.size)) - set(s.local))} run on "
                           "another host; it reduces over the ranks of one host only")
    if attached and s.detached:             # one rank too: the same call refuses on every group
        raise MetraleError(f"{what}: the peers' memory is detached (detach_peers); "
                           "attach_peers maps it again")
    if s.size > MT_RED_MAX_RANKS:
        raise MetraleError(f"{what}: {s.size} ranks, at most {MT_RED_MAX_RANKS}")
    return s


@cython.binding(True)
def peer_all_reduce(ArenaState self, names, stream=None, tokens=None, *, tokens_at=None,
                           out=None, timeout=10.0):
    """Sum the live rows of buffers over the ranks of the group, on every rank.

    A collective call: every rank of the group makes the same calls, in the
    same order, with the same buffers and the same count.  Each buffer's
    first `tokens` rows are summed over the ranks (in rank order; bfloat16
    in float, rounded once) and the sum is written on every rank, into the
    buffer itself or into `out`.  One launch on CUDA, reading the peers'
    rows through the mappings made at construction: no NCCL, nothing
    registered, capturable.  With `tokens_at` the count is read when the
    launch runs, so one captured graph reduces only the live rows of every
    batch size.

    Parameters
    ----------
    names : str or list of str
        Token-major bfloat16 or float32 buffers (shape ``[M, ...]`` or
        ``[Mp, ...]``, rows of a multiple of 16 bytes): 1 to 16 of them.
    stream : int or stream object, optional
        As for `zero_all`.
    tokens : int
        Live rows (``>= max_batch_tokens``: every row).
    tokens_at : int, keyword-only
        Instead: the device address of an int32 count (negative: every
        row), 4-byte aligned, in memory of the arena's backend and outside
        the buffers of the call.
    out : str or list of str, optional
        Where each sum goes (one per name, the same dtype and row size);
        None (the default): into the buffers themselves.
    timeout : float, optional
        Seconds a barrier waits for a peer (default 10) before this rank
        gives up: then its reductions stay refused (`check_peer_reduce`
        says so on CUDA; the host backend raises at once).

    Raises
    ------
    TypeError, ValueError
        A bad argument (named).
    MetraleError
        The arena is not shared, released, or a rank runs on another host;
        on the host backend, a barrier timed out.
    """
    cdef ArenaState a = self
    cdef uintptr_t at = 0, s
    cdef uint64_t t = 0
    cdef _Plan plan
    cdef mt_reduce_args args
    cdef int k
    cdef Peers sharing
    given = _names_arg(names, "names")
    outs_given = given if out is None else _names_arg(out, "out")
    if len(outs_given) != len(given):
        raise ValueError(f"out: {len(outs_given)} buffers for {len(given)} names")
    if tokens_at is not None:
        if tokens is not None:
            raise TypeError("peer_all_reduce() takes tokens or tokens_at, not both")
        at = a._gpu.count_arg(tokens_at)
    elif tokens is None:
        raise TypeError("peer_all_reduce() missing its tokens argument (the live rows), "
                        "or tokens_at= (where the device holds it)")
    else:
        t = u64_arg(tokens, "tokens")
    secs = seconds_arg(timeout, "timeout")
    s = as_stream(stream)
    ids = tuple(buffer_ids(given, "names", a._buffers))
    outs = tuple(buffer_ids(outs_given, "out", a._buffers))
    if len(ids) != len(given) or len(outs) != len(given):
        raise ValueError(f"{'names' if len(ids) != len(given) else 'out'}: a buffer is named twice")
    a._enter(None)
    try:
        sharing = _sharing(a, "peer_all_reduce")
        key = (ids, outs)
        plan = sharing.reduces.get(key)
        if plan is None:
            plan = _plan(a, sharing, ids, outs)
            if len(sharing.reduces) >= _CACHED:
                sharing.reduces.clear()
            sharing.reduces[key] = plan
        if at:
            a._gpu.check_count(at)
        if at and a._base <= at < a._base + a._layout.slab_bytes:
            for lo, hi, name in plan.spans:
                if lo <= at - a._base < hi:
                    raise ValueError(f"tokens_at: {at:#x} lies in {name!r}, which this call "
                                     "writes while it reads the count")
        args = plan.args
        args.count_at = at
        args.count = <long long>(t if t < (1ull << 62) else (1ull << 62))
        args.timeout_ns = <unsigned long long>(secs * 1e9)
        a._gpu.peer_reduce(&args, s)
    finally:
        mt_life_leave(a._life)


@cython.binding(True)
def check_peer_reduce(ArenaState self, stream=None):
    """Wait for `stream`, then raise if this rank's reductions have failed.

    A barrier of `peer_all_reduce` that waits longer than its timeout for a
    peer (one that died, or made other calls) makes the launch give up
    instead of hanging; on CUDA that is only known when it has run, so an
    engine calls this where it waits anyway (the host backend raises at the
    call itself).

    Parameters
    ----------
    stream : int or stream object, optional
        The stream the reductions ran on (as for `zero_all`).

    Raises
    ------
    MetraleError
        A barrier timed out: the sums of that call and of every later one on
        this rank were not made; release the arena on every rank and build
        it again.  Also: the arena is not shared, or released.
    """
    cdef ArenaState a = self
    cdef uintptr_t s = as_stream(stream)
    cdef unsigned int status = 0
    cdef Peers sharing
    a._enter(None)
    try:
        sharing = _sharing(a, "check_peer_reduce", False)     # its own memory only
        where = sharing.signals.get(sharing.rank, 0)
        if where:
            a._gpu.d2h(&status, where + MT_RED_STATUS_OFFSET, 4, s)
    finally:
        mt_life_leave(a._life)
    if status:
        raise MetraleError(f"peer_all_reduce: rank {sharing.rank} waited too long for rank "
                           f"{status - MT_RED_TIMEOUT} at a barrier (did it die, or make other "
                           "calls?); its sums were not made, and this arena's reductions stay "
                           "refused: release it on every rank and build it again")
