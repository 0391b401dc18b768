# cython: language_level=3, binding=False
"""The host side of the shipped CUDA kernels: load, lay out, launch.

kernels/zero_ranges.ptx (zero_all_rows and friends), kernels/debug_ops.ptx
(debug arenas, docs/debug.md) and kernels/copy_runs.ptx (many copies in one
launch: a refit's) take one parameter block each, passed by value
(kernels/*.h); this module fills those blocks, lays out their grids (one rule
for all: item i owns blocks [first[i], first[i + 1]), each `per` 16-byte
chunks of it) and launches them, without the GIL, the context made current
by the caller (CudaBackend).
"""

from libc.stdint cimport uintptr_t
from libc.string cimport memcpy, memset

from cuda.bindings cimport cydriver
from metrale._base._core cimport (MT_COPY_RUNS, MT_MAX_RANGES, MT_MAX_ROWS_ENTRIES, mt_copy_args,
                                  mt_copy_run, mt_range, mt_rows_args, mt_rows_launch,
                                  mt_rows_segment, mt_zero_args)
from metrale._base._debug_core cimport (MT_DBG_FILL, MT_DBG_FINGERPRINT, MT_DBG_MAX_ITEMS,
                                        MT_DBG_NONFINITE, mt_debug_args, mt_debug_result)
from metrale._base._common cimport index_arg
from metrale._base._peer_core cimport MT_RED_BLOCKS, MT_RED_THREADS, mt_reduce_args
from metrale._base._driver cimport check

cdef enum:
    # 16-byte chunks per block of metrale_zero_ranges: 8 KiB, two stores per
    # thread of a 256-thread block.  Measured on the H200 against 256..8192
    # (bench/RESULTS.md).
    ZERO_THREADS = 256
    ZERO_PER = 512
    # The debug kernels: 256 threads a block, each block 2,048 16-byte chunks
    # (32 KiB) of one item.
    DBG_THREADS = 256
    DBG_PER = 2048
    # metrale_copy_runs: 256 threads a block, each block 2,048 16-byte chunks
    # (32 KiB, four loads in flight a thread) of one run.
    COPY_THREADS = 256
    COPY_PER = 2048

cdef const char *_ZERO_NAMES[2]
_ZERO_NAMES[:] = [b"metrale_zero_ranges", b"metrale_zero_rows_at"]
cdef const char *_DBG_NAMES[4]         # indexed by MT_DBG_*
_DBG_NAMES[:] = [b"metrale_debug_fill", b"metrale_debug_check", b"metrale_debug_nonfinite",
                 b"metrale_debug_fingerprint"]


cdef int _load(const char *file, const char **names, int n, cydriver.CUmodule *mod,
               cydriver.CUfunction *fns) except -1:
    """Load kernels/<file> and look up its `n` entry points; on failure
    nothing stays loaded."""
    from importlib.resources import files
    ptx = (files("metrale") / "kernels" / file.decode()).read_bytes() + b"\0"
    cdef const char *image = ptx
    cdef cydriver.CUmodule m = NULL
    cdef int i
    with nogil:
        check(cydriver.cuModuleLoadData(&m, image), "cuModuleLoadData", file)
    try:
        for i in range(n):
            check(cydriver.cuModuleGetFunction(&fns[i], m, names[i]), "cuModuleGetFunction", names[i])
    except BaseException:
        with nogil:
            cydriver.cuModuleUnload(m)
        raise
    mod[0] = m
    return 0


cdef int zero_load(ZeroKernels *k, cydriver.CUstream s) except -1:
    cdef size_t n = ROWS_AT_QUEUE_BYTES
    _load(b"zero_ranges.ptx", _ZERO_NAMES, 2, &k.mod, k.fn)
    try:
        with nogil:
            check(cydriver.cuMemAlloc(&k.queues, n), "cuMemAlloc", "zero_all_rows' work counters", n)
            # waited for, so no stream sees them unzeroed; on a non-blocking
            # stream, so it waits for no one else's work
            check(cydriver.cuMemsetD8Async(k.queues, 0, n, s), "cuMemsetD8Async")
            check(cydriver.cuStreamSynchronize(s), "cuStreamSynchronize")
    except BaseException:
        with nogil:
            if k.queues != 0:
                cydriver.cuMemFree(k.queues)
            cydriver.cuModuleUnload(k.mod)
        k.queues = 0
        k.mod = NULL
        raise
    memset(k.queue_lent, 0, sizeof(k.queue_lent))
    k.blocks_per_sm = ROWS_AT_BLOCKS_PER_SM
    k.tile = ROWS_AT_TILE
    k.spread = ROWS_AT_SPREAD
    k.queue = True
    return 0


cdef uintptr_t queue_lend(ZeroKernels *k) noexcept nogil:
    cdef int w, b
    if k.queues == 0:
        return 0
    for w in range(ROWS_AT_QUEUE_WORDS):
        if k.queue_lent[w] != 0xFFFFFFFFFFFFFFFFULL:
            for b in range(64):
                if not (k.queue_lent[w] >> b) & 1:
                    k.queue_lent[w] |= 1ULL << b
                    return <uintptr_t>(k.queues + <unsigned long long>(w * 64 + b) * 8)
    return 0


cdef void queue_return(ZeroKernels *k, uintptr_t q) noexcept nogil:
    cdef unsigned long long i
    if k.queues == 0 or q < k.queues or q >= k.queues + ROWS_AT_QUEUE_BYTES:
        return
    i = (q - k.queues) // 8
    k.queue_lent[i // 64] &= ~(1ULL << (i % 64))


cdef tuple queues_lent(const ZeroKernels *k):
    cdef int w, b, lent = 0
    if k.queues == 0:
        return (0, 0)
    for w in range(ROWS_AT_QUEUE_WORDS):
        for b in range(64):
            lent += (k.queue_lent[w] >> b) & 1
    return (lent, ROWS_AT_QUEUE_WORDS * 64)


cdef const char *_PEER_NAMES[1]
_PEER_NAMES[:] = [b"metrale_peer_reduce"]


cdef int peer_load(PeerKernels *k) except -1:
    if k.mod == NULL:
        _load(b"peer_reduce.ptx", _PEER_NAMES, 1, &k.mod, k.fn)
    return 0


cdef int peer_reduce(const PeerKernels *k, const mt_reduce_args *a, cydriver.CUstream s) except -1 nogil:
    return _launch(k.fn[0], _PEER_NAMES[0], MT_RED_BLOCKS, MT_RED_THREADS, s, <void *>a)


cdef const char *_COPY_NAMES[1]
_COPY_NAMES[:] = [b"metrale_copy_runs"]


cdef int copy_load(CopyKernels *k) except -1:
    if k.mod == NULL:
        _load(b"copy_runs.ptx", _COPY_NAMES, 1, &k.mod, k.fn)
    return 0


cdef int copy_runs(const CopyKernels *k, const mt_copy_run *runs, Py_ssize_t n,
                   cydriver.CUstream s) except -1 nogil:
    cdef mt_copy_args args
    cdef unsigned long long chunks[MT_COPY_RUNS]
    cdef unsigned long long blocks
    cdef Py_ssize_t at = 0
    cdef int i, m, launches = 0
    while at < n:
        m = <int>(n - at if n - at < MT_COPY_RUNS else MT_COPY_RUNS)
        memset(&args, 0, sizeof(args))
        args.count = m
        for i in range(m):
            args.dst[i] = runs[at + i].dst
            args.src[i] = runs[at + i].src
            args.length[i] = runs[at + i].length
            chunks[i] = runs[at + i].length // 16   # its last block also copies length % 16 bytes
        blocks = _grid(chunks, m, COPY_PER, args.first, &args.per)
        _launch(k.fn[0], _COPY_NAMES[0], blocks, COPY_THREADS, s, &args)
        launches += 1
        at += m
    return launches


cdef int debug_load(DebugKernels *k) except -1:
    cdef cydriver.CUmodule mod = NULL
    cdef size_t nres = MT_DBG_MAX_ITEMS * sizeof(mt_debug_result)
    _load(b"debug_ops.ptx", _DBG_NAMES, 4, &mod, k.fn)
    try:
        with nogil:
            check(cydriver.cuMemAlloc(&k.results, nres), "cuMemAlloc", "debug results", nres)
            check(cydriver.cuMemAllocHost(&k.host, nres), "cuMemAllocHost", "debug results", nres)
    except BaseException:
        with nogil:
            if k.results != 0:
                cydriver.cuMemFree(k.results)
            cydriver.cuModuleUnload(mod)
        k.results = 0
        raise
    k.mod = mod
    return 0


cdef int tune_rows_at(ZeroKernels *k, object blocks_per_sm, object tile_chunks,
                      object spread, object queue) except -1:
    b = k.blocks_per_sm if blocks_per_sm is None else \
        index_arg(blocks_per_sm, "blocks_per_sm", 1, ROWS_AT_MAX_BLOCKS_PER_SM)
    t = k.tile if tile_chunks is None else index_arg(tile_chunks, "tile_chunks", 1, ROWS_AT_MAX_TILE)
    if t & (t - 1):
        raise ValueError(f"tile_chunks must be a power of two, got {t}")
    s = k.spread if spread is None else index_arg(spread, "spread", 1, 0xFFFFFFFF)
    if queue is not None and type(queue) is not bool:
        raise TypeError(f"queue must be a bool, got {type(queue).__name__}")
    q = k.queue if queue is None else queue
    k.blocks_per_sm, k.tile, k.spread, k.queue = b, t, s, q
    return 0


cdef dict rows_at_tuning(const ZeroKernels *k):
    return {"blocks_per_sm": k.blocks_per_sm, "tile_chunks": k.tile, "spread": k.spread,
            "queue": bool(k.queue)}


cdef void unload(ZeroKernels *z, DebugKernels *d, PeerKernels *p, CopyKernels *c) noexcept nogil:
    if c.mod != NULL:
        cydriver.cuModuleUnload(c.mod)
    if z.mod != NULL:
        cydriver.cuModuleUnload(z.mod)
    if z.queues != 0:
        cydriver.cuMemFree(z.queues)
    if p.mod != NULL:
        cydriver.cuModuleUnload(p.mod)
    if d.mod != NULL:
        cydriver.cuModuleUnload(d.mod)
    if d.results != 0:
        cydriver.cuMemFree(d.results)
    if d.host != NULL:
        cydriver.cuMemFreeHost(d.host)


cdef inline unsigned long long _grid(const unsigned long long *chunks, int n, unsigned long long per,
                                     unsigned int *first, unsigned int *per_out) noexcept nogil:
    """Lay a launch out over `n` items of chunks[i] 16-byte chunks: item i owns
    blocks [first[i], first[i + 1]), each block `per` chunks of it (raised so
    that the grid stays within 2^30 blocks), at least one block (an item under
    16 bytes still needs one).  Sets *per_out; returns the block count."""
    cdef unsigned long long total = 0, blocks = 0, nb
    cdef int i
    for i in range(n):
        total += chunks[i]
    if total // per > 0x3FFFFFFF:
        per = total // 0x3FFFFFFF + 1
    for i in range(n):
        first[i] = <unsigned int>blocks
        nb = (chunks[i] + per - 1) // per
        blocks += nb if nb else 1
    first[n] = <unsigned int>blocks
    per_out[0] = <unsigned int>per
    return blocks


cdef inline int _launch(cydriver.CUfunction fn, const char *name, unsigned long long blocks,
                        unsigned int threads, cydriver.CUstream s, void *args) except -1 nogil:
    """Launch `fn` with its one parameter, the block at `args`, passed by value."""
    cdef void *params[1]
    params[0] = args
    return check(cydriver.cuLaunchKernel(fn, <unsigned int>blocks, 1, 1, threads, 1, 1, 0, s,
                                         params, NULL), "cuLaunchKernel", name)


cdef int _too_many(int n, int most) except -1 with gil:
    from metrale._base.errors import MetraleError
    raise MetraleError(f"zero_ranges: {n} ranges, at most {most}")


cdef unsigned long long _ranges_args(uintptr_t base, const mt_range *r, int n,
                                     mt_zero_args *args) noexcept nogil:
    """Fill metrale_zero_ranges' parameter block for the n (<= MT_MAX_RANGES)
    ranges of the slab at `base`; returns its block count."""
    cdef unsigned long long chunks[MT_MAX_RANGES]
    cdef int order[MT_MAX_RANGES]
    cdef int i, j
    # Largest range first (stable): its blocks are dispatched first and the
    # small ranges, latency-bound, fill the tail.  Measured best overall.
    for i in range(n):
        j = i
        while j > 0 and r[order[j - 1]].length < r[i].length:
            order[j] = order[j - 1]
            j -= 1
        order[j] = i
    memset(args, 0, sizeof(mt_zero_args))
    args.base = base
    args.count = n
    for i in range(n):
        args.offset[i] = r[order[i]].offset
        args.length[i] = r[order[i]].length
        chunks[i] = args.length[i] // 16        # its last block also clears length % 16 bytes
    return _grid(chunks, n, ZERO_PER, args.first, &args.per)


cdef int zero_ranges(const ZeroKernels *k, uintptr_t base, const mt_range *r, int n,
                     cydriver.CUstream s) except -1 nogil:
    cdef mt_zero_args args
    cdef unsigned long long blocks
    if n > MT_MAX_RANGES:
        return _too_many(n, MT_MAX_RANGES)
    blocks = _ranges_args(base, r, n, &args)
    return _launch(k.fn[0], _ZERO_NAMES[0], blocks, ZERO_THREADS, s, &args)


cdef int zero_rows_at(const ZeroKernels *k, const mt_rows_args *a, uintptr_t queue, int sm_count,
                      cydriver.CUstream s) except -1 nogil:
    # The kernel reads the count when it runs: what every count clears (each
    # entry's segment for 0 rows) is laid out here as zero_ranges lays out its
    # launch, and a few blocks per SM clear what the count adds, at most as
    # many as there are tiles of it at max_batch_tokens.
    cdef mt_rows_launch L
    cdef mt_range r[MT_MAX_ROWS_ENTRIES]
    cdef unsigned long long lo, hi0, hi, fixed = 0, rows = 0
    cdef unsigned long long tile = <unsigned long long>k.tile * 16
    cdef unsigned long long blocks
    cdef int i, n = 0
    memset(&L, 0, sizeof(L))
    L.a = a[0]
    L.a.per = k.tile
    L.a.spread = k.spread
    L.queue = queue if k.queue else 0
    for i in range(L.a.n):
        mt_rows_segment(&L.a, i, 0, &lo, &hi0)
        if hi0 > lo:
            r[n].offset = lo
            r[n].length = hi0 - lo
            n += 1
        mt_rows_segment(&L.a, i, L.a.m, &lo, &hi)
        rows += (hi - hi0 + tile - 1) // tile
    if n:
        fixed = _ranges_args(L.a.base, r, n, &L.fixed)
    if fixed > ROWS_AT_MAX_ITEMS or rows > ROWS_AT_MAX_ITEMS:   # 32-bit counts
        return _too_many_items(fixed if fixed > rows else rows)
    blocks = <unsigned long long>sm_count * k.blocks_per_sm
    if rows < blocks:
        blocks = rows
    L.rows_blocks = <unsigned int>blocks
    if blocks + fixed == 0:
        return 0
    _launch(k.fn[1], _ZERO_NAMES[1], blocks + fixed, ROWS_AT_THREADS, s, &L)
    return 1


cdef int _too_many_items(unsigned long long n) except -1 with gil:
    from metrale._base.errors import MetraleError
    raise MetraleError(f"zero_all_rows(tokens_at=...): {n} tiles, at most {ROWS_AT_MAX_ITEMS}")


cdef int debug_check(int op, const mt_debug_args *a, mt_debug_result *out) except -1:
    cdef int i
    from metrale._base.errors import MetraleError
    if a.count > MT_DBG_MAX_ITEMS:         # before `out` (that many entries) is touched
        raise MetraleError(f"debug operation: {a.count} items, at most {MT_DBG_MAX_ITEMS}")
    memset(out, 0, <size_t>a.count * sizeof(mt_debug_result))
    if op == MT_DBG_NONFINITE or op == MT_DBG_FINGERPRINT:
        for i in range(a.count):            # their kernels read whole 16-byte lanes
            if a.offset[i] & 15:
                raise MetraleError(f"debug operation {op}: item {i} starts at "
                                   f"{a.offset[i]:#x}, not 16-byte aligned")
    return a.count


cdef int debug_launch(const DebugKernels *k, int op, mt_debug_args *a,
                      cydriver.CUstream s) except -1 nogil:
    cdef unsigned long long chunks[MT_DBG_MAX_ITEMS]
    cdef unsigned long long blocks
    cdef int i
    # Each item its 16-byte chunks, from the one holding its first byte to the
    # one holding its last.
    for i in range(a.count):
        chunks[i] = ((a.offset[i] + a.length[i] + 15) >> 4) - (a.offset[i] >> 4)
    blocks = _grid(chunks, a.count, DBG_PER, a.first, &a.per)
    a.results = <unsigned long long>k.results
    if op != MT_DBG_FILL:
        check(cydriver.cuMemsetD32Async(k.results, 0, <size_t>a.count * sizeof(mt_debug_result) // 4, s),
              "cuMemsetD32Async", "debug results")
    return _launch(k.fn[op], _DBG_NAMES[op], blocks, DBG_THREADS, s, a)


cdef int debug_results(const DebugKernels *k, mt_debug_result *out, int n,
                       cydriver.CUstream s) except -1 nogil:
    cdef size_t nres = <size_t>n * sizeof(mt_debug_result)
    check(cydriver.cuMemcpyDtoHAsync(k.host, k.results, nres, s), "cuMemcpyDtoHAsync", "debug results")
    check(cydriver.cuStreamSynchronize(s), "cuStreamSynchronize")
    memcpy(out, k.host, nres)
    return 0
