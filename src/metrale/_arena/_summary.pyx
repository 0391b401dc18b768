# cython: language_level=3, binding=False
"""What a BufferArena holds, as values: each buffer as a `BufferInfo`
(`arena.buffers`, a read-only mapping), its pointers as one attribute each
(`arena.ptrs`, an `ArenaPointers`), the whole arena as an `ArenaSummary`
(`arena.summary()`; ``str()`` is a short report) and as the flat counters of
`arena.memory_stats()` for exporters, and the process's arenas
(`metrale.stats()`).  BufferArena binds `buffers`, `summary`,
`memory_stats`, `pins` and its plain accessors from here.
"""

cimport cython

from metrale._arena._arena_state cimport ArenaState, live_arenas, sleeping
from metrale._base._life cimport mt_life_exports, mt_life_released
from metrale._arena._reservation cimport Reservation
from metrale._arena._sleep_state cimport TORCH_CLASS, SleepState
from metrale._arena._view cimport buffer_dtypes

import re
from collections.abc import Mapping

from metrale._arena._summary_records import ArenaSummary, BufferInfo, ClassInfo, Pin
from metrale._sizing._spec import POOL_NAME as _POOL_NAME
from metrale._sizing._wake import MAX_CLASSES as _MAX_CLASSES

# Private constructor key: ArenaBuffers come from BufferArena.buffers.
cdef object _TOKEN = object()


@cython.final
cdef class ArenaBuffers:
    """The buffers of an arena as a read-only mapping: name -> `BufferInfo`.

    Iterates in the set's order over all its names (46 for `REFERENCE`),
    empty buffers included (pointer 0); ``name in arena.buffers``,
    ``len(arena.buffers)``.
    A lookup gives the buffer as it is now: after a `resize` its new size,
    after `release` pointer 0.  Got from `BufferArena.buffers`.
    """

    cdef ArenaState _arena      # the arena keeps no reference back: no cycle

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("ArenaBuffers is got from BufferArena.buffers")

    cdef dict _current(self):
        return infos(self._arena)

    def __getitem__(self, name):
        try:
            return self._current()[name]
        except TypeError:           # an unhashable key is no buffer name either
            raise KeyError(name) from None

    def get(self, name, default=None):
        """The `BufferInfo` of `name`, or `default` if it is no buffer.

        Parameters
        ----------
        name : str
            A buffer name.
        default : object, optional
            What to return for a name that is no buffer (None).

        Returns
        -------
        BufferInfo or object
        """
        try:
            return self[name]
        except KeyError:
            return default

    def __iter__(self):
        return iter(self._arena._buffers.names)

    def __len__(self):
        return len(self._arena._buffers)

    def __contains__(self, name):
        return isinstance(name, str) and name in self._arena._index

    def keys(self):
        """The buffer names, in the set's order (a keys view)."""
        return self._current().keys()

    def items(self):
        """(name, `BufferInfo`) pairs, in the set's order (an items view)."""
        return self._current().items()

    def values(self):
        """The `BufferInfo` of every buffer, in the set's order (a values view)."""
        return self._current().values()

    def __eq__(self, other):
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return f"<ArenaBuffers of {self._arena!r}: {len(self._arena._buffers)} buffers>"


Mapping.register(ArenaBuffers)


cdef dict infos(ArenaState a):
    """The BufferInfo of every buffer of `a`, made again only when a buffer
    changed: the arena replaces its pointer and size tuples whenever one does."""
    if a._infos is None or a._infos_of[0] is not a._ptrs or a._infos_of[1] is not a._bytes:
        of = (a._ptrs, a._bytes)
        dtypes = buffer_dtypes(a._buffers)
        names = a._buffers.names
        a._infos = {names[i]: BufferInfo(names[i], a._ptrs[i], a._bytes[i],
                                         a._layout.offset[i] if a._layout.size[i] else None,
                                         dtypes[i])
                    for i in range(a._layout.n)}
        a._infos_of = of
    return a._infos


def buffer_map(ArenaState self):
    """The buffers as a read-only mapping: name -> `BufferInfo`
    (pointer, bytes, offset in the slab, element type)."""
    cdef ArenaBuffers m = ArenaBuffers.__new__(ArenaBuffers, _TOKEN)
    m._arena = self
    return m


@cython.binding(True)
def summary(ArenaState self):
    """What this arena holds: slab, live and empty buffers, zero ranges,
    levers.

    Returns
    -------
    ArenaSummary
        Values as attributes; ``str(summary)`` is a text report.
    """
    cdef ArenaState a = self
    return ArenaSummary(
        _backend_label(a._gpu), a._max_tokens, a._layout.slab_bytes, a._sizes.total_bytes(),
        sum(1 for v in a._bytes if v),
        tuple(n for n, v in zip(a._buffers.names, a._bytes) if not v),
        (a._layout.zero_all.offset, a._layout.zero_all.length),
        (a._layout.zero_prefill.offset, a._layout.zero_prefill.length),
        {g: m for g, m in a._buffers.groups.items()
         if g in ("zero_all", "prefill", "rows", "checksum")},
        a._sizes.levers(), bool(mt_life_released(a._life)), a._reservation is not None,
        a.committed_bytes(), sleeping(a), a._layout.guard,
        len(a._reservation.orphans) if a._reservation is not None else 0,
        max_seq_len(a), kv_block_size(a), a._max_seqs, a._tp,
        a._pool.stats() if a._pool is not None and not a._pool.closed else None,
        _classes(a))


cdef tuple _classes(ArenaState a):
    """Each class of a reserved arena (then the pool's) as a ClassInfo."""
    cdef SleepState st = a._sleep_state
    cdef Reservation r = a._reservation
    cdef int k
    if st is None:
        return ()
    out = []
    for k, (name, members) in enumerate(a._buffers.classes.items()):
        spans = r.spans[k] if k < len(r.spans) else []
        mapped = sum(c[1] for c in r.chunks if any(x <= c[0] < y for x, y in spans))
        out.append(ClassInfo(name, members, bool(st.asleep >> k & 1), st.epoch[k], mapped))
    if a._pool is not None and not a._pool.closed:
        out.append(ClassInfo(_POOL_NAME, (), bool(st.asleep >> TORCH_CLASS & 1),
                             st.epoch[TORCH_CLASS], a._pool.stats()["committed"]))
    return tuple(out)


def _backend_label(gpu):
    """The backend's repr without its allocation counters (``live_bytes``,
    ``live_alloc_count``): they count its plain allocations, not what an
    arena maps, and read as "nothing" beside a reserved arena's memory."""
    label = re.sub(r"(, )?live_\w+=\d+", "", repr(gpu)).replace("(, ", "(")
    return label[:-2] if label.endswith("()") else label


@cython.binding(True)
def max_batch_tokens(ArenaState self):
    """The most tokens one pass may carry (int); the buffers are sized for it."""
    return self._max_tokens


@cython.binding(True)
def sizes(ArenaState self):
    """The sizes the arena holds now (BufferSizes; ``.buffers`` is its set)."""
    return self._sizes


@cython.binding(True)
def backend(ArenaState self):
    """The backend that holds the memory (HostBackend or CudaBackend)."""
    return self._gpu


@cython.binding(True)
def slab_bytes(ArenaState self):
    """Bytes of the one allocation, or of the reservation (int)."""
    return self._layout.slab_bytes


@cython.binding(True)
def is_released(ArenaState self):
    """Whether `release` has begun (bool)."""
    return bool(mt_life_released(self._life))


@cython.binding(True)
def label(ArenaState self):
    """The arena's name in log lines and errors (the reference's label).

    Returns
    -------
    str
        ``"buffer arena"``.
    """
    cdef ArenaState a = self
    return "buffer arena"


@cython.binding(True)
def max_seq_len(ArenaState self):
    """The longest sequence the buffers are sized for.

    Returns
    -------
    int or None
        None when the sizes record no limits (`from_sizes` with sizes made
        by hand).
    """
    cdef ArenaState a = self
    return None if a._limits is None else a._limits[1]


@cython.binding(True)
def kv_block_size(ArenaState self):
    """Tokens per paged-KV block the buffers are sized for (0: 256 blocks per
    sequence).

    Returns
    -------
    int or None
        None when the sizes record no limits.
    """
    cdef ArenaState a = self
    return None if a._limits is None else a._limits[2]


@cython.binding(True)
def max_batch_size(ArenaState self):
    """The most sequences one batched decode step carries (it sets the decode
    metadata layout, `decode_meta`).

    Returns
    -------
    int
    """
    cdef ArenaState a = self
    return a._max_seqs


@cython.binding(True)
def tp_size(ArenaState self):
    """The tensor-parallel ranks the buffers are per-rank sizes for.

    Returns
    -------
    int
        1 for the whole model (docs/tensor-parallel.md).
    """
    cdef ArenaState a = self
    return a._tp


@cython.binding(True)
def decode_meta(ArenaState self):
    """The byte layout of the batched-decode metadata inside `scratch`.

    Returns
    -------
    DecodeMetaLayout
    """
    cdef ArenaState a = self
    return a._decode_meta


@cython.binding(True)
def debug_options(ArenaState self):
    """The options of a debug arena.

    Returns
    -------
    DebugOptions or None
        None for an arena built without ``debug=``.
    """
    cdef ArenaState a = self
    return a._debug


@cython.binding(True)
def pins(ArenaState self):
    """What keeps the arena's memory from being given back now: the ledger
    a sleep, a shrinking resize and a release check before they change
    anything (each refuses while a pin stands in its way, naming it;
    docs/stable-addresses.md).  metrale makes no dma-buf export; the only
    exports of its memory are these.

    Returns
    -------
    tuple of Pin
        The views of each buffer that has some, in the set's order, then
        the peer exports and imports of a shared arena, then the pool's
        segments handed out; each with the class it holds awake (`Pin.tag`).
    """
    cdef ArenaState a = self
    cdef int i
    names = a._buffers.names
    out = [Pin("view", names[i], mt_life_exports(a._life, i), a._buffers[names[i]].tag)
           for i in range(a._layout.n) if mt_life_exports(a._life, i)]
    if a._peers is not None:
        imported = a._peers.imported()
        if a._peers.exported:
            out.append(Pin("peer_export", None, a._peers.exported))
        if imported[0]:
            out.append(Pin("peer_import", None, imported[0]))
    if a._pool is not None and a._pool.segments_held():
        out.append(Pin("pool", None, a._pool.segments_held(), _POOL_NAME))
    return tuple(out)


@cython.binding(True)
def memory_stats(ArenaState self):
    """The arena's memory as flat counters, for metrics exporters.

    The keys are stable (new ones may be added, none renamed): gauges an
    exporter can publish as they are (Prometheus-style: ``metrale_<key>``).

    Returns
    -------
    dict
        ``"slab_bytes"``: the one allocation, or the reservation's bytes;
        ``"reserved_bytes"``: the reservation held (0 unless reserved, and
        once released: what a failed release still holds);
        ``"committed_bytes"``: physical bytes backing the arena now;
        ``"peak_committed_bytes"``: the most ever committed;
        ``"buffer_bytes"``: buffer name -> bytes, every buffer;
        ``"physical_handles"``: handles mapped now (0 unless reserved);
        ``"unreleased_handles"``: handles whose release the backend refused;
        ``"kept_bytes"``: bytes of the buffers a sleep copied out (`keep`);
        ``"host_keep_bytes"``: the pinned host memory held for `keep` (made
        once, reused by every sleep, freed by `release`);
        ``"offloaded_bytes"``: bytes of the buffers a sleep moved to host
        memory (`offload`);
        ``"host_offload_bytes"``, ``"host_handles"``: the host memory held
        for `offload` (made once, reused, freed by `release`) and its handles;
        ``"exported_handles"``: this arena's handles exported to peers;
        ``"imported_handles"``, ``"imported_bytes"``: peers' handles mapped
        here; ``"live_views"``: views (and arrays made from them) alive;
        ``"reserved"``, ``"sleeping"``, ``"released"``: bools;
        ``"max_batch_tokens"``, ``"tp_size"``: the limits the sizes are for;
        ``"pool_reserved_bytes"``, ``"pool_committed_bytes"``,
        ``"pool_in_use_bytes"``, ``"pool_peak_in_use_bytes"``,
        ``"pool_segments"``: the pool's (`open_pool`; 0 without one);
        ``"pool_offloaded_bytes"``, ``"pool_host_bytes"``: its segments'
        bytes a sleep moved to host memory (``offload=["torch"]``), and
        the host memory held for that (made once, reused, freed with the
        pool).  ``committed_bytes`` counts the buffers' memory, not the
        pool's.  ``"classes_asleep"``: the classes (``BufferSpec(tag=)``,
        and ``"torch"``, the pool's) asleep now, in the set's order;
        ``"class_epochs"``: class -> its wakes so far (a reserved arena's;
        ``{}`` for one that never sleeps).
    """
    cdef ArenaState a = self
    cdef int i
    cdef Reservation r = a._reservation
    cdef SleepState st = a._sleep_state
    imported = a._peers.imported() if a._peers is not None else (0, 0)
    pool = a._pool.stats() if a._pool is not None and not a._pool.closed else {}
    classes = list(zip(a._buffers.classes, range(_MAX_CLASSES)))
    if a._pool is not None:
        classes.append((_POOL_NAME, TORCH_CLASS))
    return {
        "slab_bytes": a._layout.slab_bytes,
        "reserved_bytes": a._layout.slab_bytes if r is not None and a._alloc else 0,
        "committed_bytes": a.committed_bytes(),
        "peak_committed_bytes": r.peak if r is not None else a._layout.slab_bytes,
        "buffer_bytes": dict(zip(a._buffers.names, a._bytes)),
        "physical_handles": len(r.chunks) if r is not None else 0,
        "unreleased_handles": len(r.orphans) if r is not None else 0,
        "kept_bytes": st.kept_bytes() if st is not None else 0,
        "host_keep_bytes": st.host_keep_bytes() if st is not None else 0,
        "offloaded_bytes": st.offloaded_bytes() if st is not None else 0,
        "host_offload_bytes": st.host_offload_bytes() if st is not None else 0,
        "host_handles": st.host_handles() if st is not None else 0,
        "exported_handles": a._peers.exported if a._peers is not None else 0,
        "imported_handles": imported[0],
        "imported_bytes": imported[1],
        "live_views": sum(mt_life_exports(a._life, i) for i in range(a._layout.n)),
        "reserved": r is not None,
        "sleeping": sleeping(a),
        "released": bool(mt_life_released(a._life)),
        "max_batch_tokens": a._max_tokens,
        "tp_size": a._tp,
        "pool_reserved_bytes": pool.get("reserved", 0),
        "pool_committed_bytes": pool.get("committed", 0),
        "pool_in_use_bytes": pool.get("in_use", 0),
        "pool_peak_in_use_bytes": pool.get("peak_in_use", 0),
        "pool_segments": pool.get("segments", 0),
        "pool_offloaded_bytes": pool.get("offloaded", 0),
        "pool_host_bytes": pool.get("host_bytes", 0),
        "classes_asleep": [c for c, k in classes if st is not None and st.asleep >> k & 1],
        "class_epochs": {c: st.epoch[k] for c, k in classes} if st is not None else {},
    }


def stats():
    """The buffer arenas of this process: how many, and their memory.

    Counts the arenas alive (not yet garbage-collected) and not released.

    Returns
    -------
    dict
        ``"arenas"``: their number; ``"committed_bytes"``,
        ``"reserved_bytes"``, ``"slab_bytes"``: the sums of their
        `memory_stats` entries; ``"sleeping"``: how many sleep.
    """
    out = {"arenas": 0, "committed_bytes": 0, "reserved_bytes": 0, "slab_bytes": 0, "sleeping": 0}
    for arena in live_arenas():
        m = memory_stats(arena)
        if m["released"]:
            continue
        out["arenas"] += 1
        for key in ("committed_bytes", "reserved_bytes", "slab_bytes"):
            out[key] += m[key]
        out["sleeping"] += m["sleeping"]
    return out
