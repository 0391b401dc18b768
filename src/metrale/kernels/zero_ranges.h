/* The parameter block of metrale_zero_ranges (zero_ranges.cu), passed by value:
 * declared once here for the kernel, the CUDA backend (_cuda.pyx) and the
 * tuning variants (bench/zero_ranges_variants.cu).  Range r owns blocks
 * [first[r], first[r + 1]); each of its blocks clears `per` 16-byte chunks. */
#ifndef METRALE_ZERO_RANGES_H
#define METRALE_ZERO_RANGES_H

#include "arena_core.h"

/* Ranges of one launch: more than the zero_all buffers of any table (at most
 * MT_MAX_ROWS_ENTRIES - 1), so zero_all, zero_prefill_essentials and the
 * per-buffer ranges of reserved layouts are one launch each. */
#define MT_MAX_RANGES 32

typedef struct mt_zero_args {
    unsigned long long base;
    unsigned long long offset[MT_MAX_RANGES];
    unsigned long long length[MT_MAX_RANGES];
    unsigned int first[MT_MAX_RANGES + 1];
    unsigned int per;
    int count;
} mt_zero_args;

/* ---- zero_all_rows with the token count read on the device -------------------
 * The ranges of zero_all_rows(n) depend on n only through each buffer's
 * kind: rows of max_batch_tokens (n rows), rows of ceil16(max_batch_tokens)
 * (ceil16(n) rows), the larger of the two (both) or whole.  So the host builds this table once (layout.c,
 * mt_rows_args_init) and whoever knows n (the kernel metrale_zero_rows_at,
 * reading an int32 in device memory when it runs; the host backend; the
 * host-count zero_all_rows) evaluates it with mt_rows_segment below: one
 * definition of the rule for every path.  The parameters travel by value. */
/* The zero_all buffers, one of them split by a hole (so a buffer set has at
 * most 30 of them: metrale/buffers.py MAX_ZERO_ALL); under 32, so that one
 * warp of the kernel evaluates the table.  A constant, not the table's count:
 * it is the kernel's parameter block (the PTX is built for it). */
#define MT_MAX_ROWS_ENTRIES 31

enum { MT_ROWS_M = 0, MT_ROWS_M16 = 1, MT_ROWS_WHOLE = 2, MT_ROWS_BOTH = 3 };

typedef struct mt_rows_entry {
    unsigned long long offset;   /* the buffer's start, from the slab base */
    unsigned long long size;     /* its whole bytes */
    unsigned long long row;      /* bytes of one row (kinds M and M16; BOTH: of M) */
    unsigned long long row16;    /* BOTH: bytes of one row of ceil16(max_batch_tokens) */
    unsigned long long lo, hi;   /* only bytes [lo, hi) of the buffer are cleared */
    unsigned long long pad_to;   /* the next entry's offset when it follows after
                                    alignment padding, else offset + size */
    int kind;
} mt_rows_entry;

typedef struct mt_rows_args {
    unsigned long long base;     /* slab base address */
    unsigned long long count_at; /* address of the int32 token count (device path) */
    unsigned long long m, m16;   /* max(max_batch_tokens, 1) and ceil16 of it */
    mt_rows_entry e[MT_MAX_ROWS_ENTRIES];
    unsigned int per;            /* 16-byte chunks of the smallest tile, a power of two */
    unsigned int spread;         /* tiles a block aims at (kernel) */
    int n;                       /* entries used */
} mt_rows_args;

/* The parameter block of metrale_zero_rows_at: the table and how the launch
 * shares it out.  Blocks [rows_blocks, ...) clear what every count clears
 * (each entry's segment for t = 0), laid out by the host as metrale_zero_ranges'
 * launch is (`fixed`, a range's start not always 16-byte aligned).  Blocks
 * [0, rows_blocks) clear what the count adds to each entry (from its end for
 * t = 0 to its end for t: mt_rows_segment's end never falls as t grows), in
 * tiles numbered by the kernel, taken from `queue` (two uint32 counters in
 * device memory: tiles taken, blocks done; the last block done sets both
 * back to 0), or, where queue is 0, block b taking tiles b, b + rows_blocks,
 * ... */
typedef struct mt_rows_launch {
    mt_rows_args a;
    mt_zero_args fixed;
    unsigned long long queue;
    unsigned int rows_blocks;
} mt_rows_launch;

#ifdef __cplusplus
extern "C" {
#endif
/* Fill `a` (base, count_at and per left 0) with an entry per non-empty
 * zero_all buffer of L in slab order, never clearing the slab bytes
 * [hole_lo, hole_hi) (none when hole_hi <= hole_lo): a buffer the hole
 * cuts in two gives two entries.  Returns the entry count. */
int mt_rows_args_init(const mt_layout *L, uint64_t hole_lo, uint64_t hole_hi, mt_rows_args *a);
#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)
#define MT_HD static __host__ __device__ __forceinline__
#else
#define MT_HD static inline
#endif

/* The rows zero_all_rows clears for a count read as `t`: t itself, or
 * max_batch_tokens (every buffer whole) when t >= max_batch_tokens or t < 0
 * (a corrupt count clears more, never less). */
MT_HD unsigned long long mt_rows_count(const mt_rows_args *a, long long t)
{
    return (t < 0 || (unsigned long long)t >= a->m) ? a->m : (unsigned long long)t;
}

/* Live bytes of entry i for t rows (ARENA §5.2): (n / m)·t, (n / m16)·min(ceil16(t), m16),
 * the larger of those two (rows rounded up; mt_rows_segment caps it at n), or n. */
MT_HD unsigned long long mt_rows_live(const mt_rows_entry *e, unsigned long long m16,
                                      unsigned long long t)
{
    unsigned long long t16 = (t + 15) & ~15ULL;
    if (e->kind == MT_ROWS_M) return e->row * t;
    if (e->kind == MT_ROWS_M16) return e->row * (t16 < m16 ? t16 : m16);
    if (e->kind == MT_ROWS_BOTH) {
        /* Rounded-up rows may pass the size (capped there): no product wraps. */
        unsigned long long r = t16 < m16 ? t16 : m16;
        unsigned long long a = (t && e->row > e->size / t) ? e->size : e->row * t;
        unsigned long long b = (r && e->row16 > e->size / r) ? e->size : e->row16 * r;
        return a > b ? a : b;
    }
    return e->size;
}

/* The bytes [*start, *end) (slab offsets) entry i clears for t rows (t from
 * mt_rows_count); *end == *start when none.  A buffer cleared to its end
 * also clears the alignment padding after it when the next entry clears
 * from its start, so that adjacent ranges meet (what zero_all clears). */
MT_HD void mt_rows_segment(const mt_rows_args *a, int i, unsigned long long t,
                           unsigned long long *start, unsigned long long *end)
{
    const mt_rows_entry *e = &a->e[i];
    unsigned long long live = mt_rows_live(e, a->m16, t);
    unsigned long long hi = live < e->hi ? live : e->hi;
    *start = *end = e->offset + e->lo;
    if (hi <= e->lo) return;
    *end = e->offset + hi;
    if (hi == e->size && e->pad_to > e->offset + e->size && i + 1 < a->n) {
        const mt_rows_entry *f = &a->e[i + 1];
        unsigned long long fl = mt_rows_live(f, a->m16, t);
        if (f->lo == 0 && f->hi > 0 && fl > 0) *end = e->pad_to;
    }
}

#endif
