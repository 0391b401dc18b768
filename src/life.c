/* metrale C core: the arena's lifetime word.  See arena_core.h for the
 * contract of each function.  It keeps process-wide state (a thread-local
 * operation depth, the fork generation), so it is compiled into one extension
 * only (metrale._base._life), which every other module calls through: a copy per
 * extension would give each its own depth and generation. */
#define _POSIX_C_SOURCE 200809L     /* nanosleep under -std=c11 */
#include "arena_core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

/* ---- arena lifetime ------------------------------------------------------ */

#define LIFE_RELEASED   ((uint64_t)1 << 63)
#define LIFE_PAUSED     ((uint64_t)1 << 62)   /* no new operation or export starts */
#define LIFE_BUSY       ((uint64_t)1 << 61)   /* a reshape runs */
#define LIFE_CLOSING    ((uint64_t)1 << 60)   /* a release was refused: no new export */
#define LIFE_EXPORT_ONE ((uint64_t)1 << 32)
#define LIFE_EXPORTS    (((uint64_t)1 << 60) - LIFE_EXPORT_ONE)   /* bits 32..59 */
#define LIFE_IN_FLIGHT  (LIFE_EXPORT_ONE - 1)                       /* bits 0..31 */
/* In a slot's counter: its buffer sleeps (a partial sleep pauses the word but
 * leaves the other slots' exports to be made). */
#define SLOT_ASLEEP     ((uint64_t)1 << 63)
#define SLOT_COUNT      (SLOT_ASLEEP - 1)

struct mt_life {
    _Atomic uint64_t state;
    _Atomic uintptr_t reshaper;     /* the thread running a reshape (its tls_me), or 0 */
    unsigned long fork_gen;         /* mt_fork_generation() when made */
    int nslots;
    _Atomic uint64_t exports[];     /* per slot (buffer), to name them in a refusal */
};

/* Operations the calling thread is inside, over every arena. */
static _Thread_local unsigned long tls_life_depth;
/* Its address tells the threads apart. */
static _Thread_local char tls_me;

/* fork(): the child has one thread, so operations and reshapes counted in an
 * inherited word belong to threads that do not exist there.  Each fork bumps
 * the generation in the child; a word made before it then refuses everything
 * but mt_life_close, which does not wait. */
static _Atomic unsigned long fork_gen;

static void on_fork_child(void) { atomic_fetch_add_explicit(&fork_gen, 1, memory_order_relaxed); }

/* Registered when the library is loaded, before any word exists (and without
 * pthread_once, whose glibc 2.34 symbol would narrow the wheels' manylinux tag). */
__attribute__((constructor)) static void fork_register(void)
{
    pthread_atfork(NULL, NULL, on_fork_child);
}

unsigned long mt_fork_generation(void)
{
    return atomic_load_explicit(&fork_gen, memory_order_relaxed);
}

static inline int forked(const mt_life *l)
{
    return atomic_load_explicit(&fork_gen, memory_order_relaxed) != l->fork_gen;
}

mt_life *mt_life_new(int nslots)
{
    if (nslots < 1) nslots = 1;
    mt_life *l = (mt_life *)malloc(sizeof *l + (size_t)nslots * sizeof(_Atomic uint64_t));
    if (!l) return NULL;
    atomic_init(&l->state, 0);
    atomic_init(&l->reshaper, 0);
    l->fork_gen = mt_fork_generation();
    l->nslots = nslots;
    for (int i = 0; i < nslots; i++) atomic_init(&l->exports[i], 0);
    return l;
}

void mt_life_free(mt_life *l) { free(l); }

/* Add `one` to the field `mask` of the word unless refused.  Acquire: whatever
 * the caller then does with the slab follows this point. */
static int life_add(mt_life *l, uint64_t one, uint64_t mask, uint64_t refuse_closing)
{
    if (forked(l)) return MT_LIFE_FORKED;
    uint64_t s = atomic_load_explicit(&l->state, memory_order_relaxed);
    do {
        if (s & LIFE_RELEASED) return MT_LIFE_RELEASED;
        if (s & LIFE_PAUSED) return MT_LIFE_PAUSED;
        if (s & refuse_closing) return MT_LIFE_CLOSING;
        if ((s & mask) == mask) return MT_LIFE_FULL;
    } while (!atomic_compare_exchange_weak_explicit(&l->state, &s, s + one,
                                                    memory_order_acquire, memory_order_relaxed));
    return MT_LIFE_OK;
}

int mt_life_enter(mt_life *l)
{
    int rc = life_add(l, 1, LIFE_IN_FLIGHT, 0);
    if (rc == MT_LIFE_OK) tls_life_depth++;
    return rc;
}

/* Release: the operation's accesses to the slab happen before the drain ends. */
void mt_life_leave(mt_life *l)
{
    tls_life_depth--;
    atomic_fetch_sub_explicit(&l->state, 1, memory_order_release);
}

static int slot_asleep(mt_life *l, int slot)
{
    return (atomic_load_explicit(&l->exports[slot], memory_order_acquire) & SLOT_ASLEEP) != 0;
}

int mt_life_export(mt_life *l, int slot)
{
    if (slot < 0 || slot >= l->nslots) return MT_LIFE_FULL;
    if (forked(l)) return MT_LIFE_FORKED;
    /* A paused word refuses exports while a reshape runs, and while it
     * sleeps only those of the slots asleep. */
    uint64_t s = atomic_load_explicit(&l->state, memory_order_acquire);
    do {
        if (s & LIFE_RELEASED) return MT_LIFE_RELEASED;
        if ((s & LIFE_PAUSED) && ((s & LIFE_BUSY) || slot_asleep(l, slot))) return MT_LIFE_PAUSED;
        if (s & LIFE_CLOSING) return MT_LIFE_CLOSING;
        if ((s & LIFE_EXPORTS) == LIFE_EXPORTS) return MT_LIFE_FULL;
    } while (!atomic_compare_exchange_weak_explicit(&l->state, &s, s + LIFE_EXPORT_ONE,
                                                    memory_order_acquire, memory_order_acquire));
    /* A reshape may have begun and ended between the load and the exchange,
     * leaving the word as it was: its flags, written before it ended, are
     * read again. */
    if (slot_asleep(l, slot)) {
        atomic_fetch_sub_explicit(&l->state, LIFE_EXPORT_ONE, memory_order_release);
        return MT_LIFE_PAUSED;
    }
    atomic_fetch_add_explicit(&l->exports[slot], 1, memory_order_relaxed);
    return MT_LIFE_OK;
}

void mt_life_set_asleep(mt_life *l, int slot, int asleep)
{
    if (slot < 0 || slot >= l->nslots) return;
    if (asleep) atomic_fetch_or_explicit(&l->exports[slot], SLOT_ASLEEP, memory_order_relaxed);
    else atomic_fetch_and_explicit(&l->exports[slot], ~SLOT_ASLEEP, memory_order_relaxed);
}

void mt_life_unexport(mt_life *l, int slot)
{
    atomic_fetch_sub_explicit(&l->exports[slot], 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&l->state, LIFE_EXPORT_ONE, memory_order_release);
}

uint64_t mt_life_exports(const mt_life *l, int slot)
{
    if (slot < 0 || slot >= l->nslots) return 0;
    return atomic_load_explicit(&((mt_life *)l)->exports[slot], memory_order_relaxed) & SLOT_COUNT;
}

uint64_t mt_life_in_flight(const mt_life *l)
{
    return atomic_load_explicit(&((mt_life *)l)->state, memory_order_relaxed) & LIFE_IN_FLIGHT;
}

int mt_life_close(mt_life *l)
{
    int child = forked(l);
    uint64_t s = atomic_load_explicit(&l->state, memory_order_acquire);
    for (;;) {
        if (s & LIFE_RELEASED) return MT_LIFE_RELEASED;
        if (s & LIFE_EXPORTS) {
            /* Refused; from now on no new export starts, so the exports live
             * now are the last ones and a release after them succeeds. */
            if (atomic_compare_exchange_weak_explicit(&l->state, &s, s | LIFE_CLOSING,
                                                      memory_order_acq_rel, memory_order_acquire))
                return MT_LIFE_EXPORTED;
            continue;
        }
        if (!child) {
            if ((s & LIFE_BUSY) && atomic_load_explicit(&l->reshaper, memory_order_relaxed)
                                       == (uintptr_t)&tls_me)
                return MT_LIFE_SELF;
            if ((s & LIFE_IN_FLIGHT) && tls_life_depth > 0) return MT_LIFE_IN_FLIGHT;
        }
        if (atomic_compare_exchange_weak_explicit(&l->state, &s, s | LIFE_RELEASED,
                                                  memory_order_acq_rel, memory_order_acquire))
            return child ? MT_LIFE_FORKED : MT_LIFE_OK;
    }
}

void mt_life_reopen(mt_life *l)
{
    atomic_fetch_and_explicit(&l->state, ~LIFE_RELEASED, memory_order_acq_rel);
}

int mt_life_wait(mt_life *l, int until, long timeout_us)
{
    /* Acquire pairs with mt_life_leave's release: once the count reads 0, every
     * access those operations made to the slab is done.  A poll, so no wake-up
     * can be missed; bounded, so that the caller can check for signals. */
    uint64_t mask = LIFE_IN_FLIGHT | (until == MT_WAIT_ALL ? LIFE_BUSY : 0);
    struct timespec pause = {0, 20000};     /* 20 us: operations are memsets and copies */
    long waited = 0;
    if (forked(l)) return 1;
    while (atomic_load_explicit(&l->state, memory_order_acquire) & mask) {
        if (waited >= timeout_us) return 0;
        nanosleep(&pause, NULL);
        waited += 20;
    }
    return 1;
}

int mt_life_released(const mt_life *l)
{
    return (atomic_load_explicit(&((mt_life *)l)->state, memory_order_acquire) & LIFE_RELEASED) != 0;
}

int mt_life_reshape_begin(mt_life *l, const unsigned char *views_ok)
{
    if (forked(l)) return MT_LIFE_FORKED;
    uint64_t s = atomic_load_explicit(&l->state, memory_order_acquire);
    do {
        if (s & LIFE_RELEASED) return MT_LIFE_RELEASED;
        if (s & LIFE_BUSY) return MT_LIFE_BUSY;
        if ((s & LIFE_EXPORTS) && !views_ok) return MT_LIFE_EXPORTED;
        if (tls_life_depth > 0) return MT_LIFE_IN_FLIGHT;
    } while (!atomic_compare_exchange_weak_explicit(&l->state, &s, s | LIFE_PAUSED | LIFE_BUSY,
                                                    memory_order_acq_rel, memory_order_acquire));
    if (views_ok) {
        /* Paused: no export starts now.  One counted in the word reaches its
         * slot at once (mt_life_export adds to the word first, mt_life_unexport
         * takes from its slot first), so the slots add up to the word's count
         * once those in progress are done; then every live view is in a slot
         * and each must be allowed. */
        struct timespec pause = {0, 1000};
        for (;;) {
            uint64_t want = (atomic_load_explicit(&l->state, memory_order_acquire) & LIFE_EXPORTS)
                            / LIFE_EXPORT_ONE, sum = 0;
            int refused = 0;
            for (int i = 0; i < l->nslots; i++) {
                uint64_t k = atomic_load_explicit(&l->exports[i], memory_order_acquire) & SLOT_COUNT;
                sum += k;
                if (k && !views_ok[i]) refused = 1;
            }
            if (refused) {      /* as before the call: paused only if it was */
                uint64_t clear = LIFE_BUSY | ((s & LIFE_PAUSED) ? 0 : LIFE_PAUSED);
                atomic_fetch_and_explicit(&l->state, ~clear, memory_order_release);
                return MT_LIFE_EXPORTED;
            }
            if (sum == want) break;
            nanosleep(&pause, NULL);
        }
    }
    atomic_store_explicit(&l->reshaper, (uintptr_t)&tls_me, memory_order_relaxed);
    return MT_LIFE_OK;
}

void mt_life_reshape_end(mt_life *l, int stay_paused)
{
    uint64_t clear = LIFE_BUSY | (stay_paused ? 0 : LIFE_PAUSED);
    uint64_t set = stay_paused ? LIFE_PAUSED : 0;
    atomic_store_explicit(&l->reshaper, 0, memory_order_relaxed);
    uint64_t s = atomic_load_explicit(&l->state, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&l->state, &s, (s & ~clear) | set,
                                                  memory_order_release, memory_order_relaxed))
        ;
}

int mt_life_paused(const mt_life *l)
{
    return (atomic_load_explicit(&((mt_life *)l)->state, memory_order_acquire) & LIFE_PAUSED) != 0;
}

int mt_life_forked(const mt_life *l) { return forked(l); }
