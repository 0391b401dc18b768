/* metrale C core.  See arena_core.h for the contract of each function. */
#define _POSIX_C_SOURCE 200809L     /* nanosleep under -std=c11 */
#include "arena_core.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const mt_buffer_names[MT_NBUF] = {
    "hidden_states", "residual", "norm_output", "qkv_output", "attn_output",
    "gate_logits", "gate_logits_f32", "moe_router_in_f32", "moe_output", "logits",
    "ssm_qkvz", "ssm_ba", "ssm_deinterleaved", "ssm_gates", "ssm_conv_out_f32",
    "scratch", "expert_gate_out", "expert_up_out", "expert_down_out",
    "splitk_workspace", "o_latent", "norm_unit_w", "hc_streams", "hc_post",
    "hc_comb", "hc_lowrank_scratch", "qsa_select_scratch", "ssd_scratch",
    "gdn_fla_scratch", "token_ids", "ffn_act_q8", "ffn_act_a", "ffn_act_scale",
    "ffn_act_scale_kmajor", "ffn_gate_up_fused", "fp8_act", "moe_fp8_scratch",
    "fp8_act_scale", "fp8_act_scale_kmajor", "q2_dequant_scratch", "lora_xa",
    "lora_delta", "lora_hact", "lora_seq_slot", "q2_act_q8", "ssm_rowwise_w_bf16",
};

const int mt_zero_all_ids[MT_N_ZERO_ALL] = {
    MT_HIDDEN_STATES, MT_RESIDUAL, MT_NORM_OUTPUT, MT_QKV_OUTPUT, MT_ATTN_OUTPUT,
    MT_GATE_LOGITS, MT_MOE_OUTPUT, MT_SSM_QKVZ, MT_SSM_BA, MT_SSM_DEINTERLEAVED,
    MT_SSM_GATES, MT_SSM_CONV_OUT_F32, MT_SPLITK_WORKSPACE, MT_EXPERT_GATE_OUT,
    MT_EXPERT_UP_OUT, MT_EXPERT_DOWN_OUT, MT_LOGITS, MT_SCRATCH,
};

const int mt_prefill_ids[MT_N_PREFILL] = {
    MT_HIDDEN_STATES, MT_RESIDUAL, MT_GATE_LOGITS, MT_EXPERT_GATE_OUT,
    MT_EXPERT_UP_OUT, MT_EXPERT_DOWN_OUT, MT_MOE_OUTPUT,
};

const int mt_rows_ids[MT_N_ROWS] = {
    MT_HIDDEN_STATES, MT_RESIDUAL, MT_NORM_OUTPUT, MT_QKV_OUTPUT, MT_ATTN_OUTPUT,
    MT_GATE_LOGITS, MT_MOE_OUTPUT, MT_SSM_QKVZ, MT_SSM_BA, MT_SSM_DEINTERLEAVED,
    MT_SSM_GATES, MT_SSM_CONV_OUT_F32, MT_EXPERT_GATE_OUT, MT_EXPERT_UP_OUT,
    MT_EXPERT_DOWN_OUT,
};

const int mt_checksum_ids[MT_N_CHECKSUM] = {
    MT_HIDDEN_STATES, MT_RESIDUAL, MT_NORM_OUTPUT, MT_QKV_OUTPUT, MT_ATTN_OUTPUT,
    MT_GATE_LOGITS, MT_MOE_OUTPUT, MT_SSM_QKVZ, MT_SSM_BA, MT_SSM_DEINTERLEAVED,
    MT_SSM_GATES, MT_SSM_CONV_OUT_F32, MT_EXPERT_GATE_OUT, MT_EXPERT_UP_OUT,
    MT_EXPERT_DOWN_OUT, MT_SPLITK_WORKSPACE,
};

/* Slab order: the 7 prefill buffers, then the other 11 zero_all buffers (the
 * trimmed ones before the three zeroed whole, so those merge into one range),
 * then the rest in canonical order. */
const int mt_slab_order[MT_NBUF] = {
    MT_HIDDEN_STATES, MT_RESIDUAL, MT_GATE_LOGITS, MT_EXPERT_GATE_OUT,
    MT_EXPERT_UP_OUT, MT_EXPERT_DOWN_OUT, MT_MOE_OUTPUT,
    MT_NORM_OUTPUT, MT_QKV_OUTPUT, MT_ATTN_OUTPUT, MT_SSM_QKVZ, MT_SSM_BA,
    MT_SSM_DEINTERLEAVED, MT_SSM_GATES, MT_SSM_CONV_OUT_F32,
    MT_SPLITK_WORKSPACE, MT_LOGITS, MT_SCRATCH,
    MT_GATE_LOGITS_F32, MT_MOE_ROUTER_IN_F32, MT_O_LATENT, MT_NORM_UNIT_W,
    MT_HC_STREAMS, MT_HC_POST, MT_HC_COMB, MT_HC_LOWRANK_SCRATCH,
    MT_QSA_SELECT_SCRATCH, MT_SSD_SCRATCH, MT_GDN_FLA_SCRATCH, MT_TOKEN_IDS,
    MT_FFN_ACT_Q8, MT_FFN_ACT_A, MT_FFN_ACT_SCALE, MT_FFN_ACT_SCALE_KMAJOR,
    MT_FFN_GATE_UP_FUSED, MT_FP8_ACT, MT_MOE_FP8_SCRATCH, MT_FP8_ACT_SCALE,
    MT_FP8_ACT_SCALE_KMAJOR, MT_Q2_DEQUANT_SCRATCH, MT_LORA_XA, MT_LORA_DELTA,
    MT_LORA_HACT, MT_LORA_SEQ_SLOT, MT_Q2_ACT_Q8, MT_SSM_ROWWISE_W_BF16,
};

/* ceil to a multiple of MT_ALIGN; -1 on overflow */
static int align_up(uint64_t x, uint64_t *out)
{
    if (x > UINT64_MAX - (MT_ALIGN - 1)) return -1;
    *out = (x + (MT_ALIGN - 1)) & ~(uint64_t)(MT_ALIGN - 1);
    return 0;
}

static mt_range group_range(const mt_layout *L, const int *ids, int n)
{
    mt_range r = {0, 0};
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < n; i++) {
        int b = ids[i];
        if (L->size[b] == 0) continue;
        if (L->offset[b] < lo) lo = L->offset[b];
        if (L->offset[b] + L->size[b] > hi) hi = L->offset[b] + L->size[b];
    }
    if (hi > 0) { r.offset = lo; r.length = hi - lo; }
    return r;
}

int mt_layout_plan(mt_layout *L, const uint64_t sizes[MT_NBUF], uint64_t max_batch_tokens)
{
    uint64_t cur = 0;
    memset(L, 0, sizeof(*L));
    L->max_batch_tokens = max_batch_tokens;
    for (int i = 0; i < MT_NBUF; i++) {
        int b = mt_slab_order[i];
        uint64_t n = sizes[b];
        L->size[b] = n;
        if (n == 0) continue;   /* NULL, no range (ARENA.md §2.4) */
        L->offset[b] = cur;
        if (n > UINT64_MAX - cur || align_up(cur + n, &cur) != 0) return -1;
    }
    L->slab_bytes = cur;
    L->zero_all = group_range(L, mt_zero_all_ids, MT_N_ZERO_ALL);
    L->zero_prefill = group_range(L, mt_prefill_ids, MT_N_PREFILL);
    return 0;
}

static int is_row_candidate(int b)
{
    for (int i = 0; i < MT_N_ROWS; i++)
        if (mt_rows_ids[i] == b) return 1;
    return 0;
}

static uint64_t ceil16(uint64_t x) { return (x + 15) / 16 * 16; }

/* ARENA.md §5.2 length rule for one token-major buffer of n bytes. */
static uint64_t rows_length(uint64_t n, uint64_t m, uint64_t tokens)
{
    uint64_t m16 = ceil16(m);
    if (n % m == 0) return n / m * tokens;
    if (n % m16 == 0) {
        uint64_t t16 = ceil16(tokens);
        return n / m16 * (t16 < m16 ? t16 : m16);
    }
    return n;
}

int mt_zero_rows_ranges(const mt_layout *L, uint64_t tokens, mt_range *out)
{
    uint64_t m = L->max_batch_tokens ? L->max_batch_tokens : 1;
    int count = 0;
    int prev_whole = 0;
    if (tokens >= m) {
        if (L->zero_all.length == 0) return 0;
        out[0] = L->zero_all;
        return 1;
    }
    /* Walk the Z buffers in slab order: merging is then a look at the previous range. */
    for (int i = 0; i < MT_N_ZERO_ALL; i++) {
        int b = mt_slab_order[i];
        uint64_t n = L->size[b], len;
        if (n == 0) continue;
        len = is_row_candidate(b) ? rows_length(n, m, tokens) : n;
        if (len == 0) { prev_whole = 0; continue; }
        /* Only a range that ends at its buffer's end may absorb the padding up
         * to the next buffer; a trimmed range's tail belongs to its buffer. */
        if (count > 0 && prev_whole) {
            mt_range *p = &out[count - 1];
            uint64_t end = p->offset + p->length, next;
            if (align_up(end, &next) == 0 && next == L->offset[b]) {
                p->length = L->offset[b] + len - p->offset;
                prev_whole = (len == n);
                continue;
            }
        }
        out[count].offset = L->offset[b];
        out[count].length = len;
        count++;
        prev_whole = (len == n);
    }
    return count;
}

void mt_checksum_f32(const void *data, size_t n, double out[3])
{
    const unsigned char *p = (const unsigned char *)data;
    double sum = 0.0, ssq = 0.0, sabs = 0.0;
    size_t lanes = n / 4;
    for (size_t i = 0; i < lanes; i++) {
        uint32_t bits = (uint32_t)p[4 * i] | ((uint32_t)p[4 * i + 1] << 8) |
                        ((uint32_t)p[4 * i + 2] << 16) | ((uint32_t)p[4 * i + 3] << 24);
        float f;
        double x;
        memcpy(&f, &bits, sizeof f);
        if (!isfinite(f)) continue;
        x = (double)f;
        sum += x;
        ssq += x * x;
        sabs += fabs(x);
    }
    out[0] = sum;
    out[1] = ssq;
    out[2] = sabs;
}

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
    return (cur > size || bytes > size - cur) ? -1 : 0;
}

uint64_t mt_cursor_load(const mt_cursor *c)
{
    return atomic_load_explicit(&((mt_cursor *)c)->value, memory_order_relaxed);
}

/* ---- arena lifetime ------------------------------------------------------ */

#define LIFE_RELEASED   ((uint64_t)1 << 63)
#define LIFE_EXPORT_ONE ((uint64_t)1 << 32)
#define LIFE_EXPORTS    (((uint64_t)1 << 63) - LIFE_EXPORT_ONE)   /* bits 32..62 */
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
     * access those operations made to the slab is done. */
    while (atomic_load_explicit(&l->state, memory_order_acquire) & LIFE_IN_FLIGHT) {
        struct timespec pause = {0, 20000};     /* 20 us: operations are memsets and copies */
        nanosleep(&pause, NULL);
    }
}

int mt_life_released(const mt_life *l)
{
    return (atomic_load_explicit(&((mt_life *)l)->state, memory_order_acquire) & LIFE_RELEASED) != 0;
}

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
                return -2;
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
    return -1;
}

void mt_scratch_release(mt_scratch *s, long slot, uint64_t claim)
{
    mt_slot *sl = &s->slots[slot];
    if (atomic_load(&sl->claim) != claim || atomic_load(&sl->owner) == 0) return;
    sl->user = NULL;
    atomic_store_explicit(&sl->used, 0, memory_order_relaxed);
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
        atomic_store_explicit(&sl->used, 0, memory_order_relaxed);
        atomic_store_explicit(&sl->seen_gen, g, memory_order_relaxed);
    }
    return sl;
}

unsigned char *mt_scratch_base(mt_scratch *s, long slot) { return s->slots[slot].buf; }

uint64_t mt_scratch_used(mt_scratch *s, long slot)
{
    return atomic_load_explicit(&owned(s, slot)->used, memory_order_relaxed);
}

unsigned char *mt_scratch_carve(mt_scratch *s, long slot, uint64_t n)
{
    mt_slot *sl = owned(s, slot);
    uint64_t used = atomic_load_explicit(&sl->used, memory_order_relaxed);
    uint64_t off = (used + 63) / 64 * 64;
    if (off > s->size || n > s->size - off) return NULL;
    atomic_store_explicit(&sl->used, off + n, memory_order_relaxed);
    if (n) memset(sl->buf + off, 0, n);
    return sl->buf + off;
}

void mt_scratch_reset(mt_scratch *s, long slot)
{
    atomic_store_explicit(&owned(s, slot)->used, 0, memory_order_relaxed);
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
