/* Tensor-parallel all-reduce through the peers' mapped slabs
 * (BufferArena.peer_all_reduce, docs/tensor-parallel.md): the parameter
 * block of the kernel (peer_reduce.cu), the signal area every rank exports
 * beside its slab, and what the kernel and the host implementation
 * (src/peer.c, the same results to the bit) share: the partition of the work
 * and the element arithmetic.
 *
 * The algorithm (two-shot, in place or out of place), for `ranks` ranks and
 * the live rows of each item (the first `count` rows, read when it runs):
 *   barrier 1  every rank's input is written (its earlier work is done);
 *   phase 1    rank r sums part r of each item over every rank's input, in
 *              rank order, and writes it to its own output;
 *   barrier 2  every rank's part is written;
 *   phase 2    rank r copies part q of each item from rank q's output, for
 *              every other rank q;
 *   barrier 3  no rank reads this rank's memory any more, so the caller's
 *              next work may overwrite it.
 * No rank writes bytes another rank reads in the same phase (part r of the
 * output, in phase 1; the other parts, in phase 2, after their owners read
 * them as input), so `out` may be the input itself.  The barriers are per
 * block: block b of every rank handles the same chunks of every part (the
 * j-th chunk of a part belongs to block (j / THREADS) % blocks), so block b
 * only waits for block b of the others.  Each barrier increments block b's
 * own count (`epoch`, in this rank's signal area) and stores it into
 * `flags[b][me]` of every peer's, then waits until `flags[b][q]` of its own
 * has reached it for every peer q: the counts only grow (mod 2^32, compared
 * as a signed difference) and no rank gets more than one barrier ahead, so no
 * reset is ever needed and a captured graph replays it as it is. */
#ifndef METRALE_PEER_REDUCE_H
#define METRALE_PEER_REDUCE_H

#include "debug_ops.h"      /* MT_EL_* element codes */

#ifdef __CUDACC__
#define MT_RED_FN static __host__ __device__ __forceinline__
#else
#define MT_RED_FN static inline
#endif

#define MT_RED_MAX_RANKS 8      /* ranks of one reduction (a host's GPUs) */
#define MT_RED_MAX_ITEMS 16     /* buffers of one call */
#define MT_RED_BLOCKS 64        /* blocks of the CUDA launch: the same on every rank */
#define MT_RED_THREADS 512      /* threads of a block; the host runs one "block" of one */

/* Why a reduction gave up (mt_signal.status; 0: never).  A wait that times
 * out stores MT_RED_TIMEOUT + the rank it waited for; the status stays, and
 * every later reduction of this rank returns at once. */
#define MT_RED_TIMEOUT 1

/* A rank's signal area: one page-sized (granule-sized) physical chunk per
 * rank, exported beside its slab and mapped by every peer. */
typedef struct mt_signal {
    unsigned int flags[MT_RED_BLOCKS][MT_RED_MAX_RANKS];  /* [b][q]: rank q's block b's count */
    unsigned int epoch[MT_RED_BLOCKS];                     /* this rank's block b's count */
    unsigned int status;                                   /* MT_RED_* (sticky) */
} mt_signal;

/* Where a signal area's status word is (check_peer_reduce reads it). */
#define MT_RED_STATUS_OFFSET offsetof(mt_signal, status)

typedef struct mt_reduce_args {
    unsigned long long base[MT_RED_MAX_RANKS];      /* rank r's slab base, as mapped here */
    unsigned long long signal[MT_RED_MAX_RANKS];    /* rank r's mt_signal, as mapped here */
    unsigned long long in_off[MT_RED_MAX_ITEMS];    /* item i's input, from the base */
    unsigned long long out_off[MT_RED_MAX_ITEMS];   /* its output (may be the input) */
    unsigned long long row_bytes[MT_RED_MAX_ITEMS]; /* bytes of one row: a multiple of 16 */
    unsigned long long rows[MT_RED_MAX_ITEMS];      /* the rows it has (the count is capped here) */
    unsigned long long count_at;    /* the int32 count in device memory, or 0: `count` */
    unsigned long long timeout_ns;  /* how long one barrier waits for a peer */
    long long count;                /* live rows when count_at is 0 (negative: all) */
    unsigned char elem[MT_RED_MAX_ITEMS];           /* MT_EL_BF16 or MT_EL_F32 */
    int ranks;                      /* 1 .. MT_RED_MAX_RANKS */
    int me;                         /* this rank */
    int items;                      /* 1 .. MT_RED_MAX_ITEMS */
    int blocks;                     /* MT_RED_BLOCKS (CUDA) or 1 (host) */
} mt_reduce_args;

/* Live rows of an item of `rows` rows for count n (negative: every row). */
MT_RED_FN unsigned long long mt_red_rows(unsigned long long rows, long long n)
{
    return (n < 0 || (unsigned long long)n > rows) ? rows : (unsigned long long)n;
}

/* Part q of a span of `chunks` 16-byte chunks: [lo, hi). */
MT_RED_FN void mt_red_part(unsigned long long chunks, int q, int ranks,
                           unsigned long long *lo, unsigned long long *hi)
{
    *lo = chunks * (unsigned long long)q / (unsigned long long)ranks;
    *hi = chunks * (unsigned long long)(q + 1) / (unsigned long long)ranks;
}

/* ---- the arithmetic, the same bits on the device and the host ----------------
 * BF16: each rank's element widened to float, summed in rank order in float,
 * rounded once to nearest even (a NaN stays a quiet NaN).  For two ranks this
 * is one correctly rounded a + b, what NCCL computes.  F32: summed in rank
 * order. */
MT_RED_FN float mt_bf16_to_f32(unsigned int h)
{
    union { unsigned int u; float f; } x;
    x.u = h << 16;
    return x.f;
}

MT_RED_FN unsigned int mt_f32_to_bf16(float f)
{
    union { unsigned int u; float f; } x;
    x.f = f;
    if ((x.u & 0x7F800000u) == 0x7F800000u && (x.u & 0x007FFFFFu))
        return (x.u >> 16) | 0x0040u;                  /* NaN: quiet, sign kept */
    x.u += 0x7FFFu + ((x.u >> 16) & 1u);
    return x.u >> 16;
}

#endif
