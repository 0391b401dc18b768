/* metrale C core: debug arenas.  See debug.h for the contract of each
 * function and kernels/debug_ops.h for the operations. */
#include "debug.h"

#include <string.h>

int mt_poison_pattern(int elem, unsigned char out[16])
{
    unsigned char v[8];
    int size = mt_el_size(elem);
    switch (elem) {
    case MT_EL_BF16: v[0] = 0xD1; v[1] = 0x7F; break;                 /* 0x7FD1: a quiet NaN */
    case MT_EL_F32: v[0] = 0xD1; v[1] = 0x7F; v[2] = 0xD1; v[3] = 0x7F; break;  /* 0x7FD17FD1 */
    case MT_EL_FP8_E4M3: v[0] = 0x7F; break;                          /* E4M3's NaN */
    case MT_EL_I8: v[0] = 0x80; break;                                /* -128 */
    case MT_EL_I32: v[0] = 0; v[1] = 0; v[2] = 0; v[3] = 0x80; break; /* INT32_MIN */
    case MT_EL_U32: v[0] = v[1] = v[2] = v[3] = 0xFF; break;          /* UINT32_MAX */
    case MT_EL_I64: memset(v, 0, 7); v[7] = 0x80; break;              /* INT64_MIN */
    default: memset(out, 0, 16); return 0;
    }
    for (int i = 0; i < 16; i++) out[i] = v[i % size];
    return 1;
}

static uint64_t load_le(const unsigned char *p, int n)
{
    uint64_t x = 0;
    for (int k = n - 1; k >= 0; k--) x = (x << 8) | p[k];
    return x;
}

/* An aligned 8-byte little-endian word (one load on the little-endian hosts). */
static uint64_t load_le8(const unsigned char *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
#else
    return load_le(p, 8);
#endif
}

void mt_debug_host(int op, const mt_debug_args *a, mt_debug_result *out)
{
    memset(out, 0, (size_t)a->count * sizeof(*out));
    for (int i = 0; i < a->count; i++) {
        unsigned char *p = (unsigned char *)(uintptr_t)(a->base + a->offset[i]);
        const unsigned char *pat = a->pattern[i];
        uint64_t n = a->length[i], o = a->offset[i];
        mt_debug_result *r = &out[i];
        if (op == MT_DBG_FILL) {
            for (uint64_t j = 0; j < n; j++) p[j] = pat[(o + j) & 15];
        } else if (op == MT_DBG_CHECK) {
            for (uint64_t j = 0; j < n; j++) {
                if (p[j] == pat[(o + j) & 15]) continue;
                if (r->count++ == 0) r->first_inv = ~j;
            }
        } else if (op == MT_DBG_NONFINITE) {
            int es = mt_el_size(a->elem[i]);
            for (uint64_t j = 0; j + (uint64_t)es <= n; j += (uint64_t)es) {
                int c = mt_el_class(a->elem[i], (unsigned)load_le(p + j, es));
                if (c == 0) continue;
                if (r->count + r->extra == 0) r->first_inv = ~j;
                if (c == 1) r->count++; else r->extra++;
            }
        } else if (op == MT_DBG_FINGERPRINT) {
            uint64_t sum = 0, w = 0;
            for (uint64_t j = 0; j < n / 8; j++)
                sum += mt_fp_word(load_le8(p + 8 * j), j);
            if (n % 8) {
                w = load_le(p + n / 8 * 8, (int)(n % 8));
                sum += mt_fp_word(w, n / 8);
            }
            r->count = sum;
        }
    }
}
