/* metrale C core: the row-wise carve cursor and the arena's lifetime word.
 * See arena_core.h for the contract of each function. */
#define _POSIX_C_SOURCE 200809L     /* nanosleep under -std=c11 */
#include "arena_core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

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

/* ---- arena lifetime ------------------------------------------------------ */

#define LIFE_RELEASED   ((uint64_t)1 << 63)
#define LIFE_PAUSED     ((uint64_t)1 << 62)   /* no new operation or export starts */
#define LIFE_BUSY       ((uint64_t)1 << 61)   /* a reshape runs */
#define LIFE_EXPORT_ONE ((uint64_t)1 << 32)
#define LIFE_EXPORTS    (((uint64_t)1 << 61) - LIFE_EXPORT_ONE)   /* bits 32..60 */
#define LIFE_IN_FLIGHT  (LIFE_EXPORT_ONE - 1)                       /* bits 0..31 */

struct mt_life {
    _Atomic uint64_t state;
    _Atomic uint64_t exports[MT_NBUF];
};

/* Operations the calling thread is inside, over every arena. */
static _Thread_local unsigned long tls_life_depth;

mt_life *mt_life_new(void)
{
    mt_life *l = (mt_life *)malloc(sizeof *l);
    if (!l) return NULL;
    atomic_init(&l->state, 0);
    for (int i = 0; i < MT_NBUF; i++) atomic_init(&l->exports[i], 0);
    return l;
}

void mt_life_free(mt_life *l) { free(l); }

/* Add `one` to the field `mask` of the word unless released or full.  Acquire:
 * whatever the caller then does with the slab follows this point. */
static int life_add(mt_life *l, uint64_t one, uint64_t mask)
{
    uint64_t s = atomic_load_explicit(&l->state, memory_order_relaxed);
    do {
        if (s & LIFE_RELEASED) return MT_LIFE_RELEASED;
        if (s & LIFE_PAUSED) return MT_LIFE_PAUSED;
        if ((s & mask) == mask) return MT_LIFE_FULL;
    } while (!atomic_compare_exchange_weak_explicit(&l->state, &s, s + one,
                                                    memory_order_acquire, memory_order_relaxed));
    return MT_LIFE_OK;
}

int mt_life_enter(mt_life *l)
{
    int rc = life_add(l, 1, LIFE_IN_FLIGHT);
    if (rc == MT_LIFE_OK) tls_life_depth++;
    return rc;
}

/* Release: the operation's accesses to the slab happen before the drain ends. */
void mt_life_leave(mt_life *l)
{
    tls_life_depth--;
    atomic_fetch_sub_explicit(&l->state, 1, memory_order_release);
}

int mt_life_export(mt_life *l, int buf)
{
    int rc = life_add(l, LIFE_EXPORT_ONE, LIFE_EXPORTS);
    if (rc == MT_LIFE_OK) atomic_fetch_add_explicit(&l->exports[buf], 1, memory_order_relaxed);
    return rc;
}

void mt_life_unexport(mt_life *l, int buf)
{
    atomic_fetch_sub_explicit(&l->exports[buf], 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&l->state, LIFE_EXPORT_ONE, memory_order_release);
}

uint64_t mt_life_exports(const mt_life *l, int buf)
{
    return atomic_load_explicit(&((mt_life *)l)->exports[buf], memory_order_relaxed);
}

uint64_t mt_life_in_flight(const mt_life *l)
{
    return atomic_load_explicit(&((mt_life *)l)->state, memory_order_relaxed) & LIFE_IN_FLIGHT;
}

int mt_life_close(mt_life *l)
{
    uint64_t s = atomic_load_explicit(&l->state, memory_order_acquire);
    do {
        if (s & LIFE_RELEASED) return MT_LIFE_RELEASED;
        if (s & LIFE_EXPORTS) return MT_LIFE_EXPORTED;
        if ((s & LIFE_IN_FLIGHT) && tls_life_depth > 0) return MT_LIFE_IN_FLIGHT;
    } while (!atomic_compare_exchange_weak_explicit(&l->state, &s, s | LIFE_RELEASED,
                                                    memory_order_acq_rel, memory_order_acquire));
    return MT_LIFE_OK;
}

void mt_life_drain(mt_life *l)
{
    /* Acquire pairs with mt_life_leave's release: once the count reads 0, every
     * access those operations made to the slab is done.  After a close it also
     * waits for a running reshape (which is not counted in flight). */
    uint64_t wait = LIFE_IN_FLIGHT;
    if (atomic_load_explicit(&l->state, memory_order_acquire) & LIFE_RELEASED) wait |= LIFE_BUSY;
    while (atomic_load_explicit(&l->state, memory_order_acquire) & wait) {
        struct timespec pause = {0, 20000};     /* 20 us: operations are memsets and copies */
        nanosleep(&pause, NULL);
    }
}

int mt_life_released(const mt_life *l)
{
    return (atomic_load_explicit(&((mt_life *)l)->state, memory_order_acquire) & LIFE_RELEASED) != 0;
}

int mt_life_reshape_begin(mt_life *l)
{
    uint64_t s = atomic_load_explicit(&l->state, memory_order_acquire);
    do {
        if (s & LIFE_RELEASED) return MT_LIFE_RELEASED;
        if (s & LIFE_BUSY) return MT_LIFE_BUSY;
        if (s & LIFE_EXPORTS) return MT_LIFE_EXPORTED;
        if (tls_life_depth > 0) return MT_LIFE_IN_FLIGHT;
    } while (!atomic_compare_exchange_weak_explicit(&l->state, &s, s | LIFE_PAUSED | LIFE_BUSY,
                                                    memory_order_acq_rel, memory_order_acquire));
    return MT_LIFE_OK;
}

void mt_life_reshape_end(mt_life *l, int stay_paused)
{
    uint64_t clear = LIFE_BUSY | (stay_paused ? 0 : LIFE_PAUSED);
    uint64_t set = stay_paused ? LIFE_PAUSED : 0;
    uint64_t s = atomic_load_explicit(&l->state, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&l->state, &s, (s & ~clear) | set,
                                                  memory_order_release, memory_order_relaxed))
        ;
}

int mt_life_paused(const mt_life *l)
{
    return (atomic_load_explicit(&((mt_life *)l)->state, memory_order_acquire) & LIFE_PAUSED) != 0;
}
