/* metrale C core: torch's allocator functions for the pools (src/pool.c).
 * See arena_core.h for the contract.  The slots are process-wide state:
 * compiled into metrale._arena._pool alone, beside pool.c. */
#include "arena_core.h"
#include "pool_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* ---- slots: torch's allocator functions ------------------------------------ */

enum { SLOT_FREE = 0, SLOT_BOUND = 1, SLOT_RETIRED = 2 };

static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
static mt_pool *slot_pool[MT_POOL_SLOTS];
static int slot_state[MT_POOL_SLOTS];
static _Atomic uint64_t stray;

int mt_pool_bind(mt_pool *p)
{
    int slot = MT_ERR_LIMIT;
    pthread_mutex_lock(&slots_mu);
    for (int i = 0; i < MT_POOL_SLOTS; i++)
        if (slot_state[i] == SLOT_FREE) {
            slot_state[i] = SLOT_BOUND;
            slot_pool[i] = p;
            slot = i;
            break;
        }
    pthread_mutex_unlock(&slots_mu);
    return slot;
}

void mt_pool_unbind(int slot, int retire)
{
    mt_pool *p;
    if (slot < 0 || slot >= MT_POOL_SLOTS)
        return;
    pthread_mutex_lock(&slots_mu);
    p = slot_pool[slot];
    slot_pool[slot] = NULL;
    slot_state[slot] = retire ? SLOT_RETIRED : SLOT_FREE;
    pthread_mutex_unlock(&slots_mu);
    /* A call that found the pool holds its lock, taken under slots_mu: once
     * this lock is had, no call is inside and none can start. */
    if (p != NULL) {
        mt_pool_lock(p);
        mt_pool_unlock(p);
    }
}

void mt_pool_unretire(int slot)
{
    if (slot < 0 || slot >= MT_POOL_SLOTS)
        return;
    pthread_mutex_lock(&slots_mu);
    if (slot_state[slot] == SLOT_RETIRED)
        slot_state[slot] = SLOT_FREE;
    pthread_mutex_unlock(&slots_mu);
}

uint64_t mt_pool_stray_calls(void)
{
    return atomic_load(&stray);
}

/* The slot's pool with its lock held (the caller unlocks), or NULL. */
static mt_pool *slot_enter(int slot)
{
    mt_pool *p;
    pthread_mutex_lock(&slots_mu);
    p = slot_pool[slot];
    if (p != NULL)
        mt_pool_lock(p);
    pthread_mutex_unlock(&slots_mu);
    return p;
}

/* The slot functions do their work while holding the lock slot_enter took,
 * so that mt_pool_unbind (and then the pool's owner, who frees it) waits for
 * them. */
static void *slot_alloc(int slot, size_t size)
{
    uint64_t out = 0;
    int err = 0;
    mt_pool *p = slot_enter(slot);
    if (p == NULL) {
        atomic_fetch_add(&stray, 1);
        return NULL;
    }
    if (mt_pool_alloc_locked(p, size, &out, &err) != MT_OK)
        out = 0;
    mt_pool_unlock(p);
    return (void *)(uintptr_t)out;
}

static void slot_free(int slot, void *ptr, size_t size)
{
    mt_pool *p = slot_enter(slot);
    int rc;
    if (p == NULL) {
        atomic_fetch_add(&stray, 1);
        return;
    }
    rc = mt_pool_release_locked(p, (uint64_t)(uintptr_t)ptr, size);
    mt_pool_unlock(p);
    if (rc != MT_OK)
        atomic_fetch_add(&stray, 1);
}

/* Torch's signatures: alloc(size, device, stream), free(ptr, size, device,
 * stream); slot i is functions slot_alloc_<a>_<b> with i = 8 * a + b. */
#define SLOT(a, b) \
    static void *slot_alloc_##a##_##b(size_t size, int device, void *stream) \
    { (void)device; (void)stream; return slot_alloc(8 * a + b, size); } \
    static void slot_free_##a##_##b(void *ptr, size_t size, int device, void *stream) \
    { (void)device; (void)stream; slot_free(8 * a + b, ptr, size); }
#define SLOT8(a) SLOT(a, 0) SLOT(a, 1) SLOT(a, 2) SLOT(a, 3) SLOT(a, 4) SLOT(a, 5) \
    SLOT(a, 6) SLOT(a, 7)
SLOT8(0) SLOT8(1) SLOT8(2) SLOT8(3) SLOT8(4) SLOT8(5) SLOT8(6) SLOT8(7)

#define FN(kind, a, b) (uint64_t)(uintptr_t)&slot_##kind##_##a##_##b
#define FN8(kind, a) FN(kind, a, 0), FN(kind, a, 1), FN(kind, a, 2), FN(kind, a, 3), \
    FN(kind, a, 4), FN(kind, a, 5), FN(kind, a, 6), FN(kind, a, 7)
#define FN64(kind) FN8(kind, 0), FN8(kind, 1), FN8(kind, 2), FN8(kind, 3), FN8(kind, 4), \
    FN8(kind, 5), FN8(kind, 6), FN8(kind, 7)

uint64_t mt_pool_slot_alloc(int slot)
{
    static const uint64_t fns[MT_POOL_SLOTS] = {FN64(alloc)};
    return slot >= 0 && slot < MT_POOL_SLOTS ? fns[slot] : 0;
}

uint64_t mt_pool_slot_free(int slot)
{
    static const uint64_t fns[MT_POOL_SLOTS] = {FN64(free)};
    return slot >= 0 && slot < MT_POOL_SLOTS ? fns[slot] : 0;
}
