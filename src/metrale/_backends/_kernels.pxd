# The host side of the shipped CUDA kernels (kernels/*.ptx): load their PTX,
# lay out their parameter blocks and grids, launch them.  Module functions,
# called without the GIL by CudaBackend (which makes the context current
# first and counts the launches).
from libc.stdint cimport uintptr_t

from cuda.bindings cimport cydriver
from metrale._base._core cimport mt_copy_run, mt_range, mt_rows_args
from metrale._base._debug_core cimport mt_debug_args, mt_debug_result
from metrale._base._peer_core cimport mt_reduce_args

cdef enum:
    # zero_rows_at's launch shape: the defaults (measured best on the H200,
    # bench/bench_step.py) and the limits tune_rows_at accepts.
    ROWS_AT_BLOCKS_PER_SM = 1
    ROWS_AT_TILE = 512
    ROWS_AT_SPREAD = 8
    ROWS_AT_MAX_BLOCKS_PER_SM = 32      # no GPU keeps more blocks resident on an SM
    ROWS_AT_MAX_TILE = 4096             # 64 KiB, the largest tile the kernel makes
    ROWS_AT_THREADS = 512
    ROWS_AT_MAX_ITEMS = 0x7FFF0000      # tiles of each kind a launch may have (32-bit counts)
    ROWS_AT_QUEUE_WORDS = 64            # 64 work counters a word of queue_lent: 4096 for one
                                        # backend, as many arenas with one at once
    ROWS_AT_QUEUE_BYTES = ROWS_AT_QUEUE_WORDS * 64 * 8      # the counters' memory (8 bytes each)

# kernels/zero_ranges.ptx, loaded with the backend, and the launch shape of
# metrale_zero_rows_at (CudaBackend.tune_rows_at).
ctypedef struct ZeroKernels:
    cydriver.CUmodule mod
    cydriver.CUfunction fn[2]           # metrale_zero_ranges, metrale_zero_rows_at
    unsigned int blocks_per_sm          # grid: blocks per SM
    unsigned int tile                   # smallest tile in 16-byte chunks, a power of two
    unsigned int spread                 # tiles a block aims at
    bint queue                          # blocks take their tiles from a queue (else a fixed share)
    # metrale_zero_rows_at's work counters (8 bytes each, zeroed at load; a
    # launch leaves its own at zero), one lent to each arena that asks.
    cydriver.CUdeviceptr queues
    unsigned long long queue_lent[ROWS_AT_QUEUE_WORDS]      # bit i: counter i is lent

# kernels/debug_ops.ptx, loaded by the first debug operation, and the results
# of one call: on the device, and their pinned host copy.
ctypedef struct DebugKernels:
    cydriver.CUmodule mod
    cydriver.CUfunction fn[4]           # one per MT_DBG_* op
    cydriver.CUdeviceptr results
    void *host                          # NULL until loaded

# kernels/peer_reduce.ptx, loaded when an arena is first shared.
ctypedef struct PeerKernels:
    cydriver.CUmodule mod
    cydriver.CUfunction fn[1]           # metrale_peer_reduce

# kernels/copy_runs.ptx, loaded by the first copy_runs outside a capture.
ctypedef struct CopyKernels:
    cydriver.CUmodule mod
    cydriver.CUfunction fn[1]           # metrale_copy_runs

# CudaBackend.tune_rows_at and rows_at_tuning: the launch shape of
# metrale_zero_rows_at, each argument checked (None keeps its value), all or
# nothing; and the shape as the dict tune_rows_at takes.
cdef int tune_rows_at(ZeroKernels *k, object blocks_per_sm, object tile_chunks,
                      object spread, object queue) except -1
cdef dict rows_at_tuning(const ZeroKernels *k)

# With the context current; on failure nothing stays loaded.  Never inside a
# graph capture.
cdef int zero_load(ZeroKernels *k, cydriver.CUstream s) except -1     # s: zeroes the counters
cdef int debug_load(DebugKernels *k) except -1
cdef int peer_load(PeerKernels *k) except -1
cdef int copy_load(CopyKernels *k) except -1
# Best effort, from a finalizer.
cdef void unload(ZeroKernels *z, DebugKernels *d, PeerKernels *p, CopyKernels *c) noexcept nogil

# One launch of metrale_zero_ranges over n (2 .. MT_MAX_RANGES) ranges of the
# slab at `base`.
cdef int zero_ranges(const ZeroKernels *k, uintptr_t base, const mt_range *r, int n,
                     cydriver.CUstream s) except -1 nogil
# metrale_zero_rows_at over the table `a` on `sm_count` SMs, its blocks
# taking tiles from the work counter at `queue` (queue_lend; 0, or k.queue
# off: each block a fixed share): 1 when launched, 0 when the table clears
# nothing (no launch).
cdef int zero_rows_at(const ZeroKernels *k, const mt_rows_args *a, uintptr_t queue, int sm_count,
                      cydriver.CUstream s) except -1 nogil
# Lend a work counter (its device address; 0 when all are lent), and take it
# back.  Host bookkeeping only: fine during a capture, never raise.
cdef uintptr_t queue_lend(ZeroKernels *k) noexcept nogil
cdef void queue_return(ZeroKernels *k, uintptr_t q) noexcept nogil
# How many are lent, of how many (0 of 0 before zero_load).
cdef tuple queues_lent(const ZeroKernels *k)
# Check a debug call's items before anything runs: at most MT_DBG_MAX_ITEMS,
# 16-byte aligned where the kernel reads whole lanes; then clear out[0 .. n).
# Returns the item count n.
cdef int debug_check(int op, const mt_debug_args *a, mt_debug_result *out) except -1
# Debug operation `op` over the items of `a` (its grid filled in here),
# results cleared first unless FILL; debug_results waits for them and copies
# the first `n` into `out`.
cdef int debug_launch(const DebugKernels *k, int op, mt_debug_args *a,
                      cydriver.CUstream s) except -1 nogil
cdef int debug_results(const DebugKernels *k, mt_debug_result *out, int n,
                       cydriver.CUstream s) except -1 nogil
# The n runs (any number, each source and destination 16-byte aligned), in
# launches of metrale_copy_runs of up to MT_COPY_RUNS runs each, on `s`
# (copy_load first).  Returns the launches.
cdef int copy_runs(const CopyKernels *k, const mt_copy_run *runs, Py_ssize_t n,
                   cydriver.CUstream s) except -1 nogil
# One launch of metrale_peer_reduce (MT_RED_BLOCKS blocks, its grid fixed:
# every rank must lay out its barriers alike).
cdef int peer_reduce(const PeerKernels *k, const mt_reduce_args *a, cydriver.CUstream s) except -1 nogil
