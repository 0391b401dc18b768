# Declarations of src/debug.h and kernels/debug_ops.h (debug arenas).
from libc.stdint cimport uint64_t
from metrale._base._core cimport mt_layout, mt_range

cdef extern from "debug.h" nogil:
    enum:
        MT_DBG_MAX_ITEMS
        MT_DBG_FILL
        MT_DBG_CHECK
        MT_DBG_NONFINITE
        MT_DBG_FINGERPRINT
    enum:
        MT_EL_NONE
        MT_EL_BF16
        MT_EL_F32
        MT_EL_FP8_E4M3
        MT_EL_I8
        MT_EL_I32
        MT_EL_U32
        MT_EL_I64

    ctypedef struct mt_debug_args:
        unsigned long long base
        unsigned long long results
        unsigned long long offset[MT_DBG_MAX_ITEMS]
        unsigned long long length[MT_DBG_MAX_ITEMS]
        unsigned int first[MT_DBG_MAX_ITEMS + 1]
        unsigned char pattern[MT_DBG_MAX_ITEMS][16]
        unsigned char elem[MT_DBG_MAX_ITEMS]
        unsigned int per
        int count

    ctypedef struct mt_debug_result:
        unsigned long long count
        unsigned long long first_inv
        unsigned long long extra
        unsigned long long pad

    unsigned char MT_GUARD_BYTE(unsigned long long o)
    unsigned long long mt_fp_final(unsigned long long sum, unsigned long long nbytes)

    int mt_guard_ranges(const mt_layout *L, int *ids, mt_range *out)
    int mt_poison_pattern(int elem, unsigned char *out)
    void mt_debug_host(int op, const mt_debug_args *a, mt_debug_result *out)
