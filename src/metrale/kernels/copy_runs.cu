// One launch that copies up to MT_COPY_RUNS runs of bytes, each from its own
// source to its own destination (CudaBackend.copy_runs: a refit's tensors,
// metrale.refit).  One copy call per tensor ends each copy's tail before the
// next one starts: for the 399 tensors of an 8B model that cost 1.23x one
// copy of the same bytes on an H100 (bench/RESULTS.md); one launch of many
// runs lets their blocks overlap.
//
// The host lays the grid out as metrale_zero_ranges' (zero_ranges.cu): run r
// owns blocks [first[r], first[r + 1]) and each of its blocks copies `per`
// 16-byte chunks (the last one the rest, plus length % 16 bytes), so a block
// never crosses into another run.  A block finds its run by bisection over
// `first` (128 runs: 7 steps).  Source and destination are 16-byte aligned
// (the host copies any other run with cuMemcpyAsync).
//
// The build compiles this file to copy_runs.ptx where nvcc is found
// (tools/kernels.py); the checked-in copy is refreshed with
// `python tools/kernels.py update`.
#include "copy_runs.h"

extern "C" __global__ void __launch_bounds__(256) metrale_copy_runs(const mt_copy_args a)
{
    const unsigned b = blockIdx.x;
    int lo = 0, hi = a.count;                  // first[lo] <= b < first[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (b >= a.first[mid])
            lo = mid;
        else
            hi = mid;
    }
    const unsigned long long n = a.length[lo];
    const uint4 *__restrict__ s = (const uint4 *)a.src[lo];
    uint4 *__restrict__ d = (uint4 *)a.dst[lo];
    const unsigned long long n16 = n >> 4;
    const unsigned long long start = (unsigned long long)(b - a.first[lo]) * a.per;
    const unsigned long long end = min(start + a.per, n16);
    const unsigned step = blockDim.x;
    unsigned long long i = start + threadIdx.x;
    // four loads in flight per thread before their stores
    for (; i + 3 * step < end; i += 4 * step) {
        const uint4 v0 = s[i], v1 = s[i + step], v2 = s[i + 2 * step], v3 = s[i + 3 * step];
        d[i] = v0;
        d[i + step] = v1;
        d[i + 2 * step] = v2;
        d[i + 3 * step] = v3;
    }
    for (; i < end; i += step)
        d[i] = s[i];
    if (b + 1 == a.first[lo + 1] && threadIdx.x < (n & 15)) {
        const unsigned long long t = (n16 << 4) + threadIdx.x;
        ((unsigned char *)d)[t] = ((const unsigned char *)s)[t];
    }
}
