/* metrale C core, debug arenas (docs/debug.md): guard bands, poison patterns
 * and the host implementation of the debug operations, to the byte what the
 * kernels of src/metrale/kernels/debug_ops.cu compute.  Plain C, no Python
 * (src/metrale/_base/_debug_core.pxd mirrors this header). */
#ifndef METRALE_DEBUG_H
#define METRALE_DEBUG_H

#include "arena_core.h"
#include "metrale/kernels/debug_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The guard band after each live buffer of a layout with L->guard > 0, in
 * slab order: [end, next MT_ALIGN boundary of end + L->guard), end = offset +
 * size.  ids[k] is the buffer the k-th band follows.  `out` and `ids` hold
 * L->n entries; returns the count (0 without guards). */
int mt_guard_ranges(const mt_layout *L, int *ids, mt_range *out);

/* The 16-byte fill pattern of poison for element type `elem` (MT_EL_*): a
 * NaN of the float types, an invalid index of the integer ones (the most
 * negative value, or all ones for U32).  Returns 0 for MT_EL_NONE (nothing
 * to poison with), else 1. */
int mt_poison_pattern(int elem, unsigned char out[16]);

/* Run `op` (MT_DBG_*) over the items of `a` on host memory: out[0 .. count)
 * is zeroed, then filled as the kernels fill it (FILL leaves it zero). */
void mt_debug_host(int op, const mt_debug_args *a, mt_debug_result *out);

#ifdef __cplusplus
}
#endif
#endif
