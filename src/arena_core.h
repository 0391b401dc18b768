/* metrale C core: slab layout, zero ranges, the row-wise carve cursor, the
 * checksum lanes and the per-thread scratch tables.  Plain C, no Python: the
 * Cython layer (src/metrale/_base/_core.pxd mirrors this header) owns every object.
 * The header stays valid C++ so the CUDA extension, built as C++, can use it. */
#ifndef METRALE_ARENA_CORE_H
#define METRALE_ARENA_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The buffer table is given at run time (mt_layout_table): the Python layer
 * derives it from a buffer set (metrale/buffers.py), one entry per buffer in
 * the set's order, which is the order of the ids the core uses.  Each entry
 * says which helpers cover the buffer and where the slab places it. */
enum {
    MT_IN_ZERO_ALL = 1 << 0,   /* zeroed whole by zero_all */
    MT_IN_ROWS     = 1 << 1,   /* trimmed to the live rows by zero_all_rows */
    MT_IN_PREFILL  = 1 << 2,   /* zeroed by zero_prefill_essentials (also MT_IN_ZERO_ALL) */
    MT_IN_CHECKSUM = 1 << 3,   /* probed by debug_buffer_checksum */
    MT_ROWS_BY_M   = 1 << 4,   /* MT_IN_ROWS: rows of max_batch_tokens */
    MT_ROWS_BY_M16 = 1 << 5,   /* MT_IN_ROWS: rows of ceil16(max_batch_tokens); with
                                  MT_ROWS_BY_M both (a size that is the larger of
                                  layouts in either): the live part of each.  An
                                  MT_IN_ROWS buffer names one at least: nothing is
                                  guessed from its size. */
    MT_STEP_IDS    = 1 << 6,   /* the step's token ids (StepInputs): placed first */
    MT_STEP_META   = 1 << 7,   /* the reference's decode metadata (its scratch): the
                                  last of the step inputs */
    MT_STEP_IN     = 1 << 8    /* another step input (count, positions, metadata):
                                  between the two */
};

#define MT_ALIGN 256        /* the least alignment of a buffer in the slab */
#define MT_MAX_BUFFERS 256  /* buffers of one table (metrale/buffers.py MAX_BUFFERS) */

/* Named results of the core's calls that can fail. */
enum {
    MT_OK = 0,
    MT_ERR_OVERFLOW = -1,      /* a size or offset does not fit 64 bits */
    MT_ERR_LIMIT = -2,         /* a fixed table is full (scratch: max_threads slots) */
    MT_ERR_NOMEM = -3          /* malloc refused */
};

/* A byte range relative to the slab base. */
typedef struct mt_range { uint64_t offset; uint64_t length; } mt_range;

/* Where each buffer sits in the one slab, for the table it was given.
 * Zero-size buffers have offset 0 and no range.  Slab order (`order`): the
 * step inputs back to back (MT_STEP_IDS, MT_STEP_IN, MT_STEP_META: one upload
 * reaches them all), then the zero_prefill_essentials buffers, the other
 * zero_all_rows candidates, the rest of zero_all (zeroed whole), then
 * everything else, each part in table order: so each of zero_all and
 * zero_prefill_essentials is one contiguous range.  Each buffer starts at a
 * multiple of its alignment (`align`, at least MT_ALIGN) and ends padded to
 * MT_ALIGN. */
typedef struct mt_layout {
    int n;                              /* buffers in the table */
    unsigned flags[MT_MAX_BUFFERS];     /* MT_IN_* / MT_ROWS_* / MT_STEP_* per buffer */
    uint64_t align[MT_MAX_BUFFERS];     /* each buffer's alignment: a power of two >= MT_ALIGN */
    uint64_t size[MT_MAX_BUFFERS];
    uint64_t offset[MT_MAX_BUFFERS];
    int order[MT_MAX_BUFFERS];          /* buffer ids in slab order */
    uint64_t slab_bytes;                /* bytes the backend must allocate (0: none),
                                           with base_align - MT_ALIGN (plain) or - the
                                           granularity (reserved) of front padding */
    uint64_t base_align;                /* the alignment the base needs: the largest of the
                                           placed buffers' (reserved: and the granularity) */
    uint64_t max_batch_tokens;
    mt_range zero_all;                  /* the zero_all buffers, whole, padding between them */
    mt_range zero_prefill;              /* the zero_prefill_essentials buffers, whole */
    int reserved;                       /* 1: placed by mt_layout_plan_reserved */
    uint64_t room[MT_MAX_BUFFERS];      /* reserved: bytes of each buffer's sub-range (0: none) */
    uint64_t guard;                     /* debug arenas: guard bytes after each live buffer */
} mt_layout;

/* Start a layout for a table of `n` buffers (flags and alignment of each):
 * MT_OK, or MT_ERR_LIMIT if n is not 0 .. MT_MAX_BUFFERS or an alignment is
 * not a power of two >= MT_ALIGN.  The planning calls keep the table. */
int mt_layout_table(mt_layout *L, int n, const unsigned *flags, const uint64_t *align);

/* Place the buffers (sizes[i] for buffer i of the table).  `guard` (0, or a
 * multiple of MT_ALIGN: debug arenas, src/debug.c) puts a guard band after
 * every live buffer: from its end to the next MT_ALIGN boundary plus `guard`
 * bytes; no zero range covers it.  Returns MT_OK, MT_ERR_OVERFLOW if the slab
 * size does not fit 64 bits, or MT_ERR_LIMIT for a `guard` that is not a
 * multiple of MT_ALIGN. */
int mt_layout_plan(mt_layout *L, const uint64_t *sizes, uint64_t max_batch_tokens,
                   uint64_t guard);

/* Where the buffers start in an allocation (or reservation) of slab_bytes at
 * `p`, which the backend aligns to MT_ALIGN (a reservation to the
 * granularity): p rounded up to base_align.  Offsets are from there. */
uint64_t mt_layout_base(const mt_layout *L, uint64_t p);

/* ---- reserved layouts (stable addresses) ----------------------------------------
 * A reserved arena owns one virtual reservation; each buffer has its own
 * sub-range sized for the reserved limits, rounded up to the backend's
 * allocation granularity, so a buffer can grow in place (token_ids' sub-range
 * ends at the next 256 bytes instead: scratch follows it in the same granule,
 * which stays mapped, so a step's upload reaches both).  `offset` is where
 * the buffer's sub-range starts, `size` its bytes at the current limits
 * (<= the reserved bytes), `slab_bytes` the whole reservation.  zero_all and
 * zero_prefill are then no longer one range each: mt_group_ranges gives one
 * range per buffer (adjacent ones merged), and mt_zero_rows_ranges walks the
 * buffers for every `tokens`.  Physical memory backs, per buffer, its size
 * rounded up to the granularity (mt_commit_needed). */

/* x rounded up to a multiple of g (g a power of two); MT_ERR_OVERFLOW if it
 * does not fit 64 bits.  The one place the granularity rounding is written. */
int mt_round_up(uint64_t x, uint64_t g, uint64_t *out);

/* Place the buffers of `reserve` (sizes at the reserved limits) in one
 * reservation at granularity `gran` (a power of two >= MT_ALIGN), in slab order;
 * then record the current `sizes` (each <= its reserved size).  `guard` as for
 * mt_layout_plan: each sub-range, and what mt_commit_needed maps of it, then
 * holds the buffer's guard band too.  MT_ERR_OVERFLOW if the reservation does
 * not fit 64 bits, MT_ERR_LIMIT if a size exceeds its reserved size, `gran` is
 * not a power of two >= MT_ALIGN or `guard` not a multiple of MT_ALIGN. */
int mt_layout_plan_reserved(mt_layout *L, const uint64_t *sizes, const uint64_t *reserve,
                            uint64_t max_batch_tokens, uint64_t gran, uint64_t guard);

/* Replace the current sizes of a reserved layout (offsets unchanged):
 * MT_OK, or MT_ERR_LIMIT if a size exceeds the room its sub-range has. */
int mt_layout_resize(mt_layout *L, const uint64_t *sizes, uint64_t max_batch_tokens,
                     uint64_t gran);

/* The ranges (offset, length) covering every buffer with flag `group`
 * (MT_IN_ZERO_ALL or MT_IN_PREFILL), whole, in slab order.  On a plain layout
 * that is one range, padding included (the layout made them contiguous); on a
 * reserved or guarded one, one per buffer, adjacent ones merged (padding up
 * to MT_ALIGN absorbed).  `out` holds L->n entries; returns the count. */
int mt_group_ranges(const mt_layout *L, unsigned group, mt_range *out);

/* The granule-aligned ranges a reserved layout needs backed by physical memory:
 * each non-empty buffer's [offset, offset + round_up(size, gran)), in slab
 * order, adjacent ones merged.  `out` holds L->n entries; returns the count. */
int mt_commit_needed(const mt_layout *L, uint64_t gran, mt_range *out);

/* What must be mapped: the parts of `need` (sorted, disjoint) that none of
 * the `nhave` mapped chunks (disjoint, any order) covers, adjacent parts
 * merged, so one physical handle maps each.  `out` holds nneed + nhave
 * entries; returns the count. */
int mt_commit_gaps(const mt_range *need, int nneed, const mt_range *have, int nhave,
                   mt_range *out);

/* Whether the chunk [offset, offset + length) overlaps a range of `need`: a
 * chunk that overlaps none may be unmapped and released. */
int mt_chunk_needed(const mt_range *need, int nneed, uint64_t offset, uint64_t length);

/* The ranges zero_all_rows(tokens) clears (the table of kernels/zero_ranges.h), in slab order,
 * with adjacent ones merged.  `out` holds L->n entries; returns the count (0
 * when every range is empty). */
int mt_zero_rows_ranges(const mt_layout *L, uint64_t tokens, mt_range *out);

/* The bytes of buffer `buf` that zero_all_rows(tokens) clears, from its
 * start: the same rule per buffer (its whole size when it is not row-trimmed
 * or tokens >= max_batch_tokens).  Debug arenas poison the rest. */
uint64_t mt_rows_length(const mt_layout *L, int buf, uint64_t tokens);

/* The bytes of one token row of buffer `buf` as zero_all_rows counts them
 * (its size over max_batch_tokens or over ceil16 of it, as its rule says), or
 * 0 when it has no one row width: cleared whole (not row-trimmed, or the rows
 * do not divide), or trimmed by both row counts. */
uint64_t mt_rows_stride(const mt_layout *L, int buf);

/* Sum, sum of squares and sum of |x| over the finite little-endian binary32
 * lanes of n bytes (a trailing 1-3 bytes ignored), in lane order, in double. */
void mt_checksum_f32(const void *data, size_t n, double out[3]);

/* The row-wise slab cursor (opaque so that this header needs no <stdatomic.h>).
 * A carve advances it atomically by `bytes`, saturating at 2^64 - 1 instead of
 * wrapping, so once a carve has overrun the slab every later one fails too,
 * whatever the interleaving of callers. */
typedef struct mt_cursor mt_cursor;
mt_cursor *mt_cursor_new(void);
void mt_cursor_free(mt_cursor *c);
/* Carve `bytes` of a `size`-byte slab: *base = the cursor before the carve.
 * Returns MT_OK when [*base, *base + bytes) lies inside the slab, else
 * MT_ERR_LIMIT (exhausted; the cursor stays advanced). */
int mt_cursor_take(mt_cursor *c, uint64_t bytes, uint64_t size, uint64_t *base);

/* ---- arena lifetime -------------------------------------------------------------
 * One atomic word says whether the slab may still be touched: a released flag,
 * the number of live exports (views of the arena, each of which keeps its
 * memory readable) and the number of operations in flight (calls that read or
 * write the slab, possibly with the GIL released).  Closing sets the flag in
 * one compare-and-swap, and only while no export is live, so an export either
 * came first (and closing is refused) or sees the flag and never touches the
 * slab; so does an operation, and the closer then waits for the operations
 * already in flight to leave before the slab is freed.  Per-slot (per-buffer)
 * export counts are kept beside the word to name the buffers in a refusal.
 *
 * Every wait ends: a thread never waits for itself (a release or reshape from
 * inside its own operation or reshape is refused), waits poll (no wake-up can
 * be missed) in bounded slices (mt_life_wait) so that the caller can stop for a
 * signal, and a process forked while other threads were inside an operation
 * or a reshape does not wait for those threads, which it does not have. */
typedef struct mt_life mt_life;

enum {
    MT_LIFE_OK = 0,
    MT_LIFE_RELEASED = 1,   /* the arena is (already) released */
    MT_LIFE_EXPORTED = 2,   /* close / reshape: views are alive */
    MT_LIFE_IN_FLIGHT = 3,  /* close / reshape: called from inside an operation */
    MT_LIFE_FULL = 4,       /* a counter is at its limit (or a slot is out of range) */
    MT_LIFE_PAUSED = 5,     /* a reshape (resize, sleep, wake) runs, or the arena sleeps */
    MT_LIFE_BUSY = 6,       /* mt_life_reshape_begin: another reshape runs */
    MT_LIFE_SELF = 7,       /* mt_life_close: from inside this arena's reshape on this thread */
    MT_LIFE_CLOSING = 8,    /* mt_life_export: a release was refused; no new export starts */
    MT_LIFE_FORKED = 9      /* the word was inherited across fork(); from close: released */
};

/* What mt_life_wait waits for. */
enum { MT_WAIT_OPERATIONS = 0, MT_WAIT_ALL = 1 /* operations and a running reshape */ };

/* The number of fork()s this process descends from (counted in each child). */
unsigned long mt_fork_generation(void);

/* A word with `nslots` per-slot export counters (one per buffer). */
mt_life *mt_life_new(int nslots);
void mt_life_free(mt_life *l);
/* Start an operation that touches the slab: MT_LIFE_OK or RELEASED / PAUSED /
 * FULL / FORKED.  Operations nest per thread (enter/leave in LIFO order). */
int mt_life_enter(mt_life *l);
void mt_life_leave(mt_life *l);
/* Count one more live export of slot `slot`: MT_LIFE_OK or RELEASED / PAUSED /
 * CLOSING / FULL / FORKED. */
int mt_life_export(mt_life *l, int slot);
void mt_life_unexport(mt_life *l, int slot);
uint64_t mt_life_exports(const mt_life *l, int slot);
uint64_t mt_life_in_flight(const mt_life *l);
/* Mark released unless refused: MT_LIFE_OK (the caller then waits with
 * mt_life_wait(MT_WAIT_ALL) and frees the slab), MT_LIFE_FORKED (released in a
 * forked child: nothing to wait for), MT_LIFE_RELEASED (already), or refused:
 * MT_LIFE_EXPORTED (views are alive; from then on no new export starts, so a
 * release after those views are gone succeeds), MT_LIFE_SELF (this thread runs
 * a reshape of this arena: waiting would wait for itself), MT_LIFE_IN_FLIGHT
 * (the calling thread is itself inside an operation, of any arena, while one
 * is in flight here). */
int mt_life_close(mt_life *l);
/* Undo a close whose wait was interrupted (nothing was freed). */
void mt_life_reopen(mt_life *l);
/* Wait (without the GIL: the operations waited for may need it) until no
 * operation is in flight, and with MT_WAIT_ALL no reshape runs either: 1 once
 * so, 0 after about `timeout_us` microseconds (call again). */
int mt_life_wait(mt_life *l, int until, long timeout_us);
int mt_life_released(const mt_life *l);
/* Reshapes (resize, sleep, wake of a reserved arena) change what memory
 * backs the slab, so they run alone.  mt_life_reshape_begin marks the arena
 * busy and paused (new operations and exports get MT_LIFE_PAUSED) unless it
 * is released, another reshape runs (MT_LIFE_BUSY), an export is live
 * (MT_LIFE_EXPORTED), the calling thread is inside an operation
 * (MT_LIFE_IN_FLIGHT: waiting there could wait for itself) or the word was
 * inherited across fork (MT_LIFE_FORKED); on MT_LIFE_OK the caller waits with
 * mt_life_wait(MT_WAIT_OPERATIONS), reshapes, then mt_life_reshape_end.
 * `views_ok` (NULL: none), one flag per slot: live exports of those slots do
 * not refuse (a reshape that leaves their memory in place); an export of
 * another slot still gives MT_LIFE_EXPORTED, the word as before the call.
 * `stay_paused` (a sleep) keeps new operations out until the next reshape
 * ends.  A close waits for a running reshape (MT_WAIT_ALL). */
int mt_life_reshape_begin(mt_life *l, const unsigned char *views_ok);
/* Inside a reshape: mark slot `slot` asleep or awake.  While the word stays
 * paused after the reshape (a sleep), exports of the slots asleep are refused
 * (MT_LIFE_PAUSED) and those of the others made: the buffers of the classes a
 * partial sleep leaves awake. */
void mt_life_set_asleep(mt_life *l, int slot, int asleep);
void mt_life_reshape_end(mt_life *l, int stay_paused);
int mt_life_paused(const mt_life *l);
/* Whether the word was inherited across fork(). */
int mt_life_forked(const mt_life *l);

/* ---- per-thread scratch tables ------------------------------------------------
 * A fixed table of max_threads slots.  A thread claims a slot with one CAS on
 * first use and finds it again through a thread-local cache, so the hot path
 * takes no lock.  reset_all bumps a generation; each owner applies it on its
 * next access, so no thread ever writes another thread's bookkeeping. */
typedef struct mt_scratch mt_scratch;

typedef struct mt_scratch_stats {
    uint64_t active_threads;
    uint64_t total_allocated;
    uint64_t total_used;
    uint64_t max_thread_usage;
    /* High-water marks since creation or mt_scratch_reset_peaks, kept after
     * threads exit: bytes carved at once across threads, and by one thread. */
    uint64_t peak_total_used;
    uint64_t peak_thread_usage;
} mt_scratch_stats;

mt_scratch *mt_scratch_new(size_t scratch_size, size_t max_threads);
/* Drop one reference; the table is freed with the last one. */
void mt_scratch_decref(mt_scratch *s);
void mt_scratch_incref(mt_scratch *s);
size_t mt_scratch_size(const mt_scratch *s);
size_t mt_scratch_max_threads(const mt_scratch *s);
/* The calling thread's slot, or -1 if it has none (lock-free). */
long mt_scratch_find(mt_scratch *s);
/* Claim a slot for the calling thread and make sure its buffer exists.
 * Returns the slot, MT_ERR_LIMIT at the thread limit, MT_ERR_NOMEM if the
 * buffer allocation fails. */
long mt_scratch_claim(mt_scratch *s);
/* Give a slot back (its buffer is kept for the next claimant). */
void mt_scratch_release(mt_scratch *s, long slot, uint64_t claim);
uint64_t mt_scratch_claim_id(const mt_scratch *s, long slot);
void mt_scratch_set_user(mt_scratch *s, long slot, void *user);
void *mt_scratch_user(const mt_scratch *s, long slot);
/* Owner-side accessors: apply a pending reset_all first. */
unsigned char *mt_scratch_base(mt_scratch *s, long slot);
uint64_t mt_scratch_used(mt_scratch *s, long slot);
/* Bump-carve n bytes at a 64-byte aligned offset, zero-filled; NULL if it does not fit. */
unsigned char *mt_scratch_carve(mt_scratch *s, long slot, uint64_t n);
void mt_scratch_reset(mt_scratch *s, long slot);
void mt_scratch_reset_all(mt_scratch *s);
uint64_t mt_scratch_active(const mt_scratch *s);
void mt_scratch_get_stats(const mt_scratch *s, mt_scratch_stats *out);
/* Restart the high-water marks from the current usage. */
void mt_scratch_reset_peaks(mt_scratch *s);
/* Thread-local cache slot owner id of the calling thread (never reused). */
uint64_t mt_thread_id(void);

/* ---- the torch pool (src/pool.c) -----------------------------------------------
 * A sub-allocator over one reserved address range of `npages` pages of
 * `granule` bytes (the backend's allocation granularity): it hands out
 * segments (runs of whole pages, torch's segments) and backs them with
 * physical memory on demand, one handle per run it maps (a chunk).  A freed
 * segment's pages stay mapped and are preferred by the next allocation, so a
 * pool that has grown maps nothing new; mt_pool_trim unmaps the chunks no
 * segment touches.  Sleep unmaps every chunk and keeps the segments (their
 * addresses); wake maps the segments' pages again, one chunk per run.
 * The device operations are the caller's (mt_pool_ops): driver calls made
 * without the GIL for a CUDA pool, the backend's own methods otherwise.
 * Every call locks the pool; a call that maps or unmaps is all-or-nothing. */
typedef struct mt_pool_ops {
    void *ctx;
    /* Each returns 0, or a nonzero code the pool passes back (`*err`). */
    int (*create)(void *ctx, uint64_t n, uint64_t *handle);
    int (*release)(void *ctx, uint64_t handle, uint64_t n);
    int (*map)(void *ctx, uint64_t p, uint64_t n, uint64_t handle);   /* whole, read/write */
    int (*unmap)(void *ctx, uint64_t p, uint64_t n);
} mt_pool_ops;

typedef struct mt_pool mt_pool;

enum {
    MT_POOL_FULL = -10,        /* no run of free pages is long enough */
    MT_POOL_ASLEEP = -11,      /* the pool sleeps: nothing is mapped */
    MT_POOL_FOREIGN = -12,     /* not a segment of this pool (or not of that size) */
    MT_POOL_DEVICE = -13,      /* an operation failed; *err holds its code */
    MT_POOL_IN_USE = -14,      /* mt_pool_close: segments are still handed out */
    MT_POOL_SIZE = -15         /* a segment of this pool, asked for with another size */
};

typedef struct mt_pool_stats {
    uint64_t reserved;         /* bytes of the range */
    uint64_t committed;        /* bytes mapped now */
    uint64_t in_use;           /* bytes of the segments handed out */
    uint64_t peak_committed, peak_in_use;
    uint64_t segments;         /* handed out now */
    uint64_t chunks;           /* physical handles mapped now */
    uint64_t orphans;          /* handles unmapped whose release failed (retried) */
    uint64_t creates;          /* physical handles ever created (each a cuMemCreate) */
    uint64_t allocs, frees;    /* segments ever handed out / given back */
    uint64_t refused;          /* allocations refused (full, asleep or a device failure) */
    int asleep;
} mt_pool_stats;

/* A pool over [base, base + npages * granule) (reserved by the caller, who
 * frees it after mt_pool_free); `ops` is copied.  NULL if malloc refuses. */
mt_pool *mt_pool_new(uint64_t base, uint64_t npages, uint64_t granule, const mt_pool_ops *ops);
/* Free the bookkeeping: whatever is still mapped is the caller's to know
 * (mt_pool_close first; a forked child forgets). */
void mt_pool_free(mt_pool *p);
/* A segment of at least n bytes (whole pages, n = 0 counts as one byte):
 * MT_OK and *out, or MT_POOL_FULL / MT_POOL_ASLEEP / MT_POOL_DEVICE (*err),
 * nothing mapped by a refused call staying mapped. */
int mt_pool_alloc(mt_pool *p, uint64_t n, uint64_t *out, int *err);
/* Give a segment back: `ptr` where mt_pool_alloc put it and `n` (0: not
 * checked) the size it was asked for, exactly.  Its pages stay mapped.  MT_OK,
 * MT_POOL_FOREIGN or MT_POOL_SIZE (nothing changes). */
int mt_pool_release(mt_pool *p, uint64_t ptr, uint64_t n);
/* Unmap and release every chunk no segment touches (the device waited for by
 * the caller); every chunk is tried, each one whole or not at all, and
 * *unmapped says how many bytes went.  MT_OK or MT_POOL_DEVICE (the first
 * error); a handle whose release fails is kept and retried by later calls. */
int mt_pool_trim(mt_pool *p, uint64_t *unmapped, int *err);
/* A sleep and a wake move the pool's memory chunk by chunk (the offload
 * engine, _offload.pyx, with the device waited for by the caller):
 * mt_pool_unmap_chunk unmaps and releases the chunk that starts at byte
 * `offset` from the base.  MT_OK; MT_POOL_FOREIGN (no chunk starts there);
 * MT_POOL_DEVICE (*err): the unmap failed and the chunk stays mapped
 * (*gone = 0), or it went and its handle's release failed (*gone = 1: the
 * handle is kept and released again by later calls). */
int mt_pool_unmap_chunk(mt_pool *p, uint64_t offset, int *gone, int *err);
/* Map every unmapped page of [offset, offset + bytes) (whole pages), one
 * handle per run of them: all or nothing.  MT_OK or MT_POOL_DEVICE. */
int mt_pool_commit(mt_pool *p, uint64_t offset, uint64_t bytes, int *err);
/* The pool asleep (allocations refused as MT_POOL_ASLEEP, trim does nothing)
 * or awake; its memory is the caller's to move. */
void mt_pool_set_asleep(mt_pool *p, int on);
/* Refuse allocations (MT_POOL_ASLEEP) while `on`, awake or not, and trim
 * nothing: the segments and their pages stay what they are while a sleep or
 * a wake copies them. */
void mt_pool_hold(mt_pool *p, int on);
/* Unmap and release everything, refused (MT_POOL_IN_USE) while a segment is
 * handed out unless `force`; MT_OK or MT_POOL_DEVICE (what failed stays
 * recorded: call again). */
int mt_pool_close(mt_pool *p, int force, int *err);
void mt_pool_get_stats(mt_pool *p, mt_pool_stats *out);
/* The segments handed out, in address order: up to `cap` of them into
 * ptrs / bytes; returns how many there are. */
uint64_t mt_pool_segments(mt_pool *p, mt_range *out, uint64_t cap);
/* The mapped chunks, in address order: up to `cap` (offset, bytes) ranges;
 * returns how many there are. */
uint64_t mt_pool_chunks(mt_pool *p, mt_range *out, uint64_t cap);

/* Torch's pluggable allocator is a pair of C functions with no context
 * argument, so each pool that serves torch binds one of MT_POOL_SLOTS
 * slots, each with its own pair: alloc(size, device, stream) and
 * free(ptr, size, device, stream).  A slot is bound to a pool until
 * mt_pool_unbind (which waits for calls in progress); a call to an unbound
 * slot allocates nothing and frees nothing. */
#define MT_POOL_SLOTS 64
/* Bind `p` to a free slot: the slot, or MT_ERR_LIMIT when none is free
 * (slots whose torch allocator may still be called stay taken: `retired`). */
int mt_pool_bind(mt_pool *p);
/* Unbind slot `slot`; with `retire` it stays taken (torch may still call
 * it) until mt_pool_unretire. */
void mt_pool_unbind(int slot, int retire);
void mt_pool_unretire(int slot);
/* The slot's two functions, as addresses for torch. */
uint64_t mt_pool_slot_alloc(int slot);
uint64_t mt_pool_slot_free(int slot);
/* Calls of the slot functions that found no pool (a freed pointer not the
 * pool's, or the slot unbound), for tests and stats. */
uint64_t mt_pool_stray_calls(void);
/* One buffer lent to torch as a MemPool's one segment (metrale.torch's
 * cuBLAS workspace): mt_lend_set(ptr, size) arms it (ptr 0: nothing to
 * lend); the pair at mt_lend_alloc_fn / mt_lend_free_fn is torch's
 * allocator, `alloc(size, device, stream)` handing the buffer out once for
 * a request of at most `size` bytes, NULL otherwise (the largest refused:
 * mt_lend_refused), `free` taking it back.  No GIL, no lock: callable from
 * any thread under torch's allocator mutex.  Process-wide, one buffer. */
void mt_lend_set(uint64_t ptr, uint64_t size);
int mt_lend_out(void);
uint64_t mt_lend_refused(void);
uint64_t mt_lend_alloc_fn(void);
uint64_t mt_lend_free_fn(void);

#ifdef __cplusplus
}
#endif
#endif
