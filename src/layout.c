/* metrale C core: slab layout for a buffer table given at run time, zero
 * ranges and the checksum lanes.  See arena_core.h for the contract of each
 * function. */
#include "arena_core.h"
#include "debug.h"
#include "metrale/kernels/zero_ranges.h"

#include <math.h>
#include <string.h>

/* ceil to a multiple of MT_ALIGN */
static int align_up(uint64_t x, uint64_t *out)
{
    if (x > UINT64_MAX - (MT_ALIGN - 1)) return MT_ERR_OVERFLOW;
    *out = (x + (MT_ALIGN - 1)) & ~(uint64_t)(MT_ALIGN - 1);
    return MT_OK;
}

/* The bytes a live buffer of n bytes spans with its guard band: up to the
 * next MT_ALIGN boundary plus L->guard (debug layouts); just n without one. */
static int with_guard(const mt_layout *L, uint64_t n, uint64_t *out)
{
    if (L->guard == 0) { *out = n; return MT_OK; }
    if (align_up(n, out) != MT_OK || *out > UINT64_MAX - L->guard) return MT_ERR_OVERFLOW;
    *out += L->guard;
    return MT_OK;
}

/* debug.h: the band after a live buffer is what with_guard adds to it. */
int mt_guard_ranges(const mt_layout *L, int *ids, mt_range *out)
{
    int count = 0;
    uint64_t span;
    if (L->guard == 0) return 0;
    for (int i = 0; i < L->n; i++) {
        int b = L->order[i];
        if (L->size[b] == 0 || with_guard(L, L->size[b], &span) != MT_OK) continue;
        ids[count] = b;
        out[count].offset = L->offset[b] + L->size[b];
        out[count].length = span - L->size[b];
        count++;
    }
    return count;
}

static mt_range group_range(const mt_layout *L, unsigned group)
{
    mt_range r = {0, 0};
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int b = 0; b < L->n; b++) {
        if (!(L->flags[b] & group) || L->size[b] == 0) continue;
        if (L->offset[b] < lo) lo = L->offset[b];
        if (L->offset[b] + L->size[b] > hi) hi = L->offset[b] + L->size[b];
    }
    if (hi > 0) { r.offset = lo; r.length = hi - lo; }
    return r;
}

/* The part of the slab a buffer goes to (see mt_layout): the step inputs
 * first (token ids, the others, the decode metadata last, so that one copy
 * reaches them all), then the zero_prefill_essentials buffers, the other
 * row-trimmed ones, the rest of zero_all and everything else. */
enum { MT_NPARTS = 7, MT_PART_TIGHT = 1 };
static int slab_part(unsigned flags)
{
    if (flags & MT_STEP_IDS) return 0;
    if (flags & MT_STEP_IN) return 1;
    if (flags & MT_STEP_META) return 2;
    if (flags & MT_IN_PREFILL) return 3;
    if (flags & MT_IN_ROWS) return 4;
    if (flags & MT_IN_ZERO_ALL) return 5;
    return 6;
}

static void slab_order(mt_layout *L)
{
    int k = 0;
    for (int part = 0; part < MT_NPARTS; part++)
        for (int b = 0; b < L->n; b++)
            if (slab_part(L->flags[b]) == part) L->order[k++] = b;
}

static int good_granularity(uint64_t g) { return g >= MT_ALIGN && (g & (g - 1)) == 0; }

int mt_layout_table(mt_layout *L, int n, const unsigned *flags, const uint64_t *align)
{
    memset(L, 0, sizeof(*L));
    if (n < 0 || n > MT_MAX_BUFFERS) return MT_ERR_LIMIT;
    for (int b = 0; b < n; b++) {
        if (!good_granularity(align[b])) return MT_ERR_LIMIT;
        if ((flags[b] & MT_IN_ROWS) && !(flags[b] & (MT_ROWS_BY_M | MT_ROWS_BY_M16)))
            return MT_ERR_LIMIT;
    }
    L->n = n;
    if (n > 0) {
        memcpy(L->flags, flags, (size_t)n * sizeof *flags);
        memcpy(L->align, align, (size_t)n * sizeof *align);
    }
    slab_order(L);
    return MT_OK;
}

/* Forget a previous plan, keep the table. */
static void reset_plan(mt_layout *L)
{
    size_t n = (size_t)L->n;
    memset(L->size, 0, n * sizeof L->size[0]);
    memset(L->offset, 0, n * sizeof L->offset[0]);
    memset(L->room, 0, n * sizeof L->room[0]);
    L->slab_bytes = L->max_batch_tokens = L->guard = 0;
    L->base_align = MT_ALIGN;
    L->zero_all.offset = L->zero_all.length = 0;
    L->zero_prefill.offset = L->zero_prefill.length = 0;
    L->reserved = 0;
}

int mt_layout_plan(mt_layout *L, const uint64_t *sizes, uint64_t max_batch_tokens,
                   uint64_t guard)
{
    uint64_t cur = 0;
    reset_plan(L);
    if (guard % MT_ALIGN) return MT_ERR_LIMIT;
    L->guard = guard;
    L->max_batch_tokens = max_batch_tokens;
    for (int i = 0; i < L->n; i++) {
        int b = L->order[i];
        uint64_t n = sizes[b];
        L->size[b] = n;
        if (n == 0) continue;   /* an empty buffer is NULL: no range */
        if (mt_round_up(cur, L->align[b], &cur) != MT_OK) return MT_ERR_OVERFLOW;
        L->offset[b] = cur;
        if (L->align[b] > L->base_align) L->base_align = L->align[b];
        if (n > UINT64_MAX - cur || align_up(cur + n, &cur) != MT_OK) return MT_ERR_OVERFLOW;
        if (guard > UINT64_MAX - cur) return MT_ERR_OVERFLOW;
        cur += guard;
    }
    /* the backend aligns the allocation to MT_ALIGN only: room to move the
     * base up to the largest alignment a buffer asks for */
    if (cur && L->base_align - MT_ALIGN > UINT64_MAX - cur) return MT_ERR_OVERFLOW;
    L->slab_bytes = cur ? cur + (L->base_align - MT_ALIGN) : 0;
    L->zero_all = group_range(L, MT_IN_ZERO_ALL);
    L->zero_prefill = group_range(L, MT_IN_PREFILL);
    return MT_OK;
}

static uint64_t ceil16(uint64_t x) { return (x + 15) / 16 * 16; }

/* One entry per zero_all buffer; a row-trimmed one gets the kind its rule
 * names: rows of max_batch_tokens ("M"), or rows of ceil16(max_batch_tokens)
 * ("Mp": the GEMM-tiled buffers); by both rules ("M|Mp"), rows of each
 * rounded up (its live part in either layout is inside).  A size its named
 * rows do not divide (a 256-byte floor of a buffer the model does not use,
 * which the reference's formulas give) is cleared whole: more than its live
 * rows, never less (docs/buffer-sets.md says so; nothing is guessed). */
static void rows_entry(const mt_layout *L, int b, uint64_t m, mt_rows_entry *e)
{
    uint64_t size = L->size[b], m16 = ceil16(m);
    unsigned f = L->flags[b];
    memset(e, 0, sizeof *e);
    e->offset = L->offset[b];
    e->size = size;
    e->hi = size;
    e->pad_to = e->offset + size;
    e->kind = MT_ROWS_WHOLE;
    if (!(f & MT_IN_ROWS)) return;
    if ((f & MT_ROWS_BY_M) && (f & MT_ROWS_BY_M16)) {
        e->kind = MT_ROWS_BOTH;
        e->row = size / m + (size % m != 0);
        e->row16 = size / m16 + (size % m16 != 0);
    } else if ((f & MT_ROWS_BY_M) && size % m == 0) {
        e->kind = MT_ROWS_M;
        e->row = size / m;
    } else if ((f & MT_ROWS_BY_M16) && size % m16 == 0) {
        e->kind = MT_ROWS_M16;
        e->row = size / m16;
    }
}

int mt_rows_args_init(const mt_layout *L, uint64_t hole_lo, uint64_t hole_hi, mt_rows_args *a)
{
    uint64_t m = L->max_batch_tokens ? L->max_batch_tokens : 1, end;
    int n = 0;
    memset(a, 0, sizeof(*a));
    a->m = m;
    a->m16 = ceil16(m);
    for (int i = 0; i < L->n; i++) {
        int b = L->order[i];
        uint64_t size = L->size[b];
        mt_rows_entry e;
        if (!(L->flags[b] & MT_IN_ZERO_ALL) || size == 0) continue;
        rows_entry(L, b, m, &e);
        /* Room for this buffer's entries only (two where the hole splits it):
         * reserving two for every buffer refused 30 buffers and a split, the
         * most a buffer set may have (MT_MAX_ROWS_ENTRIES - 1 and one more). */
        if (hole_lo < hole_hi && hole_lo < e.offset + size && e.offset < hole_hi) {
            uint64_t cut_lo = hole_lo > e.offset ? hole_lo - e.offset : 0;
            uint64_t cut_hi = hole_hi - e.offset < size ? hole_hi - e.offset : size;
            if (n + (cut_lo > 0) + (cut_hi < size) > MT_MAX_ROWS_ENTRIES) return -1;
            if (cut_lo > 0) { a->e[n] = e; a->e[n].hi = cut_lo; n++; }
            if (cut_hi < size) { a->e[n] = e; a->e[n].lo = cut_hi; n++; }
        } else {
            if (n + 1 > MT_MAX_ROWS_ENTRIES) return -1;     /* more than a set may have */
            a->e[n++] = e;
        }
    }
    /* Adjacent entries meet through the padding between them: on a plain
     * layout any padding (its zero_all buffers are contiguous), else only up
     * to MT_ALIGN (a reserved layout's gaps may be unmapped, a guard band is
     * not zeroed). */
    for (int i = 0; i + 1 < n; i++) {
        uint64_t next = a->e[i + 1].offset;
        end = a->e[i].offset + a->e[i].size;
        if (next <= end) continue;
        /* Never across the hole: a buffer the hole covers whole has no entry,
         * so its neighbours' padding would span it (and clear the count). */
        if (hole_lo < hole_hi && hole_lo < next && end < hole_hi) continue;
        if ((!L->reserved && !L->guard) || (align_up(end, &end) == MT_OK && end == next))
            a->e[i].pad_to = next;
    }
    a->n = n;
    return n;
}

int mt_zero_rows_ranges(const mt_layout *L, uint64_t tokens, mt_range *out)
{
    mt_rows_args a;
    unsigned long long s, e, t;
    int count = 0;
    mt_rows_args_init(L, 0, 0, &a);
    t = tokens < a.m ? tokens : a.m;
    for (int i = 0; i < a.n; i++) {
        mt_rows_segment(&a, i, t, &s, &e);
        if (e == s) continue;
        if (count > 0 && out[count - 1].offset + out[count - 1].length == s) {
            out[count - 1].length = e - out[count - 1].offset;
            continue;
        }
        out[count].offset = s;
        out[count].length = e - s;
        count++;
    }
    return count;
}

uint64_t mt_rows_length(const mt_layout *L, int buf, uint64_t tokens)
{
    uint64_t m = L->max_batch_tokens ? L->max_batch_tokens : 1;
    mt_rows_entry e;
    rows_entry(L, buf, m, &e);
    return mt_rows_live(&e, ceil16(m), tokens < m ? tokens : m);
}

uint64_t mt_rows_stride(const mt_layout *L, int buf)
{
    mt_rows_entry e;
    rows_entry(L, buf, L->max_batch_tokens ? L->max_batch_tokens : 1, &e);
    return e.kind == MT_ROWS_BOTH ? 0 : e.row;
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


uint64_t mt_layout_base(const mt_layout *L, uint64_t p)
{
    return (p + (L->base_align - 1)) & ~(L->base_align - 1);
}


/* ---- reserved layouts ------------------------------------------------------- */

int mt_round_up(uint64_t x, uint64_t g, uint64_t *out)
{
    if (x > UINT64_MAX - (g - 1)) return MT_ERR_OVERFLOW;
    *out = (x + (g - 1)) & ~(g - 1);
    return MT_OK;
}

int mt_layout_plan_reserved(mt_layout *L, const uint64_t *sizes, const uint64_t *reserve,
                            uint64_t max_batch_tokens, uint64_t gran, uint64_t guard)
{
    uint64_t cur = 0, end, span;
    int rc;
    if (!good_granularity(gran) || guard % MT_ALIGN) return MT_ERR_LIMIT;
    reset_plan(L);
    L->reserved = 1;
    L->guard = guard;
    L->base_align = gran;
    for (int i = 0; i < L->n; i++) {
        int b = L->order[i];
        if (sizes[b] > reserve[b]) return MT_ERR_LIMIT;
        if (reserve[b] == 0) continue;      /* never anything: no sub-range */
        if (mt_round_up(cur, L->align[b], &cur) != MT_OK) return MT_ERR_OVERFLOW;
        if (L->align[b] > L->base_align) L->base_align = L->align[b];
        L->offset[b] = cur;
        if ((rc = with_guard(L, reserve[b], &span)) != MT_OK) return rc;
        if (span > UINT64_MAX - cur) return MT_ERR_OVERFLOW;
        /* Each sub-range (with its guard band) ends on a granule so that it
         * grows alone, except the step inputs' before the decode metadata:
         * the next follows at once (one upload reaches them all) and they
         * share the granules between them. */
        if (slab_part(L->flags[b]) <= MT_PART_TIGHT)
            rc = align_up(cur + span, &end);
        else
            rc = mt_round_up(cur + span, gran, &end);
        if (rc != MT_OK) return rc;
        L->room[b] = end - cur;
        cur = end;
    }
    /* the reservation is aligned to the granularity only (as for mt_layout_plan) */
    if (cur && L->base_align - gran > UINT64_MAX - cur) return MT_ERR_OVERFLOW;
    L->slab_bytes = cur ? cur + (L->base_align - gran) : 0;
    return mt_layout_resize(L, sizes, max_batch_tokens, gran);
}

int mt_layout_resize(mt_layout *L, const uint64_t *sizes, uint64_t max_batch_tokens,
                     uint64_t gran)
{
    uint64_t span;
    if (!L->reserved || !good_granularity(gran)) return MT_ERR_LIMIT;
    for (int b = 0; b < L->n; b++)
        if (sizes[b] && (with_guard(L, sizes[b], &span) != MT_OK || span > L->room[b]))
            return MT_ERR_LIMIT;
    for (int b = 0; b < L->n; b++) L->size[b] = sizes[b];
    L->max_batch_tokens = max_batch_tokens;
    L->zero_all = group_range(L, MT_IN_ZERO_ALL);
    L->zero_prefill = group_range(L, MT_IN_PREFILL);
    return MT_OK;
}

/* Append [offset, offset + length) (offset >= the last range's offset) to
 * out[0..count), merging it with the last range when that one, its end
 * rounded up to `align`, reaches where this starts (touching or overlapping). */
static int append_merged(mt_range *out, int count, uint64_t offset, uint64_t length, uint64_t align)
{
    if (count > 0) {
        mt_range *p = &out[count - 1];
        uint64_t end;
        if (mt_round_up(p->offset + p->length, align, &end) == MT_OK && end >= offset) {
            if (offset + length > p->offset + p->length) p->length = offset + length - p->offset;
            return count;
        }
    }
    out[count].offset = offset;
    out[count].length = length;
    return count + 1;
}

int mt_group_ranges(const mt_layout *L, unsigned group, mt_range *out)
{
    int count = 0;
    if (!L->reserved && !L->guard) {    /* contiguous: the span, padding included */
        mt_range r = group == MT_IN_PREFILL ? L->zero_prefill : L->zero_all;
        if (r.length == 0) return 0;
        out[0] = r;
        return 1;
    }
    for (int i = 0; i < L->n; i++) {
        int b = L->order[i];
        if (!(L->flags[b] & group) || L->size[b] == 0) continue;
        count = append_merged(out, count, L->offset[b], L->size[b], MT_ALIGN);
    }
    return count;
}

int mt_commit_needed(const mt_layout *L, uint64_t gran, mt_range *out)
{
    int count = 0;
    uint64_t lo, hi, n;
    for (int i = 0; i < L->n; i++) {
        int b = L->order[i];
        /* the step inputs before the decode metadata keep their whole room,
         * empty or not: a step's upload runs over them in one copy, padding
         * (and guard bands) included */
        int tight = slab_part(L->flags[b]) <= MT_PART_TIGHT;
        if (tight ? L->room[b] == 0 : L->size[b] == 0) continue;
        if (tight) n = L->room[b];
        else if (with_guard(L, L->size[b], &n) != MT_OK) continue;
        /* the granules the buffer touches (token_ids and scratch may share one) */
        lo = L->offset[b] & ~(gran - 1);
        if (mt_round_up(L->offset[b] + n, gran, &hi) != MT_OK) continue;
        count = append_merged(out, count, lo, hi - lo, 1);
    }
    return count;
}

int mt_chunk_needed(const mt_range *need, int nneed, uint64_t offset, uint64_t length)
{
    for (int i = 0; i < nneed; i++)
        if (need[i].offset < offset + length && offset < need[i].offset + need[i].length)
            return 1;
    return 0;
}

int mt_commit_gaps(const mt_range *need, int nneed, const mt_range *have, int nhave,
                   mt_range *out)
{
    int count = 0;
    for (int i = 0; i < nneed; i++) {
        uint64_t pos = need[i].offset, end = need[i].offset + need[i].length;
        while (pos < end) {
            /* the chunk covering pos, else the nearest one starting after it */
            uint64_t stop = end;
            int covered = 0;
            for (int j = 0; j < nhave; j++) {
                uint64_t a = have[j].offset, z = have[j].offset + have[j].length;
                if (a <= pos && pos < z) { covered = 1; stop = z < end ? z : end; break; }
                if (a > pos && a < stop) stop = a;
            }
            if (!covered) count = append_merged(out, count, pos, stop - pos, 1);
            pos = stop;
        }
    }
    return count;
}
