/* metrale C core: the row-wise carve cursor (see arena_core.h). */
#include "arena_core.h"

#include <stdatomic.h>
#include <stdlib.h>

/* ---- row-wise cursor ----------------------------------------------------- */

struct mt_cursor { _Atomic uint64_t value; };

mt_cursor *mt_cursor_new(void)
{
    mt_cursor *c = (mt_cursor *)malloc(sizeof *c);
    if (c) atomic_init(&c->value, 0);
    return c;
}

void mt_cursor_free(mt_cursor *c) { free(c); }

int mt_cursor_take(mt_cursor *c, uint64_t bytes, uint64_t size, uint64_t *base)
{
    /* A CAS loop, not a fetch-and-add: the sum saturates instead of wrapping
     * back into the slab.  Relaxed: carves only need disjointness. */
    uint64_t cur = atomic_load_explicit(&c->value, memory_order_relaxed), next;
    do {
        next = cur > UINT64_MAX - bytes ? UINT64_MAX : cur + bytes;
    } while (!atomic_compare_exchange_weak_explicit(&c->value, &cur, next,
                                                    memory_order_relaxed, memory_order_relaxed));
    *base = cur;
    return (cur > size || bytes > size - cur) ? MT_ERR_LIMIT : MT_OK;
}
