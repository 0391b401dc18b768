/* Debug arenas (docs/debug.md): the parameter block of the debug kernels
 * (debug_ops.cu), the per-item results, the element codes, the fill patterns
 * and the fingerprint's word function.  Declared once here for the kernels,
 * the host implementation (src/debug.c, the same results to the byte) and the
 * backends (_backend.pyx, _cuda.pyx).
 *
 * One launch works on up to MT_DBG_MAX_ITEMS items: byte ranges of the slab,
 * each [base + offset, base + offset + length) (a 16-byte aligned offset for
 * NONFINITE and FINGERPRINT, whose kernels read whole 16-byte lanes; the
 * CUDA backend checks it).  The CUDA backend lays out the
 * grid like zero_ranges: item i owns blocks [first[i], first[i + 1]), each
 * block `per` 16-byte chunks of it; the host ignores the grid. */
#ifndef METRALE_DEBUG_OPS_H
#define METRALE_DEBUG_OPS_H

#include "arena_core.h"

#ifdef __CUDACC__
#define MT_DBG_FN static __host__ __device__ __forceinline__
#else
#define MT_DBG_FN static inline
#endif

/* Items of one launch (the parameter block; the PTX is built for it): an
 * operation over more buffers runs in several launches. */
#define MT_DBG_MAX_ITEMS 64

/* What a call does with its items. */
enum {
    MT_DBG_FILL = 0,        /* write pattern[offset % 16] to every byte (guards, poison) */
    MT_DBG_CHECK = 1,       /* count bytes that differ from the pattern; the first one */
    MT_DBG_NONFINITE = 2,   /* count NaN and Inf elements of `elem`; the first one */
    MT_DBG_FINGERPRINT = 3  /* the sum of mt_fp_word over the item's 8-byte words */
};

/* Element types (the catalogue's dtype names, metrale/_arena/_debug.pyx maps them). */
enum {
    MT_EL_NONE = 0,         /* untyped: raw bytes, mixed or q8_1 blocks */
    MT_EL_BF16 = 1,
    MT_EL_F32 = 2,
    MT_EL_FP8_E4M3 = 3,
    MT_EL_I8 = 4,
    MT_EL_I32 = 5,
    MT_EL_U32 = 6,
    MT_EL_I64 = 7
};

/* The byte of a guard band at slab offset o: 0xB0 + o % 16 (never 0x00,
 * 0xFF or a small integer, so a stray zero, -1 or index write shows). */
#define MT_GUARD_BYTE(o) ((unsigned char)(0xB0u + ((o) & 15u)))

typedef struct mt_debug_args {
    unsigned long long base;                        /* slab base address */
    unsigned long long results;                     /* device address of the results (CUDA) */
    unsigned long long offset[MT_DBG_MAX_ITEMS];    /* item start, from base */
    unsigned long long length[MT_DBG_MAX_ITEMS];    /* item bytes */
    unsigned int first[MT_DBG_MAX_ITEMS + 1];       /* grid: the item's first block */
    unsigned char pattern[MT_DBG_MAX_ITEMS][16];    /* FILL, CHECK: byte at offset o is [o % 16] */
    unsigned char elem[MT_DBG_MAX_ITEMS];           /* NONFINITE: MT_EL_* of the item */
    unsigned int per;                               /* grid: 16-byte chunks per block */
    int count;                                      /* items */
} mt_debug_args;

/* One item's result.  CHECK: `count` bytes differ, the first at item offset
 * ~`first_inv` (first_inv is 0 when none differs: the kernels take the max of
 * ~offset, so zeroed results need no other initial value).  NONFINITE:
 * `count` NaN elements, `extra` infinite ones, the first of either at byte
 * ~`first_inv`.  FINGERPRINT: `count` is the word sum, before mt_fp_final. */
typedef struct mt_debug_result {
    unsigned long long count;
    unsigned long long first_inv;
    unsigned long long extra;
    unsigned long long pad;
} mt_debug_result;

/* ---- the fingerprint ----------------------------------------------------------
 * Word i (bytes 8i .. 8i + 7 of the item, little-endian, zero past its end)
 * contributes mt_fp_word(w, i); the sum of the contributions mod 2^64 does
 * not depend on the order they are added in, so a GPU reduction and a host
 * loop give the same value.  Each term is a bijection of the word (xor with
 * a key of its index, multiply by an odd constant, xor-shift), so changing
 * any one word always changes the fingerprint, and moving a word changes its
 * key.  mt_fp_final mixes the sum with the byte count (splitmix64's
 * finalizer), so a trailing zero byte changes it too. */
#define MT_FP_KEY 0x9E3779B97F4A7C15ull
#define MT_FP_MUL 0xD6E8FEB86659FD93ull

MT_DBG_FN unsigned long long mt_fp_word(unsigned long long w, unsigned long long i)
{
    unsigned long long x = (w ^ ((i + 1) * MT_FP_KEY)) * MT_FP_MUL;
    return x ^ (x >> 32);
}

MT_DBG_FN unsigned long long mt_fp_final(unsigned long long sum, unsigned long long nbytes)
{
    unsigned long long x = sum ^ (nbytes * MT_FP_MUL);
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* ---- non-finite elements --------------------------------------------------------
 * 0: finite (or not a float type), 1: NaN, 2: infinite; `bits` holds the
 * element's little-endian bytes.  FP8 E4M3 (fn) has no infinity: 0x7F and
 * 0xFF are its NaNs. */
MT_DBG_FN int mt_el_class(int elem, unsigned int bits)
{
    switch (elem) {
    case MT_EL_BF16:
        if ((bits & 0x7F80u) != 0x7F80u) return 0;
        return (bits & 0x007Fu) ? 1 : 2;
    case MT_EL_F32:
        if ((bits & 0x7F800000u) != 0x7F800000u) return 0;
        return (bits & 0x007FFFFFu) ? 1 : 2;
    case MT_EL_FP8_E4M3:
        return (bits & 0x7Fu) == 0x7Fu ? 1 : 0;
    default:
        return 0;
    }
}

/* Bytes per element of an MT_EL_* code (1 for untyped). */
MT_DBG_FN int mt_el_size(int elem)
{
    switch (elem) {
    case MT_EL_BF16: return 2;
    case MT_EL_F32: case MT_EL_I32: case MT_EL_U32: return 4;
    case MT_EL_I64: return 8;
    default: return 1;
    }
}

#endif
