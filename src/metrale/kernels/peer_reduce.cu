// The tensor-parallel all-reduce of BufferArena.peer_all_reduce: one launch
// of MT_RED_BLOCKS blocks reads the peers' live rows through their mapped
// slabs, two-shot with a barrier per block before each phase and after the
// last (peer_reduce.h has the algorithm and why it may run in place).  The
// count is read when the kernel runs, so one captured graph serves every
// batch size.  src/peer.c computes the same bits on the host.
//
// Peer memory is read with ld.global.cg (L2, never a stale L1 line from an
// earlier call), flags with acquire / release at system scope; a barrier that
// waits longer than timeout_ns stores MT_RED_TIMEOUT + the rank it waited for
// in this rank's status and the launch gives up (no hang when a peer died or
// never called).
//
// The build compiles this file to peer_reduce.ptx where nvcc is found
// (tools/kernels.py); the checked-in copy is refreshed with
// `python tools/kernels.py update`.
#include "peer_reduce.h"

__device__ __forceinline__ unsigned int mt_ld_acquire(const unsigned int *p)
{
    unsigned int v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void mt_st_release(unsigned int *p, unsigned int v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned long long mt_now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One barrier of block b with block b of every peer; false (and the status
// set) when this rank has failed before or a wait timed out now.
__device__ __forceinline__ bool mt_barrier(const mt_reduce_args &a, mt_signal *mine)
{
    __shared__ int ok;
    __syncthreads();                    // every thread's writes before the flags
    if (threadIdx.x == 0) {
        const unsigned int b = blockIdx.x;
        int good = *(volatile unsigned int *)&mine->status == 0;
        if (good) {
            const unsigned int e = mine->epoch[b] + 1;
            mine->epoch[b] = e;
            __threadfence_system();
            for (int q = 0; q < a.ranks; q++)
                if (q != a.me)
                    mt_st_release(&((mt_signal *)a.signal[q])->flags[b][a.me], e);
            for (int q = 0; q < a.ranks && good; q++) {
                if (q == a.me)
                    continue;
                const unsigned long long t0 = mt_now_ns();
                while ((int)(mt_ld_acquire(&mine->flags[b][q]) - e) < 0) {
                    if (mt_now_ns() - t0 > a.timeout_ns) {
                        atomicCAS(&mine->status, 0u, (unsigned int)(MT_RED_TIMEOUT + q));
                        good = 0;
                        break;
                    }
                }
            }
            __threadfence_system();
        }
        ok = good;
    }
    __syncthreads();
    return ok != 0;
}

__device__ __forceinline__ void mt_add16(int elem, float acc[8], uint4 v, bool first)
{
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
    if (elem == MT_EL_BF16) {
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            const float lo = mt_bf16_to_f32(w[k] & 0xFFFFu), hi = mt_bf16_to_f32(w[k] >> 16);
            acc[2 * k] = first ? lo : acc[2 * k] + lo;
            acc[2 * k + 1] = first ? hi : acc[2 * k + 1] + hi;
        }
    } else {
        #pragma unroll
        for (int k = 0; k < 4; k++)
            acc[k] = first ? __uint_as_float(w[k]) : acc[k] + __uint_as_float(w[k]);
    }
}

__device__ __forceinline__ uint4 mt_pack16(int elem, const float acc[8])
{
    unsigned int w[4];
    if (elem == MT_EL_BF16) {
        #pragma unroll
        for (int k = 0; k < 4; k++)
            w[k] = mt_f32_to_bf16(acc[2 * k]) | (mt_f32_to_bf16(acc[2 * k + 1]) << 16);
    } else {
        #pragma unroll
        for (int k = 0; k < 4; k++)
            w[k] = __float_as_uint(acc[k]);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

extern "C" __global__ void __launch_bounds__(MT_RED_THREADS)
metrale_peer_reduce(const mt_reduce_args a)
{
    __shared__ long long count;
    mt_signal *mine = (mt_signal *)a.signal[a.me];
    if (threadIdx.x == 0)
        count = a.count_at ? (long long)*(const volatile int *)a.count_at : a.count;
    __syncthreads();
    if (a.ranks > 1 && !mt_barrier(a, mine))    // 1: every rank's input is written
        return;
    const long long n = count;
    const unsigned long long first = (unsigned long long)blockIdx.x * MT_RED_THREADS + threadIdx.x;
    const unsigned long long step = (unsigned long long)gridDim.x * MT_RED_THREADS;
    unsigned long long lo, hi;
    // phase 1: part `me` of each item, summed over the ranks in rank order
    for (int i = 0; i < a.items; i++) {
        mt_red_part(mt_red_rows(a.rows[i], n) * a.row_bytes[i] / 16, a.me, a.ranks, &lo, &hi);
        uint4 *out = (uint4 *)(a.base[a.me] + a.out_off[i]);
        for (unsigned long long c = lo + first; c < hi; c += step) {
            float acc[8];
            for (int q = 0; q < a.ranks; q++)
                mt_add16(a.elem[i], acc, __ldcg((const uint4 *)(a.base[q] + a.in_off[i]) + c), q == 0);
            out[c] = mt_pack16(a.elem[i], acc);
        }
    }
    if (a.ranks == 1)
        return;
    if (!mt_barrier(a, mine))           // 2: every rank's part is written
        return;
    // phase 2: every other rank's part, from its output
    for (int q = 0; q < a.ranks; q++) {
        if (q == a.me)
            continue;
        for (int i = 0; i < a.items; i++) {
            mt_red_part(mt_red_rows(a.rows[i], n) * a.row_bytes[i] / 16, q, a.ranks, &lo, &hi);
            const uint4 *src = (const uint4 *)(a.base[q] + a.out_off[i]);
            uint4 *out = (uint4 *)(a.base[a.me] + a.out_off[i]);
            for (unsigned long long c = lo + first; c < hi; c += step)
                out[c] = __ldcg(src + c);
        }
    }
    mt_barrier(a, mine);                // 3: nobody reads this rank's memory any more
}
