/* Between pool.c and pool_slots.c, not part of the core's interface: the
 * pool's lock, and its two calls made with the lock held. */
#ifndef METRALE_POOL_INTERNAL_H
#define METRALE_POOL_INTERNAL_H

#include "arena_core.h"

void mt_pool_lock(mt_pool *p);
void mt_pool_unlock(mt_pool *p);
int mt_pool_alloc_locked(mt_pool *p, uint64_t n, uint64_t *out, int *err);
int mt_pool_release_locked(mt_pool *p, uint64_t ptr, uint64_t n);

#endif
