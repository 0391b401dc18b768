// One launch that zeroes up to MT_MAX_RANGES byte ranges of the arena slab (zero_all_rows).
//
// The host lays the grid out: range r owns blocks [first[r], first[r + 1]) and
// each of its blocks clears `per` 16-byte chunks of it (the last one the rest,
// plus the range's final length % 16 bytes).  So a block never crosses into
// another range and the kernel's prologue is a few compares, no division:
// at a few microseconds a launch, a 64-bit division per range cost more than
// the stores (bench/tune_zero_ranges.py, bench/RESULTS.md).  Many small blocks
// let the hardware scheduler balance the load, which a fixed grid-stride split
// cannot when some ranges sit on cold pages.
//
// The parameters travel by value, so a captured CUDA graph replays exactly the
// ranges of the call that was captured.
// The build compiles this file to zero_ranges.ptx where nvcc is found
// (tools/kernels.py, which also checks the PTX against the headers); the
// checked-in zero_ranges.ptx, for builds without nvcc, is refreshed with
// `python tools/kernels.py update`.
#include "zero_ranges.h"

extern "C" __global__ void metrale_zero_ranges(const mt_zero_args a)
{
    int r = 0;
    while (r + 1 < a.count && blockIdx.x >= a.first[r + 1])
        r++;
    const unsigned long long n = a.length[r];
    const unsigned long long n16 = n >> 4;
    // Every range starts at a 256-byte aligned buffer offset: 16-byte stores.
    uint4 *q = (uint4 *)(a.base + a.offset[r]);
    const unsigned long long lo = (unsigned long long)(blockIdx.x - a.first[r]) * a.per;
    const unsigned long long end = min(lo + a.per, n16);
    const unsigned step = blockDim.x;
    unsigned long long i = lo + threadIdx.x;
    // two stores in flight per thread (per = 2 x blockDim.x: one pass)
    for (; i + step < end; i += 2 * step) {
        q[i] = make_uint4(0, 0, 0, 0);
        q[i + step] = make_uint4(0, 0, 0, 0);
    }
    if (i < end)
        q[i] = make_uint4(0, 0, 0, 0);
    if (blockIdx.x + 1 == a.first[r + 1] && threadIdx.x < (n & 15))
        ((unsigned char *)q)[(n16 << 4) + threadIdx.x] = 0;
}

// Clear bytes [lo, hi) of the slab with the whole block: 16-byte stores over
// the aligned middle, single bytes at the ends (a range may start or end
// unaligned where it meets a hole).
__device__ __forceinline__ void clear_bytes(unsigned long long base, unsigned long long lo,
                                            unsigned long long hi)
{
    unsigned long long a = (lo + 15) & ~15ULL, b = hi & ~15ULL;
    if (a > b) a = b = hi;                        // under 16 bytes: all single bytes
    unsigned char *p = (unsigned char *)base;
    if (threadIdx.x < a - lo) p[lo + threadIdx.x] = 0;
    if (threadIdx.x < hi - b) p[b + threadIdx.x] = 0;     // b >= a: no byte twice
    uint4 *q = (uint4 *)(p + a);
    const unsigned long long n16 = (b - a) >> 4;
    const unsigned step = blockDim.x;
    unsigned long long i = threadIdx.x;
    for (; i + 3 * step < n16; i += 4 * step) {          // four stores in flight
        q[i] = make_uint4(0, 0, 0, 0);
        q[i + step] = make_uint4(0, 0, 0, 0);
        q[i + 2 * step] = make_uint4(0, 0, 0, 0);
        q[i + 3 * step] = make_uint4(0, 0, 0, 0);
    }
    for (; i < n16; i += step)
        q[i] = make_uint4(0, 0, 0, 0);
}

// zero_all_rows with the token count read here, when the kernel runs, from
// the int32 at a.count_at: the grid is fixed at capture, so one CUDA graph
// serves every batch size.  The first warp evaluates the table (lane i entry
// i, with mt_rows_segment, the rule the host uses too), sizes the tiles from
// the bytes it found (at least `per` 16-byte chunks, at most 64 KiB, about
// `spread` tiles a block: few tiles of a small count balance badly, many small
// tiles of a large one cost more than their stores) and numbers them with a
// warp scan; then block b takes tiles b, b + gridDim.x, ...: every range is
// spread over all blocks.  No division anywhere: at a few microseconds a
// launch, 64-bit divisions cost more than the stores of a small count.
static_assert(MT_MAX_ROWS_ENTRIES < 32, "one warp evaluates the table");

__device__ __forceinline__ unsigned long long warp_inclusive_sum(unsigned long long v, int lane)
{
    for (int d = 1; d < 32; d <<= 1) {
        const unsigned long long y = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d)
            v += y;
    }
    return v;
}

extern "C" __global__ void metrale_zero_rows_at(const mt_rows_args a)
{
    __shared__ unsigned long long start[MT_MAX_ROWS_ENTRIES], end[MT_MAX_ROWS_ENTRIES];
    __shared__ unsigned long long first[MT_MAX_ROWS_ENTRIES + 1];
    __shared__ unsigned tile_shift;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        unsigned long long s = 0, e = 0;
        if (lane < a.n) {
            const unsigned long long t = mt_rows_count(&a, *(const volatile int *)a.count_at);
            mt_rows_segment(&a, lane, t, &s, &e);
        }
        // bytes of the whole launch, in every lane: the tile is a power of two
        // between per * 16 and 64 KiB near total / (spread * gridDim.x)
        const unsigned long long total = __shfl_sync(0xffffffffu, warp_inclusive_sum(e - s, lane), 31);
        const unsigned long long want = total / ((unsigned long long)a.spread * gridDim.x);
        unsigned shift = 4 + __ffs(a.per) - 1;
        while (shift < 16 && (1ULL << shift) < want)
            shift++;
        const unsigned long long tiles = warp_inclusive_sum((e - s + (1ULL << shift) - 1) >> shift, lane);
        if (lane < a.n) {
            start[lane] = s;
            end[lane] = e;
            first[lane + 1] = tiles;
        }
        if (lane == 0) {
            first[0] = 0;
            tile_shift = shift;
        }
    }
    __syncthreads();
    const unsigned shift = tile_shift;
    const unsigned long long count = first[a.n];
    int r = 0;
    for (unsigned long long g = blockIdx.x; g < count; g += gridDim.x) {
        while (g >= first[r + 1])
            r++;
        const unsigned long long lo = start[r] + ((g - first[r]) << shift);
        clear_bytes(a.base, lo, min(lo + (1ULL << shift), end[r]));
    }
}
