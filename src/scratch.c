/* metrale C core: the per-thread scratch tables.  See arena_core.h for the
 * contract of each function. */
#include "arena_core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- per-thread scratch -------------------------------------------------- */

typedef struct mt_slot {
    _Atomic uint64_t owner;     /* thread id of the claimant, 0 = free */
    _Atomic uint64_t claim;     /* bumped on each claim */
    _Atomic uint64_t used;      /* written by the owner only */
    _Atomic uint64_t seen_gen;  /* reset generation the owner last applied */
    unsigned char *buf;         /* kept across claims; freed with the table */
    void *user;                 /* the Cython ScratchSpace of this claim */
} mt_slot;

struct mt_scratch {
    _Atomic long refs;
    uint64_t id;
    size_t size, max_threads;
    _Atomic uint64_t reset_gen;
    _Atomic uint64_t active;
    _Atomic uint64_t allocated;
    /* Bytes carved across all slots, and the high-water marks statistics
     * keep after threads exit (a thread's bytes count until it applies a
     * reset_all, on its next access). */
    _Atomic uint64_t total;
    _Atomic uint64_t peak_total;
    _Atomic uint64_t peak_thread;
    mt_slot slots[];
};

#define MT_TLS_CACHE 4
typedef struct { const mt_scratch *s; uint64_t sid; long slot; } tls_entry;
static _Thread_local tls_entry tls_cache[MT_TLS_CACHE];
static _Thread_local unsigned tls_next;
static _Thread_local uint64_t tls_tid;
static _Atomic uint64_t next_tid = 1, next_sid = 1;

uint64_t mt_thread_id(void)
{
    if (tls_tid == 0) tls_tid = atomic_fetch_add(&next_tid, 1);
    return tls_tid;
}

mt_scratch *mt_scratch_new(size_t scratch_size, size_t max_threads)
{
    mt_scratch *s;
    if (max_threads > (SIZE_MAX - sizeof *s) / sizeof(mt_slot)) return NULL;
    s = (mt_scratch *)calloc(1, sizeof *s + max_threads * sizeof(mt_slot));
    if (!s) return NULL;
    atomic_init(&s->refs, 1);
    s->id = atomic_fetch_add(&next_sid, 1);
    s->size = scratch_size;
    s->max_threads = max_threads;
    return s;
}

void mt_scratch_incref(mt_scratch *s) { atomic_fetch_add(&s->refs, 1); }

void mt_scratch_decref(mt_scratch *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1) return;
    for (size_t i = 0; i < s->max_threads; i++) free(s->slots[i].buf);
    free(s);
}

size_t mt_scratch_size(const mt_scratch *s) { return s->size; }
size_t mt_scratch_max_threads(const mt_scratch *s) { return s->max_threads; }

static void cache_put(const mt_scratch *s, long slot)
{
    tls_entry *e = &tls_cache[tls_next++ % MT_TLS_CACHE];
    e->s = s;
    e->sid = s->id;
    e->slot = slot;
}

long mt_scratch_find(mt_scratch *s)
{
    uint64_t tid = mt_thread_id();
    for (int i = 0; i < MT_TLS_CACHE; i++) {
        tls_entry *e = &tls_cache[i];
        /* The id check rejects a new table that reuses a freed one's address;
         * the owner check rejects a slot given back since it was cached. */
        if (e->s == s && e->sid == s->id &&
            atomic_load_explicit(&s->slots[e->slot].owner, memory_order_relaxed) == tid)
            return e->slot;
    }
    for (size_t i = 0; i < s->max_threads; i++) {
        if (atomic_load_explicit(&s->slots[i].owner, memory_order_relaxed) == tid) {
            cache_put(s, (long)i);
            return (long)i;
        }
    }
    return -1;
}

long mt_scratch_claim(mt_scratch *s)
{
    uint64_t tid = mt_thread_id();
    long found = mt_scratch_find(s);
    if (found >= 0) return found;
    for (size_t i = 0; i < s->max_threads; i++) {
        mt_slot *sl = &s->slots[i];
        uint64_t expect = 0;
        if (!atomic_compare_exchange_strong_explicit(&sl->owner, &expect, tid,
                                                     memory_order_acquire, memory_order_relaxed))
            continue;
        if (sl->buf == NULL && s->size > 0) {
            size_t cap = (s->size + 63) / 64 * 64;
            sl->buf = (unsigned char *)aligned_alloc(64, cap);
            if (!sl->buf) {
                atomic_store_explicit(&sl->owner, 0, memory_order_release);
                return MT_ERR_NOMEM;
            }
            atomic_fetch_add(&s->allocated, s->size);
        }
        atomic_fetch_add(&sl->claim, 1);
        atomic_store_explicit(&sl->used, 0, memory_order_relaxed);
        atomic_store_explicit(&sl->seen_gen, atomic_load(&s->reset_gen), memory_order_relaxed);
        sl->user = NULL;
        atomic_fetch_add(&s->active, 1);
        cache_put(s, (long)i);
        return (long)i;
    }
    return MT_ERR_LIMIT;
}

void mt_scratch_release(mt_scratch *s, long slot, uint64_t claim)
{
    mt_slot *sl = &s->slots[slot];
    if (atomic_load(&sl->claim) != claim || atomic_load(&sl->owner) == 0) return;
    sl->user = NULL;
    atomic_fetch_sub(&s->total, atomic_exchange(&sl->used, 0));
    atomic_fetch_sub(&s->active, 1);
    /* Release: the next claimant sees the buffer pointer this owner left. */
    atomic_store_explicit(&sl->owner, 0, memory_order_release);
}

uint64_t mt_scratch_claim_id(const mt_scratch *s, long slot)
{
    return atomic_load(&((mt_scratch *)s)->slots[slot].claim);
}

void mt_scratch_set_user(mt_scratch *s, long slot, void *user) { s->slots[slot].user = user; }
void *mt_scratch_user(const mt_scratch *s, long slot) { return s->slots[slot].user; }

/* Apply a pending reset_all (owner side). */
static mt_slot *owned(mt_scratch *s, long slot)
{
    mt_slot *sl = &s->slots[slot];
    uint64_t g = atomic_load_explicit(&s->reset_gen, memory_order_acquire);
    if (atomic_load_explicit(&sl->seen_gen, memory_order_relaxed) != g) {
        atomic_fetch_sub_explicit(&s->total, atomic_exchange_explicit(&sl->used, 0, memory_order_relaxed),
                                  memory_order_relaxed);
        atomic_store_explicit(&sl->seen_gen, g, memory_order_relaxed);
    }
    return sl;
}

unsigned char *mt_scratch_base(mt_scratch *s, long slot) { return s->slots[slot].buf; }

uint64_t mt_scratch_used(mt_scratch *s, long slot)
{
    return atomic_load_explicit(&owned(s, slot)->used, memory_order_relaxed);
}

/* *peak = max(*peak, v) */
static void raise_to(_Atomic uint64_t *peak, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(peak, memory_order_relaxed);
    while (v > cur &&
           !atomic_compare_exchange_weak_explicit(peak, &cur, v, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

unsigned char *mt_scratch_carve(mt_scratch *s, long slot, uint64_t n)
{
    mt_slot *sl = owned(s, slot);
    uint64_t used = atomic_load_explicit(&sl->used, memory_order_relaxed);
    uint64_t off = (used + 63) / 64 * 64;
    uint64_t total;
    if (off > s->size || n > s->size - off) return NULL;
    atomic_store_explicit(&sl->used, off + n, memory_order_relaxed);
    total = atomic_fetch_add_explicit(&s->total, off + n - used, memory_order_relaxed) + (off + n - used);
    raise_to(&s->peak_total, total);
    raise_to(&s->peak_thread, off + n);
    if (n) memset(sl->buf + off, 0, n);
    return sl->buf + off;
}

void mt_scratch_reset(mt_scratch *s, long slot)
{
    atomic_fetch_sub_explicit(&s->total,
                              atomic_exchange_explicit(&owned(s, slot)->used, 0, memory_order_relaxed),
                              memory_order_relaxed);
}

void mt_scratch_reset_all(mt_scratch *s)
{
    atomic_fetch_add_explicit(&s->reset_gen, 1, memory_order_release);
}

uint64_t mt_scratch_active(const mt_scratch *s)
{
    return atomic_load(&((mt_scratch *)s)->active);
}

void mt_scratch_get_stats(const mt_scratch *s, mt_scratch_stats *out)
{
    mt_scratch *m = (mt_scratch *)s;
    uint64_t g = atomic_load(&m->reset_gen);
    memset(out, 0, sizeof *out);
    out->active_threads = atomic_load(&m->active);
    out->total_allocated = atomic_load(&m->allocated);
    out->peak_total_used = atomic_load(&m->peak_total);
    out->peak_thread_usage = atomic_load(&m->peak_thread);
    for (size_t i = 0; i < m->max_threads; i++) {
        mt_slot *sl = &m->slots[i];
        uint64_t u;
        if (atomic_load(&sl->owner) == 0) continue;
        /* A slot whose owner has not yet applied a reset counts as empty. */
        u = atomic_load(&sl->seen_gen) == g ? atomic_load(&sl->used) : 0;
        out->total_used += u;
        if (u > out->max_thread_usage) out->max_thread_usage = u;
    }
}

void mt_scratch_reset_peaks(mt_scratch *s)
{
    mt_scratch_stats now;
    mt_scratch_get_stats(s, &now);
    atomic_store(&s->peak_total, now.total_used);
    atomic_store(&s->peak_thread, now.max_thread_usage);
}
