/* metrale C core: the buffer table's arrays, slab layout, zero ranges and the
 * checksum lanes.  See arena_core.h for the contract of each function. */
#include "arena_core.h"
#include "debug.h"
#include "metrale/kernels/zero_ranges.h"

#include <math.h>
#include <string.h>

const char *const mt_buffer_names[MT_NBUF] = {
#define MT_NAME_(id, name, flags) #name,
    MT_BUFFER_TABLE(MT_NAME_)
#undef MT_NAME_
};

const unsigned mt_buffer_flags[MT_NBUF] = {
#define MT_FLAGS_(id, name, flags) (flags),
    MT_BUFFER_TABLE(MT_FLAGS_)
#undef MT_FLAGS_
};

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
    for (int i = 0; i < MT_NBUF; i++) {
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
    for (int b = 0; b < MT_NBUF; b++) {
        if (!(mt_buffer_flags[b] & group) || L->size[b] == 0) continue;
        if (L->offset[b] < lo) lo = L->offset[b];
        if (L->offset[b] + L->size[b] > hi) hi = L->offset[b] + L->size[b];
    }
    if (hi > 0) { r.offset = lo; r.length = hi - lo; }
    return r;
}

/* The part of the slab a buffer goes to (see mt_layout): the step inputs
 * first (token_ids, then scratch, so that one copy reaches both), then the
 * zero_prefill_essentials buffers, the other row-trimmed ones, the rest of
 * zero_all and everything else. */
enum { MT_NPARTS = 6 };
static int slab_part(unsigned flags)
{
    if ((flags & MT_IN_STEP) && !(flags & MT_IN_ZERO_ALL)) return 0;
    if (flags & MT_IN_STEP) return 1;
    if (flags & MT_IN_PREFILL) return 2;
    if (flags & MT_IN_ROWS) return 3;
    if (flags & MT_IN_ZERO_ALL) return 4;
    return 5;
}

static void slab_order(mt_layout *L)
{
    int k = 0;
    for (int part = 0; part < MT_NPARTS; part++)
        for (int b = 0; b < MT_NBUF; b++)
            if (slab_part(mt_buffer_flags[b]) == part) L->order[k++] = b;
}

int mt_layout_plan(mt_layout *L, const uint64_t sizes[MT_NBUF], uint64_t max_batch_tokens,
                   uint64_t guard)
{
    uint64_t cur = 0;
    memset(L, 0, sizeof(*L));
    if (guard % MT_ALIGN) return MT_ERR_LIMIT;
    L->guard = guard;
    L->max_batch_tokens = max_batch_tokens;
    slab_order(L);
    for (int i = 0; i < MT_NBUF; i++) {
        int b = L->order[i];
        uint64_t n = sizes[b];
        L->size[b] = n;
        if (n == 0) continue;   /* an empty buffer is NULL: no range */
        L->offset[b] = cur;
        if (n > UINT64_MAX - cur || align_up(cur + n, &cur) != MT_OK) return MT_ERR_OVERFLOW;
        if (guard > UINT64_MAX - cur) return MT_ERR_OVERFLOW;
        cur += guard;
    }
    L->slab_bytes = cur;
    L->zero_all = group_range(L, MT_IN_ZERO_ALL);
    L->zero_prefill = group_range(L, MT_IN_PREFILL);
    return MT_OK;
}

static uint64_t ceil16(uint64_t x) { return (x + 15) / 16 * 16; }

/* One entry per zero_all buffer; the row-trimmed ones get the kind their size
 * says (ARENA §5.2): whole rows of max_batch_tokens, else whole rows of
 * ceil16(max_batch_tokens) (the GEMM-tiled buffers), else whole. */
static void rows_entry(const mt_layout *L, int b, uint64_t m, mt_rows_entry *e)
{
    uint64_t size = L->size[b], m16 = ceil16(m);
    memset(e, 0, sizeof *e);
    e->offset = L->offset[b];
    e->size = size;
    e->hi = size;
    e->pad_to = e->offset + size;
    e->kind = MT_ROWS_WHOLE;
    if (mt_buffer_flags[b] & MT_IN_ROWS) {
        if (size % m == 0) { e->kind = MT_ROWS_M; e->row = size / m; }
        else if (size % m16 == 0) { e->kind = MT_ROWS_M16; e->row = size / m16; }
    }
}

int mt_rows_args_init(const mt_layout *L, uint64_t hole_lo, uint64_t hole_hi, mt_rows_args *a)
{
    uint64_t m = L->max_batch_tokens ? L->max_batch_tokens : 1, end;
    int n = 0;
    memset(a, 0, sizeof(*a));
    a->m = m;
    a->m16 = ceil16(m);
    for (int i = 0; i < MT_NBUF; i++) {
        int b = L->order[i];
        uint64_t size = L->size[b];
        mt_rows_entry e;
        if (!(mt_buffer_flags[b] & MT_IN_ZERO_ALL) || size == 0) continue;
        rows_entry(L, b, m, &e);
        if (hole_lo < hole_hi && hole_lo < e.offset + size && e.offset < hole_hi) {
            uint64_t cut_lo = hole_lo > e.offset ? hole_lo - e.offset : 0;
            uint64_t cut_hi = hole_hi - e.offset < size ? hole_hi - e.offset : size;
            if (cut_lo > 0) { a->e[n] = e; a->e[n].hi = cut_lo; n++; }
            if (cut_hi < size) { a->e[n] = e; a->e[n].lo = cut_hi; n++; }
        } else {
            a->e[n++] = e;
        }
    }
    for (int i = 0; i + 1 < n; i++)
        if (align_up(a->e[i].offset + a->e[i].size, &end) == MT_OK && end == a->e[i + 1].offset)
            a->e[i].pad_to = end;
    a->n = n;
    return n;
}

int mt_zero_rows_ranges(const mt_layout *L, uint64_t tokens, mt_range *out)
{
    mt_rows_args a;
    uint64_t s, e, t;
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
    return e.row;
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


/* ---- reserved layouts ------------------------------------------------------- */

int mt_round_up(uint64_t x, uint64_t g, uint64_t *out)
{
    if (x > UINT64_MAX - (g - 1)) return MT_ERR_OVERFLOW;
    *out = (x + (g - 1)) & ~(g - 1);
    return MT_OK;
}

static int good_granularity(uint64_t g) { return g >= MT_ALIGN && (g & (g - 1)) == 0; }

int mt_layout_plan_reserved(mt_layout *L, const uint64_t sizes[MT_NBUF],
                            const uint64_t reserve[MT_NBUF], uint64_t max_batch_tokens,
                            uint64_t gran, uint64_t guard)
{
    uint64_t cur = 0, end, span;
    int rc;
    if (!good_granularity(gran) || guard % MT_ALIGN) return MT_ERR_LIMIT;
    memset(L, 0, sizeof(*L));
    L->reserved = 1;
    L->guard = guard;
    slab_order(L);
    for (int i = 0; i < MT_NBUF; i++) {
        int b = L->order[i];
        if (sizes[b] > reserve[b]) return MT_ERR_LIMIT;
        if (reserve[b] == 0) continue;      /* never anything: no sub-range */
        L->offset[b] = cur;
        if ((rc = with_guard(L, reserve[b], &span)) != MT_OK) return rc;
        if (span > UINT64_MAX - cur) return MT_ERR_OVERFLOW;
        /* Each sub-range (with its guard band) ends on a granule so that it
         * grows alone, except token_ids': scratch follows it at once (one
         * upload reaches both) and the two share the granule between them. */
        if (slab_part(mt_buffer_flags[b]) == 0)
            rc = align_up(cur + span, &end);
        else
            rc = mt_round_up(cur + span, gran, &end);
        if (rc != MT_OK) return rc;
        L->room[b] = end - cur;
        cur = end;
    }
    L->slab_bytes = cur;
    return mt_layout_resize(L, sizes, max_batch_tokens, gran);
}

int mt_layout_resize(mt_layout *L, const uint64_t sizes[MT_NBUF], uint64_t max_batch_tokens,
                     uint64_t gran)
{
    uint64_t span;
    if (!L->reserved || !good_granularity(gran)) return MT_ERR_LIMIT;
    for (int b = 0; b < MT_NBUF; b++)
        if (sizes[b] && (with_guard(L, sizes[b], &span) != MT_OK || span > L->room[b]))
            return MT_ERR_LIMIT;
    for (int b = 0; b < MT_NBUF; b++) L->size[b] = sizes[b];
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
    for (int i = 0; i < MT_NBUF; i++) {
        int b = L->order[i];
        if (!(mt_buffer_flags[b] & group) || L->size[b] == 0) continue;
        count = append_merged(out, count, L->offset[b], L->size[b], MT_ALIGN);
    }
    return count;
}

int mt_commit_needed(const mt_layout *L, uint64_t gran, mt_range *out)
{
    int count = 0;
    uint64_t lo, hi, n;
    for (int i = 0; i < MT_NBUF; i++) {
        int b = L->order[i];
        if (L->size[b] == 0) continue;
        /* token_ids keeps its whole room: a step's upload runs from it into
         * scratch in one copy, padding (and guard band) included */
        if (slab_part(mt_buffer_flags[b]) == 0) n = L->room[b];
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
