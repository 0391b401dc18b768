/* metrale C core: the tensor-parallel all-reduce on the host.  See peer.h
 * and kernels/peer_reduce.h for the algorithm; this is the kernel with one
 * block of one thread. */
#define _POSIX_C_SOURCE 200809L
#include "peer.h"

#include <sched.h>
#include <string.h>
#include <time.h>

static unsigned long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

/* One barrier with every peer (block 0); 0 when this rank has failed before
 * or a wait timed out now (the status set). */
static int barrier(const mt_reduce_args *a, mt_signal *mine)
{
    if (__atomic_load_n(&mine->status, __ATOMIC_ACQUIRE))
        return 0;
    unsigned int e = mine->epoch[0] + 1;
    mine->epoch[0] = e;
    for (int q = 0; q < a->ranks; q++)
        if (q != a->me)
            __atomic_store_n(&((mt_signal *)(uintptr_t)a->signal[q])->flags[0][a->me], e,
                             __ATOMIC_RELEASE);
    for (int q = 0; q < a->ranks; q++) {
        if (q == a->me)
            continue;
        unsigned long long t0 = now_ns();
        while ((int)(__atomic_load_n(&mine->flags[0][q], __ATOMIC_ACQUIRE) - e) < 0) {
            if (now_ns() - t0 > a->timeout_ns) {
                unsigned int zero = 0;
                __atomic_compare_exchange_n(&mine->status, &zero, MT_RED_TIMEOUT + q, 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
                return 0;
            }
            sched_yield();      /* the peer may need this core */
        }
    }
    return 1;
}

/* Sum the 16-byte chunk c of item i over every rank's input into `out`. */
static void sum16(const mt_reduce_args *a, int i, unsigned long long c, unsigned char *out)
{
    float acc[8];
    unsigned int w[4];
    for (int q = 0; q < a->ranks; q++) {
        memcpy(w, (const unsigned char *)(uintptr_t)(a->base[q] + a->in_off[i]) + 16 * c, 16);
        for (int k = 0; k < 4; k++) {
            if (a->elem[i] == MT_EL_BF16) {
                float lo = mt_bf16_to_f32(w[k] & 0xFFFFu), hi = mt_bf16_to_f32(w[k] >> 16);
                acc[2 * k] = q ? acc[2 * k] + lo : lo;
                acc[2 * k + 1] = q ? acc[2 * k + 1] + hi : hi;
            } else {
                float f;
                memcpy(&f, &w[k], 4);
                acc[k] = q ? acc[k] + f : f;
            }
        }
    }
    for (int k = 0; k < 4; k++) {
        if (a->elem[i] == MT_EL_BF16)
            w[k] = mt_f32_to_bf16(acc[2 * k]) | (mt_f32_to_bf16(acc[2 * k + 1]) << 16);
        else
            memcpy(&w[k], &acc[k], 4);
    }
    memcpy(out, w, 16);
}

unsigned int mt_peer_reduce_host(const mt_reduce_args *a)
{
    mt_signal *mine = (mt_signal *)(uintptr_t)a->signal[a->me];
    long long n = a->count_at ? (long long)*(const volatile int *)(uintptr_t)a->count_at : a->count;
    unsigned long long lo, hi;
    if (a->ranks > 1 && !barrier(a, mine))
        return __atomic_load_n(&mine->status, __ATOMIC_ACQUIRE);
    for (int i = 0; i < a->items; i++) {
        unsigned char *out = (unsigned char *)(uintptr_t)(a->base[a->me] + a->out_off[i]);
        mt_red_part(mt_red_rows(a->rows[i], n) * a->row_bytes[i] / 16, a->me, a->ranks, &lo, &hi);
        for (unsigned long long c = lo; c < hi; c++)
            sum16(a, i, c, out + 16 * c);
    }
    if (a->ranks == 1)
        return 0;
    if (!barrier(a, mine))
        return __atomic_load_n(&mine->status, __ATOMIC_ACQUIRE);
    for (int q = 0; q < a->ranks; q++) {
        if (q == a->me)
            continue;
        for (int i = 0; i < a->items; i++) {
            unsigned long long off = a->out_off[i];
            mt_red_part(mt_red_rows(a->rows[i], n) * a->row_bytes[i] / 16, q, a->ranks, &lo, &hi);
            memcpy((unsigned char *)(uintptr_t)(a->base[a->me] + off) + 16 * lo,
                   (const unsigned char *)(uintptr_t)(a->base[q] + off) + 16 * lo, 16 * (hi - lo));
        }
    }
    if (!barrier(a, mine))
        return __atomic_load_n(&mine->status, __ATOMIC_ACQUIRE);
    return 0;
}
