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
