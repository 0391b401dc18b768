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
// Build the shipped PTX with (from the repository root):
//   nvcc -ptx -arch=compute_75 -I src src/metrale/kernels/zero_ranges.cu -o src/metrale/kernels/zero_ranges.ptx
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
    if (threadIdx.x < hi - b && b + threadIdx.x >= a) p[b + threadIdx.x] = 0;
    uint4 *q = (uint4 *)(p + a);
    const unsigned long long n16 = (b - a) >> 4;
    const unsigned step = blockDim.x;
    unsigned long long i = threadIdx.x;
    for (; i + step < n16; i += 2 * step) {
        q[i] = make_uint4(0, 0, 0, 0);
        q[i + step] = make_uint4(0, 0, 0, 0);
    }
    if (i < n16)
        q[i] = make_uint4(0, 0, 0, 0);
}

// zero_all_rows with the token count read here, when the kernel runs, from
// the int32 at a.count_at: the grid is fixed at capture, so one CUDA graph
// serves every batch size.  Every block evaluates the table (mt_rows_segment,
// the rule the host uses too), cuts the live ranges into tiles of `per`
// 16-byte chunks and takes tiles blockIdx.x, blockIdx.x + gridDim.x, ...: the
// tiles of every range are spread over all blocks, so a grid of a few blocks
// per SM balances whatever the count.
extern "C" __global__ void metrale_zero_rows_at(const mt_rows_args a)
{
    __shared__ unsigned long long start[MT_MAX_ROWS_ENTRIES], end[MT_MAX_ROWS_ENTRIES];
    __shared__ unsigned long long first[MT_MAX_ROWS_ENTRIES + 1];
    const unsigned long long t = mt_rows_count(&a, *(const volatile int *)a.count_at);
    const unsigned long long tile = (unsigned long long)a.per << 4;
    if (threadIdx.x < (unsigned)a.n)
        mt_rows_segment(&a, threadIdx.x, t, &start[threadIdx.x], &end[threadIdx.x]);
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long f = 0;
        for (int r = 0; r < a.n; r++) {
            first[r] = f;
            f += (end[r] - start[r] + tile - 1) / tile;
        }
        first[a.n] = f;
    }
    __syncthreads();
    int r = 0;
    for (unsigned long long g = blockIdx.x; g < first[a.n]; g += gridDim.x) {
        while (g >= first[r + 1])
            r++;
        const unsigned long long lo = start[r] + (g - first[r]) * tile;
        clear_bytes(a.base, lo, min(lo + tile, end[r]));
    }
}
