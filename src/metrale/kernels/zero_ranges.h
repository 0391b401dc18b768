/* The parameter block of metrale_zero_ranges (zero_ranges.cu), passed by value:
 * declared once here for the kernel, the CUDA backend (_cuda.pyx) and the
 * tuning variants (bench/zero_ranges_variants.cu).  Range r owns blocks
 * [first[r], first[r + 1]); each of its blocks clears `per` 16-byte chunks. */
#ifndef METRALE_ZERO_RANGES_H
#define METRALE_ZERO_RANGES_H

#include "arena_core.h"

/* At most one range per zero_all buffer (merged ranges only make fewer). */
#define MT_MAX_RANGES MT_N_ZERO_ALL

typedef struct mt_zero_args {
    unsigned long long base;
    unsigned long long offset[MT_MAX_RANGES];
    unsigned long long length[MT_MAX_RANGES];
    unsigned int first[MT_MAX_RANGES + 1];
    unsigned int per;
    int count;
} mt_zero_args;

#endif
