/* metrale C core: the torch pool, a sub-allocator over one reserved range.
 * See arena_core.h for the contract of each function.  Compiled, with
 * pool_slots.c (torch's allocator functions, whose slots are process-wide
 * state), into one extension only (metrale._arena._pool). */
#include "arena_core.h"
#include "pool_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { MAPPED = 1, USED = 2 };

typedef struct chunk { uint64_t first, count, handle; } chunk;

struct mt_pool {
    pthread_mutex_t mu;
    mt_pool_ops ops;
    uint64_t base, npages, granule;
    unsigned char *state;       /* MAPPED | USED per page */
    uint64_t *seg;              /* pages of the segment that starts at a page, else 0 */
    uint64_t *asked;            /* the bytes that segment was asked for (0 for 0) */
    chunk *chunks;              /* mapped now, sorted by first page, disjoint */
    uint64_t nchunks;
    chunk *orphans;             /* unmapped, release failed: (handle, count) retried */
    uint64_t norphans;
    uint64_t mapped, used, segments;    /* pages mapped / in segments; segments out */
    uint64_t peak_mapped, peak_used;
    uint64_t creates, allocs, frees, refused;
    int asleep;
    int held;                   /* mt_pool_hold: allocations refused, as asleep */
    int release_err;            /* the last failed release's code */
};

mt_pool *mt_pool_new(uint64_t base, uint64_t npages, uint64_t granule, const mt_pool_ops *ops)
{
    mt_pool *p;
    if (npages == 0 || granule == 0 || npages > UINT64_MAX / granule)
        return NULL;
    p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->state = calloc(npages, 1);
    p->seg = calloc(npages, sizeof *p->seg);
    p->asked = calloc(npages, sizeof *p->asked);
    p->chunks = calloc(npages, sizeof *p->chunks);    /* a chunk holds a page at least */
    p->orphans = calloc(npages, sizeof *p->orphans);
    if (p->state == NULL || p->seg == NULL || p->asked == NULL || p->chunks == NULL
            || p->orphans == NULL || pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p->state); free(p->seg); free(p->asked); free(p->chunks); free(p->orphans);
        free(p);
        return NULL;
    }
    p->ops = *ops;
    p->base = base;
    p->npages = npages;
    p->granule = granule;
    return p;
}

void mt_pool_free(mt_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_destroy(&p->mu);
    free(p->state); free(p->seg); free(p->asked); free(p->chunks); free(p->orphans); free(p);
}

/* ---- chunks ---------------------------------------------------------------- */

static void mark(mt_pool *p, uint64_t first, uint64_t count, unsigned char bit, int on)
{
    for (uint64_t i = first; i < first + count; i++)
        p->state[i] = on ? (p->state[i] | bit) : (p->state[i] & ~bit);
}

static void insert_chunk(mt_pool *p, chunk c)
{
    uint64_t i = p->nchunks;
    while (i > 0 && p->chunks[i - 1].first > c.first) {
        p->chunks[i] = p->chunks[i - 1];
        i--;
    }
    p->chunks[i] = c;
    p->nchunks++;
    p->mapped += c.count;
    mark(p, c.first, c.count, MAPPED, 1);
    if (p->mapped > p->peak_mapped)
        p->peak_mapped = p->mapped;
}

static void remove_chunk(mt_pool *p, uint64_t i)
{
    chunk c = p->chunks[i];
    memmove(&p->chunks[i], &p->chunks[i + 1], (p->nchunks - i - 1) * sizeof *p->chunks);
    p->nchunks--;
    p->mapped -= c.count;
    mark(p, c.first, c.count, MAPPED, 0);
}

/* Release an unmapped chunk's handle; if that fails it is kept as an orphan. */
static int drop_handle(mt_pool *p, chunk c)
{
    int rc = p->ops.release(p->ops.ctx, c.handle, c.count * p->granule);
    if (rc != 0) {
        p->orphans[p->norphans++] = c;
        p->release_err = rc;
    }
    return rc;
}

static void retry_orphans(mt_pool *p)
{
    uint64_t kept = 0;
    for (uint64_t i = 0; i < p->norphans; i++) {
        chunk c = p->orphans[i];
        int rc = p->ops.release(p->ops.ctx, c.handle, c.count * p->granule);
        if (rc != 0) {
            p->orphans[kept++] = c;
            p->release_err = rc;
        }
    }
    p->norphans = kept;
}

/* Map [first, first + count) with one new handle: 0 or the operation's code,
 * nothing left behind on failure (a handle whose release fails is an orphan). */
static int map_run(mt_pool *p, uint64_t first, uint64_t count)
{
    uint64_t h = 0, n = count * p->granule;
    int rc = p->ops.create(p->ops.ctx, n, &h);
    if (rc != 0)
        return rc;
    p->creates++;
    rc = p->ops.map(p->ops.ctx, p->base + first * p->granule, n, h);
    if (rc != 0) {
        chunk c = {first, count, h};
        drop_handle(p, c);
        return rc;
    }
    insert_chunk(p, (chunk){first, count, h});
    return 0;
}

/* Unmap the chunks this call mapped (first pages in `made`), best effort. */
static void undo_runs(mt_pool *p, const uint64_t *made, uint64_t nmade)
{
    for (uint64_t k = 0; k < nmade; k++)
        for (uint64_t i = 0; i < p->nchunks; i++)
            if (p->chunks[i].first == made[k]) {
                chunk c = p->chunks[i];
                if (p->ops.unmap(p->ops.ctx, p->base + c.first * p->granule,
                                 c.count * p->granule) == 0) {
                    remove_chunk(p, i);
                    drop_handle(p, c);
                }
                break;
            }
}

/* Map every unmapped page of [first, first + count), one handle per run of
 * them (pages with bit `need` set only, when need != 0): all or nothing. */
static int map_gaps(mt_pool *p, uint64_t first, uint64_t count, unsigned char need, int *err)
{
    uint64_t made_small[8], *made = made_small, nmade = 0, i = first, end = first + count;
    int rc = MT_OK;
    if (count / 2 + 1 > 8) {
        made = malloc((count / 2 + 1) * sizeof *made);
        if (made == NULL)
            return MT_ERR_NOMEM;
    }
    while (i < end) {
        uint64_t j;
        if ((p->state[i] & MAPPED) || (need && !(p->state[i] & need))) {
            i++;
            continue;
        }
        for (j = i; j < end && !(p->state[j] & MAPPED) && (!need || (p->state[j] & need)); j++)
            ;
        int e = map_run(p, i, j - i);
        if (e != 0) {
            *err = e;
            rc = MT_POOL_DEVICE;
            undo_runs(p, made, nmade);
            break;
        }
        made[nmade++] = i;
        i = j;
    }
    if (made != made_small)
        free(made);
    return rc;
}

/* ---- segments -------------------------------------------------------------- */

int mt_pool_alloc_locked(mt_pool *p, uint64_t n, uint64_t *out, int *err)
{
    uint64_t need, best = UINT64_MAX, best_cost = UINT64_MAX, best_run = UINT64_MAX;
    int rc;
    need = n == 0 ? 1 : (n - 1) / p->granule + 1;
    if (p->asleep || p->held) {
        rc = MT_POOL_ASLEEP;
        goto refused;
    }
    retry_orphans(p);
    /* Each maximal run of free pages long enough; in it, the window that
     * needs the fewest pages mapped.  The best window: fewest to map, then in
     * the shortest run (long runs stay whole), then the lowest address. */
    for (uint64_t s = 0; s < p->npages && need <= p->npages;) {
        uint64_t e = s, unmapped = 0, cost, at;
        if (p->state[s] & USED) {
            s++;
            continue;
        }
        while (e < p->npages && !(p->state[e] & USED))
            e++;
        if (e - s >= need) {
            for (uint64_t i = s; i < s + need; i++)
                unmapped += !(p->state[i] & MAPPED);
            cost = unmapped;
            at = s;
            for (uint64_t w = s + 1; w + need <= e && cost > 0; w++) {
                unmapped += !(p->state[w + need - 1] & MAPPED);
                unmapped -= !(p->state[w - 1] & MAPPED);
                if (unmapped < cost) {
                    cost = unmapped;
                    at = w;
                }
            }
            if (cost < best_cost || (cost == best_cost && e - s < best_run)) {
                best = at;
                best_cost = cost;
                best_run = e - s;
            }
        }
        s = e;
    }
    if (best == UINT64_MAX) {
        rc = MT_POOL_FULL;
        goto refused;
    }
    rc = map_gaps(p, best, need, 0, err);
    if (rc != MT_OK)
        goto refused;
    mark(p, best, need, USED, 1);
    p->seg[best] = need;
    p->asked[best] = n;
    p->used += need;
    p->segments++;
    p->allocs++;
    if (p->used > p->peak_used)
        p->peak_used = p->used;
    *out = p->base + best * p->granule;
    return MT_OK;
refused:
    p->refused++;
    return rc;
}

int mt_pool_alloc(mt_pool *p, uint64_t n, uint64_t *out, int *err)
{
    int rc;
    pthread_mutex_lock(&p->mu);
    rc = mt_pool_alloc_locked(p, n, out, err);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int mt_pool_release_locked(mt_pool *p, uint64_t ptr, uint64_t n)
{
    uint64_t page, pages;
    if (ptr < p->base || (ptr - p->base) % p->granule != 0
            || (page = (ptr - p->base) / p->granule) >= p->npages)
        return MT_POOL_FOREIGN;
    pages = p->seg[page];
    if (pages == 0)
        return MT_POOL_FOREIGN;
    if (n != 0 && n != p->asked[page])
        return MT_POOL_SIZE;
    mark(p, page, pages, USED, 0);
    p->seg[page] = 0;
    p->asked[page] = 0;
    p->used -= pages;
    p->segments--;
    p->frees++;
    return MT_OK;
}

int mt_pool_release(mt_pool *p, uint64_t ptr, uint64_t n)
{
    int rc;
    pthread_mutex_lock(&p->mu);
    rc = mt_pool_release_locked(p, ptr, n);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

static int touches_segment(const mt_pool *p, chunk c)
{
    for (uint64_t i = c.first; i < c.first + c.count; i++)
        if (p->state[i] & USED)
            return 1;
    return 0;
}

int mt_pool_trim(mt_pool *p, uint64_t *unmapped, int *err)
{
    int rc = MT_OK;
    *unmapped = 0;
    pthread_mutex_lock(&p->mu);
    if (p->held || p->asleep) { /* a sleep or wake moves the segments' pages */
        pthread_mutex_unlock(&p->mu);
        return MT_OK;
    }
    retry_orphans(p);
    for (uint64_t i = 0; i < p->nchunks;) {
        chunk c = p->chunks[i];
        int e;
        if (touches_segment(p, c)) {
            i++;
            continue;
        }
        e = p->ops.unmap(p->ops.ctx, p->base + c.first * p->granule, c.count * p->granule);
        if (e != 0) {
            if (rc == MT_OK) {
                rc = MT_POOL_DEVICE;
                *err = e;
            }
            i++;
            continue;
        }
        remove_chunk(p, i);
        *unmapped += c.count * p->granule;
        drop_handle(p, c);      /* kept as an orphan on failure: not the trim's failure */
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int mt_pool_unmap_chunk(mt_pool *p, uint64_t offset, int *gone, int *err)
{
    int rc = MT_POOL_FOREIGN;
    *gone = 0;
    pthread_mutex_lock(&p->mu);
    for (uint64_t i = 0; i < p->nchunks; i++) {
        chunk c = p->chunks[i];
        if (c.first * p->granule != offset)
            continue;
        int e = p->ops.unmap(p->ops.ctx, p->base + c.first * p->granule, c.count * p->granule);
        if (e != 0) {
            *err = e;
            rc = MT_POOL_DEVICE;
            break;
        }
        remove_chunk(p, i);
        *gone = 1;
        e = drop_handle(p, c);
        rc = e == 0 ? MT_OK : MT_POOL_DEVICE;
        if (e != 0)
            *err = e;
        break;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int mt_pool_commit(mt_pool *p, uint64_t offset, uint64_t bytes, int *err)
{
    int rc = MT_OK;
    uint64_t first, end;
    pthread_mutex_lock(&p->mu);
    first = offset / p->granule;
    end = bytes ? (offset + bytes - 1) / p->granule + 1 : first;
    if (end > p->npages)
        end = p->npages;
    retry_orphans(p);
    if (first < end)
        rc = map_gaps(p, first, end - first, 0, err);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void mt_pool_set_asleep(mt_pool *p, int on)
{
    pthread_mutex_lock(&p->mu);
    p->asleep = on != 0;
    pthread_mutex_unlock(&p->mu);
}

void mt_pool_hold(mt_pool *p, int on)
{
    pthread_mutex_lock(&p->mu);
    p->held = on != 0;
    pthread_mutex_unlock(&p->mu);
}

int mt_pool_close(mt_pool *p, int force, int *err)
{
    int rc = MT_OK;
    pthread_mutex_lock(&p->mu);
    if (p->segments > 0 && !force) {
        rc = MT_POOL_IN_USE;
        goto out;
    }
    for (uint64_t i = p->nchunks; i-- > 0;) {
        chunk c = p->chunks[i];
        int e = p->ops.unmap(p->ops.ctx, p->base + c.first * p->granule, c.count * p->granule);
        if (e != 0) {
            if (rc == MT_OK) {
                rc = MT_POOL_DEVICE;
                *err = e;
            }
            continue;
        }
        remove_chunk(p, i);
        drop_handle(p, c);
    }
    retry_orphans(p);
    if (rc == MT_OK && p->norphans > 0) {
        rc = MT_POOL_DEVICE;
        *err = p->release_err;
    }
    if (rc == MT_OK) {
        memset(p->state, 0, p->npages);
        memset(p->seg, 0, p->npages * sizeof *p->seg);
        memset(p->asked, 0, p->npages * sizeof *p->asked);
        p->used = p->segments = 0;
        p->asleep = 0;
    }
out:
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void mt_pool_get_stats(mt_pool *p, mt_pool_stats *o)
{
    pthread_mutex_lock(&p->mu);
    o->reserved = p->npages * p->granule;
    o->committed = p->mapped * p->granule;
    o->in_use = p->used * p->granule;
    o->peak_committed = p->peak_mapped * p->granule;
    o->peak_in_use = p->peak_used * p->granule;
    o->segments = p->segments;
    o->chunks = p->nchunks;
    o->orphans = p->norphans;
    o->creates = p->creates;
    o->allocs = p->allocs;
    o->frees = p->frees;
    o->refused = p->refused;
    o->asleep = p->asleep;
    pthread_mutex_unlock(&p->mu);
}

uint64_t mt_pool_segments(mt_pool *p, mt_range *out, uint64_t cap)
{
    uint64_t k = 0;
    pthread_mutex_lock(&p->mu);
    for (uint64_t i = 0; i < p->npages; i++)
        if (p->seg[i] != 0) {
            if (k < cap) {
                out[k].offset = i * p->granule;
                out[k].length = p->seg[i] * p->granule;
            }
            k++;
        }
    pthread_mutex_unlock(&p->mu);
    return k;
}

uint64_t mt_pool_chunks(mt_pool *p, mt_range *out, uint64_t cap)
{
    uint64_t k;
    pthread_mutex_lock(&p->mu);
    for (k = 0; k < p->nchunks && k < cap; k++) {
        out[k].offset = p->chunks[k].first * p->granule;
        out[k].length = p->chunks[k].count * p->granule;
    }
    k = p->nchunks;
    pthread_mutex_unlock(&p->mu);
    return k;
}

void mt_pool_lock(mt_pool *p) { pthread_mutex_lock(&p->mu); }
void mt_pool_unlock(mt_pool *p) { pthread_mutex_unlock(&p->mu); }
