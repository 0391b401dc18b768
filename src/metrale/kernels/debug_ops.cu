// The debug arena's kernels (docs/debug.md): each launch works on up to
// MT_DBG_MAX_ITEMS byte ranges of the slab, laid out like zero_ranges: item r
// owns blocks [first[r], first[r + 1]), each block `per` 16-byte chunks of the
// item's chunk span (chunk c covers slab offsets [16c, 16c + 16)).  A chunk
// wholly inside the item is one 16-byte access; the item's first and last
// chunks go byte by byte.  Results are per item (debug_ops.h): every block
// reduces its own, then adds them with one atomic per item, so the totals do
// not depend on the order blocks run in and match src/debug.c to the byte.
//
// metrale_debug_fill         FILL: guard bands and poison (no results)
// metrale_debug_check        CHECK: bytes that differ from the pattern
// metrale_debug_nonfinite    NONFINITE: NaN / Inf elements
// metrale_debug_fingerprint  FINGERPRINT: the word sum of mt_fp_word
//
// The build compiles this file to debug_ops.ptx where nvcc is found
// (tools/kernels.py, which also checks the PTX against the headers); the
// checked-in debug_ops.ptx, for builds without nvcc, is refreshed with
// `python tools/kernels.py update`.
#include "debug_ops.h"

#define MT_DBG_THREADS 256

// This block's item and its chunk range [lo, hi) (absolute chunk indices).
struct mt_span {
    int r;
    unsigned long long lo, hi, start, end;   // chunks; the item's byte range [start, end)
};

__device__ __forceinline__ mt_span mt_block_span(const mt_debug_args &a)
{
    mt_span s;
    int r = 0;
    while (r + 1 < a.count && blockIdx.x >= a.first[r + 1])
        r++;
    s.r = r;
    s.start = a.offset[r];
    s.end = a.offset[r] + a.length[r];
    const unsigned long long c0 = s.start >> 4, c1 = (s.end + 15) >> 4;
    s.lo = c0 + (unsigned long long)(blockIdx.x - a.first[r]) * a.per;
    s.hi = min(s.lo + a.per, c1);
    return s;
}

// The 16 pattern bytes of item r as a 16-byte word (pattern[o % 16] at offset o).
__device__ __forceinline__ uint4 mt_pattern(const mt_debug_args &a, int r)
{
    const unsigned char *p = a.pattern[r];
    uint4 v;
    v.x = p[0] | (p[1] << 8) | (p[2] << 16) | ((unsigned)p[3] << 24);
    v.y = p[4] | (p[5] << 8) | (p[6] << 16) | ((unsigned)p[7] << 24);
    v.z = p[8] | (p[9] << 8) | (p[10] << 16) | ((unsigned)p[11] << 24);
    v.w = p[12] | (p[13] << 8) | (p[14] << 16) | ((unsigned)p[15] << 24);
    return v;
}

// Block-wide sums of x and z and maximum of y; thread 0 gets the totals.
__device__ __forceinline__ void mt_block_reduce(unsigned long long &x, unsigned long long &y,
                                                unsigned long long &z)
{
    __shared__ unsigned long long sx[MT_DBG_THREADS / 32], sy[MT_DBG_THREADS / 32],
        sz[MT_DBG_THREADS / 32];
    for (int d = 16; d > 0; d >>= 1) {
        x += __shfl_down_sync(0xFFFFFFFFu, x, d);
        y = max(y, __shfl_down_sync(0xFFFFFFFFu, y, d));
        z += __shfl_down_sync(0xFFFFFFFFu, z, d);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        sx[warp] = x;
        sy[warp] = y;
        sz[warp] = z;
    }
    __syncthreads();
    if (warp == 0) {
        x = lane < MT_DBG_THREADS / 32 ? sx[lane] : 0;
        y = lane < MT_DBG_THREADS / 32 ? sy[lane] : 0;
        z = lane < MT_DBG_THREADS / 32 ? sz[lane] : 0;
        for (int d = 4; d > 0; d >>= 1) {
            x += __shfl_down_sync(0xFFFFFFFFu, x, d);
            y = max(y, __shfl_down_sync(0xFFFFFFFFu, y, d));
            z += __shfl_down_sync(0xFFFFFFFFu, z, d);
        }
    }
}

extern "C" __global__ void __launch_bounds__(MT_DBG_THREADS) metrale_debug_fill(const mt_debug_args a)
{
    const mt_span s = mt_block_span(a);
    const uint4 pat = mt_pattern(a, s.r);
    unsigned char *base = (unsigned char *)a.base;
    for (unsigned long long c = s.lo + threadIdx.x; c < s.hi; c += MT_DBG_THREADS) {
        const unsigned long long o = c << 4;
        if (o >= s.start && o + 16 <= s.end) {
            *(uint4 *)(base + o) = pat;
        } else {
            for (int k = 0; k < 16; k++)
                if (o + k >= s.start && o + k < s.end)
                    base[o + k] = a.pattern[s.r][k];
        }
    }
}

extern "C" __global__ void __launch_bounds__(MT_DBG_THREADS) metrale_debug_check(const mt_debug_args a)
{
    const mt_span s = mt_block_span(a);
    const uint4 pat = mt_pattern(a, s.r);
    const unsigned char *base = (const unsigned char *)a.base;
    unsigned long long bad = 0, first_inv = 0, unused = 0;
    for (unsigned long long c = s.lo + threadIdx.x; c < s.hi; c += MT_DBG_THREADS) {
        const unsigned long long o = c << 4;
        const bool whole = o >= s.start && o + 16 <= s.end;
        if (whole) {
            const uint4 v = *(const uint4 *)(base + o);
            if (v.x == pat.x && v.y == pat.y && v.z == pat.z && v.w == pat.w)
                continue;
        }
        for (int k = 0; k < 16; k++) {
            if (o + k < s.start || o + k >= s.end || base[o + k] == a.pattern[s.r][k])
                continue;
            first_inv = max(first_inv, ~(o + k - s.start));
            bad++;
        }
    }
    mt_block_reduce(bad, first_inv, unused);
    if (threadIdx.x == 0 && bad) {
        mt_debug_result *res = (mt_debug_result *)a.results + s.r;
        atomicAdd(&res->count, bad);
        atomicMax(&res->first_inv, first_inv);
    }
}

extern "C" __global__ void __launch_bounds__(MT_DBG_THREADS) metrale_debug_nonfinite(const mt_debug_args a)
{
    const mt_span s = mt_block_span(a);
    const int elem = a.elem[s.r], es = mt_el_size(elem);
    const unsigned char *base = (const unsigned char *)a.base;
    unsigned long long nan = 0, first_inv = 0, inf = 0;
    for (unsigned long long c = s.lo + threadIdx.x; c < s.hi; c += MT_DBG_THREADS) {
        const unsigned long long o = c << 4;     // items start at a buffer: 256-aligned
        unsigned int w[4];
        if (o + 16 <= s.end) {
            const uint4 v = *(const uint4 *)(base + o);
            w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
        } else {
            w[0] = w[1] = w[2] = w[3] = 0;
            for (int k = 0; k < 16 && o + k < s.end; k++)
                w[k >> 2] |= (unsigned)base[o + k] << (8 * (k & 3));
        }
        for (int k = 0; k < 16; k += es) {
            if (o + k + es > s.end)
                break;
            unsigned int bits = w[k >> 2];
            if (es == 2)
                bits = (bits >> (8 * (k & 3))) & 0xFFFFu;
            else if (es == 1)
                bits = (bits >> (8 * (k & 3))) & 0xFFu;
            const int cls = mt_el_class(elem, bits);
            if (cls == 0)
                continue;
            first_inv = max(first_inv, ~(o + k - s.start));
            if (cls == 1)
                nan++;
            else
                inf++;
        }
    }
    mt_block_reduce(nan, first_inv, inf);
    if (threadIdx.x == 0 && (nan | inf)) {
        mt_debug_result *res = (mt_debug_result *)a.results + s.r;
        atomicAdd(&res->count, nan);
        atomicAdd(&res->extra, inf);
        atomicMax(&res->first_inv, first_inv);
    }
}

// The fingerprint terms of the two 8-byte words of 16-byte chunk v, whose
// first word is word i of the item.
__device__ __forceinline__ unsigned long long mt_fp_chunk(uint4 v, unsigned long long i)
{
    const unsigned long long w0 = v.x | ((unsigned long long)v.y << 32);
    const unsigned long long w1 = v.z | ((unsigned long long)v.w << 32);
    return mt_fp_word(w0, i) + mt_fp_word(w1, i + 1);
}

extern "C" __global__ void __launch_bounds__(MT_DBG_THREADS) metrale_debug_fingerprint(const mt_debug_args a)
{
    const mt_span s = mt_block_span(a);
    const unsigned char *base = (const unsigned char *)a.base;
    const unsigned long long c0 = s.start >> 4;
    // The chunks wholly inside the item, four loads in flight per thread.
    const unsigned long long full = min(s.hi, s.end >> 4);
    unsigned long long sum = 0, unused_y = 0, unused_z = 0;
    unsigned long long c = s.lo + threadIdx.x;
    for (; c + 3 * MT_DBG_THREADS < full; c += 4 * MT_DBG_THREADS) {
        const uint4 v0 = __ldcs((const uint4 *)(base + (c << 4)));
        const uint4 v1 = __ldcs((const uint4 *)(base + ((c + MT_DBG_THREADS) << 4)));
        const uint4 v2 = __ldcs((const uint4 *)(base + ((c + 2 * MT_DBG_THREADS) << 4)));
        const uint4 v3 = __ldcs((const uint4 *)(base + ((c + 3 * MT_DBG_THREADS) << 4)));
        sum += mt_fp_chunk(v0, 2 * (c - c0));
        sum += mt_fp_chunk(v1, 2 * (c + MT_DBG_THREADS - c0));
        sum += mt_fp_chunk(v2, 2 * (c + 2 * MT_DBG_THREADS - c0));
        sum += mt_fp_chunk(v3, 2 * (c + 3 * MT_DBG_THREADS - c0));
    }
    for (; c < s.hi; c += MT_DBG_THREADS) {
        const unsigned long long o = c << 4;
        if (o + 16 <= s.end) {
            sum += mt_fp_chunk(__ldcs((const uint4 *)(base + o)), 2 * (c - c0));
        } else {   // the item's last chunk: its words zero past the end
            unsigned long long w[2] = {0, 0};
            for (int k = 0; k < 16 && o + k < s.end; k++)
                w[k >> 3] |= (unsigned long long)base[o + k] << (8 * (k & 7));
            sum += mt_fp_word(w[0], 2 * (c - c0));
            if (o + 8 < s.end)
                sum += mt_fp_word(w[1], 2 * (c - c0) + 1);
        }
    }
    mt_block_reduce(sum, unused_y, unused_z);
    if (threadIdx.x == 0)
        atomicAdd(&((mt_debug_result *)a.results + s.r)->count, sum);
}
