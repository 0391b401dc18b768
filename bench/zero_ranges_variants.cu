// Candidate kernels for zero_all_rows, timed by bench/tune_zero_ranges.py.
// Ranges by value, as src/metrale/kernels/zero_ranges.cu; the host-laid
// variants (hb_*) take its parameter block, mt_zero_args, from its header.
#include "metrale/kernels/zero_ranges.h"

// The first kernels' parameter block: no per-block layout.
struct mt_zero_args0 {
    unsigned long long base;
    unsigned long long offset[MT_MAX_RANGES];
    unsigned long long length[MT_MAX_RANGES];
    int count;
};

// v0: the first shipped kernel: every range strided over the whole grid.
extern "C" __global__ void v0_stride(const mt_zero_args0 a)
{
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (int r = 0; r < a.count; r++) {
        unsigned char *p = (unsigned char *)(a.base + a.offset[r]);
        const unsigned long long n = a.length[r];
        const unsigned long long vec = n / 16;
        uint4 *q = (uint4 *)p;
        for (unsigned long long i = tid; i < vec; i += stride)
            q[i] = make_uint4(0, 0, 0, 0);
        const unsigned long long tail = n - vec * 16;
        if (tid < tail)
            p[vec * 16 + tid] = 0;
    }
}

template <int CS>
__device__ __forceinline__ void put0(uint4 *q)
{
    if (CS)
        __stcs(q, make_uint4(0, 0, 0, 0));
    else
        *q = make_uint4(0, 0, 0, 0);
}

// Block-contiguous: the 16-byte chunks of all ranges form one index space,
// split evenly into gridDim.x spans; block b clears span b with its threads
// striding by blockDim.x, U stores in flight per thread.  Block 0 also clears
// the sub-16-byte tails.
template <int U, int CS>
__device__ __forceinline__ void block_body(const mt_zero_args0 &a)
{
    unsigned long long total = 0;
    for (int r = 0; r < a.count; r++)
        total += a.length[r] >> 4;
    const unsigned long long per = (total + gridDim.x - 1) / gridDim.x;
    const unsigned long long lo = blockIdx.x * per;
    const unsigned long long hi = min(lo + per, total);
    unsigned long long acc = 0;
    for (int r = 0; r < a.count && acc < hi; r++) {
        const unsigned long long n16 = a.length[r] >> 4;
        if (lo < acc + n16) {
            uint4 *q = (uint4 *)(a.base + a.offset[r]);
            const unsigned long long s = (lo > acc ? lo - acc : 0);
            const unsigned long long e = min(hi, acc + n16) - acc;
            unsigned long long i = s + threadIdx.x;
            const unsigned long long step = blockDim.x;
            for (; i + (U - 1) * step < e; i += U * step) {
#pragma unroll
                for (int u = 0; u < U; u++)
                    put0<CS>(q + i + u * step);
            }
            for (; i < e; i += step)
                put0<CS>(q + i);
        }
        acc += n16;
    }
    if (blockIdx.x == 0) {
        for (int r = 0; r < a.count; r++) {
            const unsigned long long n = a.length[r];
            const unsigned long long t = n & 15;
            if (threadIdx.x < t)
                ((unsigned char *)(a.base + a.offset[r]))[(n & ~15ull) + threadIdx.x] = 0;
        }
    }
}

extern "C" __global__ void blk_u1(const mt_zero_args0 a) { block_body<1, 0>(a); }
extern "C" __global__ void blk_u2(const mt_zero_args0 a) { block_body<2, 0>(a); }
extern "C" __global__ void blk_u4(const mt_zero_args0 a) { block_body<4, 0>(a); }
extern "C" __global__ void blk_u8(const mt_zero_args0 a) { block_body<8, 0>(a); }
extern "C" __global__ void blk_u4_cs(const mt_zero_args0 a) { block_body<4, 1>(a); }

// Flat grid-stride: thread t clears chunks t, t + stride, ... of the joint
// index space, so a range's first chunk goes to the thread after the previous
// range's last (balanced however the bytes split across ranges).
template <int U>
__device__ __forceinline__ void flat_body(const mt_zero_args0 &a)
{
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long acc = 0;
    for (int r = 0; r < a.count; r++) {
        const unsigned long long n16 = a.length[r] >> 4;
        uint4 *q = (uint4 *)(a.base + a.offset[r]);
        // first i >= 0 with (acc + i) % stride == tid
        const unsigned long long m = acc % stride;
        unsigned long long i = tid >= m ? tid - m : tid + stride - m;
        for (; i + (U - 1) * stride < n16; i += U * stride) {
#pragma unroll
            for (int u = 0; u < U; u++)
                q[i + u * stride] = make_uint4(0, 0, 0, 0);
        }
        for (; i < n16; i += stride)
            q[i] = make_uint4(0, 0, 0, 0);
        acc += n16;
        const unsigned long long t = a.length[r] & 15;
        if (tid < t)
            ((unsigned char *)q)[(n16 << 4) + tid] = 0;
    }
}

extern "C" __global__ void flat_u1(const mt_zero_args0 a) { flat_body<1>(a); }
extern "C" __global__ void flat_u4(const mt_zero_args0 a) { flat_body<4>(a); }

// 32 bytes per thread per step: two adjacent 16-byte stores (a whole sector).
__device__ __forceinline__ void blk32_body(const mt_zero_args0 &a)
{
    unsigned long long total = 0;
    for (int r = 0; r < a.count; r++)
        total += a.length[r] >> 5;
    const unsigned long long per = (total + gridDim.x - 1) / gridDim.x;
    const unsigned long long lo = blockIdx.x * per;
    const unsigned long long hi = min(lo + per, total);
    unsigned long long acc = 0;
    for (int r = 0; r < a.count && acc < hi; r++) {
        const unsigned long long n32 = a.length[r] >> 5;
        if (lo < acc + n32) {
            uint4 *q = (uint4 *)(a.base + a.offset[r]);
            const unsigned long long s = (lo > acc ? lo - acc : 0);
            const unsigned long long e = min(hi, acc + n32) - acc;
            for (unsigned long long i = s + threadIdx.x; i < e; i += blockDim.x) {
                q[2 * i] = make_uint4(0, 0, 0, 0);
                q[2 * i + 1] = make_uint4(0, 0, 0, 0);
            }
        }
        acc += n32;
    }
    if (blockIdx.x == 0) {
        for (int r = 0; r < a.count; r++) {
            const unsigned long long n = a.length[r];
            const unsigned long long t = n & 31;
            if (threadIdx.x < t)
                ((unsigned char *)(a.base + a.offset[r]))[(n & ~31ull) + threadIdx.x] = 0;
        }
    }
}

extern "C" __global__ void blk32(const mt_zero_args0 a) { blk32_body(a); }

// Hopper bulk stores: each block zeroes S bytes of shared memory once and
// the tensor-memory-access unit copies them out in pieces of up to S bytes.
template <int S>
__device__ __forceinline__ void tma_body(const mt_zero_args0 &a)
{
#if __CUDA_ARCH__ >= 900
    __shared__ __align__(128) uint4 zs[S / 16];
    for (int i = threadIdx.x; i < S / 16; i += blockDim.x)
        zs[i] = make_uint4(0, 0, 0, 0);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const unsigned smem = (unsigned)__cvta_generic_to_shared(zs);
    const unsigned long long P = S / 16;        // chunks per piece
    unsigned long long gp = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long first = 0;               // global index of range r's first piece
    int r = 0;
    unsigned issued = 0;
    while (r < a.count) {
        const unsigned long long n16 = a.length[r] >> 4;
        const unsigned long long np = (n16 + P - 1) / P;
        if (gp >= first + np) {
            first += np;
            r++;
            continue;
        }
        const unsigned long long k = gp - first;
        const unsigned bytes = (unsigned)(min(P, n16 - k * P) * 16);
        const unsigned long long dst = a.base + a.offset[r] + k * P * 16;
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                     :: "l"(dst), "r"(smem), "r"(bytes) : "memory");
        issued++;
        gp += step;
    }
    if (issued) {
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
    if (blockIdx.x == 0) {
        for (int q = 0; q < a.count; q++) {
            const unsigned long long n = a.length[q];
            const unsigned long long t = n & 15;
            if (threadIdx.x < t)
                ((unsigned char *)(a.base + a.offset[q]))[(n & ~15ull) + threadIdx.x] = 0;
        }
    }
#endif
}

extern "C" __global__ void tma_8k(const mt_zero_args0 a) { tma_body<8192>(a); }
extern "C" __global__ void tma_16k(const mt_zero_args0 a) { tma_body<16384>(a); }
extern "C" __global__ void tma_32k(const mt_zero_args0 a) { tma_body<32768>(a); }

// Range-blocks: no block spans two ranges.  Range r gets ceil(chunks_r / per)
// blocks of its own (the host passes `per` and launches the sum), so a block
// never walks from one page region into another.
struct mt_zero_args2 {
    unsigned long long base;
    unsigned long long offset[MT_MAX_RANGES];
    unsigned long long length[MT_MAX_RANGES];
    unsigned long long per;
    int count;
};

template <int U>
__device__ __forceinline__ void rb_body(const mt_zero_args2 &a)
{
    unsigned long long first = 0;
    int r = 0;
    unsigned long long n16 = 0, nb = 0;
    for (; r < a.count; r++) {
        n16 = a.length[r] >> 4;
        nb = (n16 + a.per - 1) / a.per;
        if (blockIdx.x < first + nb)
            break;
        first += nb;
    }
    if (r == a.count)
        return;
    const unsigned long long k = blockIdx.x - first;
    uint4 *q = (uint4 *)(a.base + a.offset[r]);
    const unsigned long long e = min((k + 1) * a.per, n16);
    unsigned long long i = k * a.per + threadIdx.x;
    const unsigned long long step = blockDim.x;
    for (; i + (U - 1) * step < e; i += U * step) {
#pragma unroll
        for (int u = 0; u < U; u++)
            q[i + u * step] = make_uint4(0, 0, 0, 0);
    }
    for (; i < e; i += step)
        q[i] = make_uint4(0, 0, 0, 0);
    const unsigned long long t = a.length[r] & 15;
    if (k == nb - 1 && threadIdx.x < t)
        ((unsigned char *)q)[(n16 << 4) + threadIdx.x] = 0;
    // a range shorter than 16 bytes has no block of its own above: block 0 takes it
    if (blockIdx.x == 0)
        for (int j = 0; j < a.count; j++)
            if (a.length[j] < 16 && threadIdx.x < a.length[j])
                ((unsigned char *)(a.base + a.offset[j]))[threadIdx.x] = 0;
}

extern "C" __global__ void rb_u1(const mt_zero_args2 a) { rb_body<1>(a); }
extern "C" __global__ void rb_u4(const mt_zero_args2 a) { rb_body<4>(a); }

// Host-blocks: the host lays the blocks out (range r owns blocks
// [first[r], first[r+1]) and each block `per` 16-byte chunks of it), so the
// kernel's prologue is a scan of compares, no 64-bit division.  The shipped
// kernel's parameter block (zero_ranges.h).

template <int U>
__device__ __forceinline__ void hb_body(const mt_zero_args &a)
{
    int r = 0;
    while (r + 1 < a.count && blockIdx.x >= a.first[r + 1])
        r++;
    const unsigned k = blockIdx.x - a.first[r];
    const unsigned long long n = a.length[r];
    const unsigned long long n16 = n >> 4;
    uint4 *q = (uint4 *)(a.base + a.offset[r]);
    const unsigned long long lo = (unsigned long long)k * a.per;
    const unsigned long long e = min(lo + a.per, n16);
    unsigned long long i = lo + threadIdx.x;
    for (; i + (U - 1) * blockDim.x < e; i += U * blockDim.x) {
#pragma unroll
        for (int u = 0; u < U; u++)
            q[i + u * blockDim.x] = make_uint4(0, 0, 0, 0);
    }
    for (; i < e; i += blockDim.x)
        q[i] = make_uint4(0, 0, 0, 0);
    // the last block of a range also clears its last (length % 16) bytes
    if (blockIdx.x + 1 == a.first[r + 1] && threadIdx.x < (n & 15))
        ((unsigned char *)q)[(n16 << 4) + threadIdx.x] = 0;
}

extern "C" __global__ void hb_u1(const mt_zero_args a) { hb_body<1>(a); }
extern "C" __global__ void hb_u2(const mt_zero_args a) { hb_body<2>(a); }
extern "C" __global__ void hb_u4(const mt_zero_args a) { hb_body<4>(a); }

// Keeps the stream busy while the host issues the timed work, so the events
// around it measure GPU time only, not the host's issue latency.
extern "C" __global__ void spin(long long cycles)
{
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}
