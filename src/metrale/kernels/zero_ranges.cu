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

// Block b's share of a mt_zero_args launch.  Head: a range may start off a
// 16-byte boundary (metrale_zero_rows_at's, where the count's bytes cut a
// buffer), its first block clearing the bytes up to it one by one; without,
// every range starts at a 256-byte aligned buffer offset.
template <bool Head>
__device__ __forceinline__ void zero_range_block(const mt_zero_args &a, unsigned b)
{
    int r = 0;
    while (r + 1 < a.count && b >= a.first[r + 1])
        r++;
    unsigned long long n = a.length[r];
    unsigned char *p = (unsigned char *)(a.base + a.offset[r]);
    if (Head) {
        const unsigned long long head = min((16 - ((unsigned long long)p & 15)) & 15, n);
        if (b == a.first[r] && threadIdx.x < head)
            p[threadIdx.x] = 0;
        p += head;
        n -= head;
    }
    const unsigned long long n16 = n >> 4;
    uint4 *q = (uint4 *)p;
    const unsigned long long lo = (unsigned long long)(b - a.first[r]) * a.per;
    const unsigned long long end = min(lo + a.per, n16);
    const unsigned step = blockDim.x;
    unsigned long long i = lo + threadIdx.x;
    // per = 2 x blockDim.x for metrale_zero_ranges (two stores in flight per
    // thread, one pass); metrale_zero_rows_at's 512-thread blocks store once
    for (; i + step < end; i += 2 * step) {
        q[i] = make_uint4(0, 0, 0, 0);
        q[i + step] = make_uint4(0, 0, 0, 0);
    }
    if (i < end)
        q[i] = make_uint4(0, 0, 0, 0);
    if (b + 1 == a.first[r + 1] && threadIdx.x < (n & 15))
        p[(n16 << 4) + threadIdx.x] = 0;
}

extern "C" __global__ void metrale_zero_ranges(const mt_zero_args a)
{
    zero_range_block<false>(a, blockIdx.x);
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
// serves every batch size.  Two kinds of blocks (mt_rows_launch): those past
// the first `rows_blocks` each clear one tile of the bytes every count clears,
// laid out by the host, without reading the count; the first `rows_blocks`
// clear what the count adds.  Their first warp reads the count and evaluates
// the table (lane i entry i, with mt_rows_segment, the rule the host uses
// too), sizes the tiles from the bytes it found (at least `per` 16-byte
// chunks, at most 64 KiB, about `spread` tiles a block) and numbers them
// with a warp scan; then each block takes tiles from the queue, asking for
// the next one before it clears the current one: a block that ends early
// takes more, so they end together whatever the count (a fixed share per
// block ended 6-13 % after the host count's launch on the H200; these
// blocks come first, so that they are dispatched beside the fixed tiles'
// blocks: bench/RESULTS.md).  No division anywhere: at a few microseconds a
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

// This block's tile after `g` (first: ~0): the queue's next, else every
// rows_blocks-th from its own index.
__device__ __forceinline__ unsigned long long next_item(const mt_rows_launch &L, unsigned long long g)
{
    if (L.queue)
        return atomicAdd((unsigned *)L.queue, 1u);
    return g == ~0ULL ? blockIdx.x : g + L.rows_blocks;
}

// 512 threads a block, and registers for 4 of them an SM: the blocks of what
// every count clears fill an SM as metrale_zero_ranges' do.
extern "C" __global__ void __launch_bounds__(512, 4) metrale_zero_rows_at(const mt_rows_launch L)
{
    const mt_rows_args &a = L.a;
    unsigned long long s;
    int r = 0;
    if (blockIdx.x >= L.rows_blocks) {            // a share of what every count clears
        zero_range_block<true>(L.fixed, blockIdx.x - L.rows_blocks);
        return;
    }
    __shared__ unsigned long long start[MT_MAX_ROWS_ENTRIES], end[MT_MAX_ROWS_ENTRIES];
    __shared__ unsigned long long first[MT_MAX_ROWS_ENTRIES + 1];
    __shared__ unsigned long long next[2];
    __shared__ unsigned tile_shift;
    unsigned long long ahead = 0;
    if (threadIdx.x == 0)
        ahead = next_item(L, ~0ULL);
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        unsigned long long lo = 0, hi = 0;
        if (lane < a.n) {                         // what the count adds: [end(0), end(t))
            const unsigned long long t = mt_rows_count(&a, *(const volatile int *)a.count_at);
            mt_rows_segment(&a, lane, 0, &s, &lo);
            mt_rows_segment(&a, lane, t, &s, &hi);
        }
        // its bytes, in every lane: the tile is a power of two between
        // per * 16 and 64 KiB near total / (spread * rows_blocks)
        const unsigned long long total = __shfl_sync(0xffffffffu, warp_inclusive_sum(hi - lo, lane), 31);
        const unsigned long long want = total / ((unsigned long long)a.spread * L.rows_blocks);
        unsigned shift = 4 + __ffs(a.per) - 1;
        while (shift < 16 && (1ULL << shift) < want)
            shift++;
        const unsigned long long tiles = warp_inclusive_sum((hi - lo + (1ULL << shift) - 1) >> shift, lane);
        if (lane < a.n) {
            start[lane] = lo;
            end[lane] = hi;
            first[lane + 1] = tiles;
        }
        if (lane == 0) {
            first[0] = 0;
            tile_shift = shift;
            next[0] = ahead;
        }
    }
    __syncthreads();
    const unsigned shift = tile_shift;
    const unsigned long long count = first[a.n];
    // next[cur] is read after the barrier that published it; thread 0 writes
    // the other one, which every thread read before the last barrier.
    for (int cur = 0;; cur ^= 1) {
        const unsigned long long g = next[cur];
        if (g >= count)
            break;
        if (threadIdx.x == 0)
            ahead = next_item(L, g);              // asked for now, waited for below
        for (r = 0; g >= first[r + 1]; r++) {}
        s = start[r] + ((g - first[r]) << shift);
        clear_bytes(a.base, s, min(s + (1ULL << shift), end[r]));
        if (threadIdx.x == 0)
            next[cur ^ 1] = ahead;
        __syncthreads();
    }
    if (L.queue && threadIdx.x == 0 &&
        atomicAdd((unsigned *)L.queue + 1, 1u) == L.rows_blocks - 1) {   // the last one out
        atomicExch((unsigned *)L.queue, 0u);
        atomicExch((unsigned *)L.queue + 1, 0u);
    }
}
