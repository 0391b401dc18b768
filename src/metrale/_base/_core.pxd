# Declarations of src/arena_core.h (the only C the Cython layer calls).
from libc.stdint cimport uint64_t

cdef extern from "arena_core.h" nogil:
    # The buffer table is given at run time (mt_layout_table): each buffer's
    # flags, from its spec in the buffer set (metrale/_sizing/_layout.pyx makes them).
    enum:
        MT_ALIGN
        MT_MAX_BUFFERS
        MT_IN_ZERO_ALL
        MT_IN_ROWS
        MT_IN_PREFILL
        MT_IN_CHECKSUM
        MT_ROWS_BY_M
        MT_ROWS_BY_M16
        MT_STEP_IDS
        MT_STEP_META
        MT_STEP_IN

    enum:
        MT_OK
        MT_ERR_OVERFLOW
        MT_ERR_LIMIT
        MT_ERR_NOMEM

    ctypedef struct mt_range:
        uint64_t offset
        uint64_t length

    ctypedef struct mt_layout:
        int n
        unsigned flags[MT_MAX_BUFFERS]
        uint64_t align[MT_MAX_BUFFERS]
        uint64_t size[MT_MAX_BUFFERS]
        uint64_t offset[MT_MAX_BUFFERS]
        int order[MT_MAX_BUFFERS]
        uint64_t slab_bytes
        uint64_t base_align
        uint64_t max_batch_tokens
        mt_range zero_all
        mt_range zero_prefill
        int reserved
        uint64_t room[MT_MAX_BUFFERS]
        uint64_t guard

    int mt_layout_table(mt_layout *L, int n, const unsigned *flags, const uint64_t *align)
    int mt_layout_plan(mt_layout *L, const uint64_t *sizes, uint64_t max_batch_tokens,
                       uint64_t guard)
    uint64_t mt_layout_base(const mt_layout *L, uint64_t p)
    int mt_round_up(uint64_t x, uint64_t g, uint64_t *out)
    int mt_layout_plan_reserved(mt_layout *L, const uint64_t *sizes, const uint64_t *reserve,
                                uint64_t max_batch_tokens, uint64_t gran, uint64_t guard)
    int mt_layout_resize(mt_layout *L, const uint64_t *sizes, uint64_t max_batch_tokens,
                         uint64_t gran)
    int mt_group_ranges(const mt_layout *L, unsigned group, mt_range *out)
    int mt_commit_needed(const mt_layout *L, uint64_t gran, mt_range *out)
    int mt_commit_gaps(const mt_range *need, int nneed, const mt_range *have, int nhave,
                       mt_range *out)
    int mt_chunk_needed(const mt_range *need, int nneed, uint64_t offset, uint64_t length)
    int mt_zero_rows_ranges(const mt_layout *L, uint64_t tokens, mt_range *out)
    uint64_t mt_rows_length(const mt_layout *L, int buf, uint64_t tokens)
    uint64_t mt_rows_stride(const mt_layout *L, int buf)
    void mt_checksum_f32(const void *data, size_t n, double *out)

    ctypedef struct mt_cursor:
        pass
    mt_cursor *mt_cursor_new()
    void mt_cursor_free(mt_cursor *c)
    int mt_cursor_take(mt_cursor *c, uint64_t nbytes, uint64_t size, uint64_t *base)

    enum:
        MT_LIFE_OK
        MT_LIFE_RELEASED
        MT_LIFE_EXPORTED
        MT_LIFE_IN_FLIGHT
        MT_LIFE_FULL
        MT_LIFE_PAUSED
        MT_LIFE_BUSY
        MT_LIFE_SELF
        MT_LIFE_CLOSING
        MT_LIFE_FORKED
    enum:
        MT_WAIT_OPERATIONS
        MT_WAIT_ALL
    # The lifetime word's functions are metrale._base._life's (see _life.pxd): the
    # word keeps process-wide state that must not be copied per extension.
    ctypedef struct mt_life:
        pass

    ctypedef struct mt_scratch:
        pass
    ctypedef struct mt_scratch_stats:
        uint64_t active_threads
        uint64_t total_allocated
        uint64_t total_used
        uint64_t max_thread_usage
        uint64_t peak_total_used
        uint64_t peak_thread_usage
    mt_scratch *mt_scratch_new(size_t scratch_size, size_t max_threads)
    void mt_scratch_incref(mt_scratch *s)
    void mt_scratch_decref(mt_scratch *s)
    size_t mt_scratch_size(const mt_scratch *s)
    size_t mt_scratch_max_threads(const mt_scratch *s)
    long mt_scratch_find(mt_scratch *s)
    long mt_scratch_claim(mt_scratch *s)
    void mt_scratch_release(mt_scratch *s, long slot, uint64_t claim)
    uint64_t mt_scratch_claim_id(const mt_scratch *s, long slot)
    void mt_scratch_set_user(mt_scratch *s, long slot, void *user)
    void *mt_scratch_user(const mt_scratch *s, long slot)
    unsigned char *mt_scratch_base(mt_scratch *s, long slot)
    uint64_t mt_scratch_used(mt_scratch *s, long slot)
    unsigned char *mt_scratch_carve(mt_scratch *s, long slot, uint64_t n)
    void mt_scratch_reset(mt_scratch *s, long slot)
    void mt_scratch_reset_all(mt_scratch *s)
    uint64_t mt_scratch_active(const mt_scratch *s)
    void mt_scratch_get_stats(const mt_scratch *s, mt_scratch_stats *out)
    void mt_scratch_reset_peaks(mt_scratch *s)
    uint64_t mt_thread_id()

    # The torch pool (src/pool.c, compiled into metrale._arena._pool alone).
    ctypedef struct mt_pool_ops:
        void *ctx
        int (*create)(void *ctx, uint64_t n, uint64_t *handle) noexcept nogil
        int (*release)(void *ctx, uint64_t handle, uint64_t n) noexcept nogil
        int (*map)(void *ctx, uint64_t p, uint64_t n, uint64_t handle) noexcept nogil
        int (*unmap)(void *ctx, uint64_t p, uint64_t n) noexcept nogil
    ctypedef struct mt_pool:
        pass
    enum:
        MT_POOL_FULL
        MT_POOL_ASLEEP
        MT_POOL_FOREIGN
        MT_POOL_DEVICE
        MT_POOL_IN_USE
        MT_POOL_SIZE
        MT_POOL_SLOTS
    ctypedef struct mt_pool_stats:
        uint64_t reserved
        uint64_t committed
        uint64_t in_use
        uint64_t peak_committed
        uint64_t peak_in_use
        uint64_t segments
        uint64_t chunks
        uint64_t orphans
        uint64_t creates
        uint64_t allocs
        uint64_t frees
        uint64_t refused
        int asleep
    mt_pool *mt_pool_new(uint64_t base, uint64_t npages, uint64_t granule, const mt_pool_ops *ops)
    void mt_pool_free(mt_pool *p)
    int mt_pool_alloc(mt_pool *p, uint64_t n, uint64_t *out, int *err)
    int mt_pool_release(mt_pool *p, uint64_t ptr, uint64_t n)
    int mt_pool_trim(mt_pool *p, uint64_t *unmapped, int *err)
    int mt_pool_unmap_chunk(mt_pool *p, uint64_t offset, int *gone, int *err)
    int mt_pool_commit(mt_pool *p, uint64_t offset, uint64_t nbytes, int *err)
    void mt_pool_set_asleep(mt_pool *p, int on)
    void mt_pool_hold(mt_pool *p, int on)
    int mt_pool_close(mt_pool *p, int force, int *err)
    void mt_pool_get_stats(mt_pool *p, mt_pool_stats *out)
    uint64_t mt_pool_segments(mt_pool *p, mt_range *out, uint64_t cap)
    uint64_t mt_pool_chunks(mt_pool *p, mt_range *out, uint64_t cap)
    int mt_pool_bind(mt_pool *p)
    void mt_pool_unbind(int slot, int retire)
    void mt_pool_unretire(int slot)
    uint64_t mt_pool_slot_alloc(int slot)
    uint64_t mt_pool_slot_free(int slot)
    uint64_t mt_pool_stray_calls()
    void mt_lend_set(uint64_t ptr, uint64_t size)
    int mt_lend_out()
    uint64_t mt_lend_refused()
    uint64_t mt_lend_alloc_fn()
    uint64_t mt_lend_free_fn()


# Declarations of src/metrale/kernels/zero_ranges.h: the parameter blocks of
# the zeroing kernels and the one evaluation of zero_all_rows' table.
cdef extern from "metrale/kernels/zero_ranges.h" nogil:
    enum:
        MT_MAX_RANGES
        MT_MAX_ROWS_ENTRIES
    ctypedef struct mt_zero_args:
        unsigned long long base
        unsigned long long offset[MT_MAX_RANGES]
        unsigned long long length[MT_MAX_RANGES]
        unsigned int first[MT_MAX_RANGES + 1]
        unsigned int per
        int count
    ctypedef struct mt_rows_entry:
        unsigned long long offset
        unsigned long long size
        unsigned long long row
        unsigned long long row16
        unsigned long long lo
        unsigned long long hi
        unsigned long long pad_to
        int kind
    ctypedef struct mt_rows_args:
        unsigned long long base
        unsigned long long count_at
        unsigned long long m
        unsigned long long m16
        mt_rows_entry e[MT_MAX_ROWS_ENTRIES]
        unsigned int per
        unsigned int spread
        int n
    ctypedef struct mt_rows_launch:
        mt_rows_args a
        mt_zero_args fixed
        unsigned long long queue
        unsigned int rows_blocks
    int mt_rows_args_init(const mt_layout *L, uint64_t hole_lo, uint64_t hole_hi, mt_rows_args *a)
    unsigned long long mt_rows_count(const mt_rows_args *a, long long t)
    void mt_rows_segment(const mt_rows_args *a, int i, unsigned long long t,
                         unsigned long long *start, unsigned long long *end)


# Declarations of src/metrale/kernels/copy_runs.h: the parameter block of the
# kernel that copies many runs in one launch (CudaBackend.copy_runs).
cdef extern from "metrale/kernels/copy_runs.h" nogil:
    enum:
        MT_COPY_RUNS
    ctypedef struct mt_copy_run:
        unsigned long long dst
        unsigned long long src
        unsigned long long length
    ctypedef struct mt_copy_args:
        unsigned long long dst[MT_COPY_RUNS]
        unsigned long long src[MT_COPY_RUNS]
        unsigned long long length[MT_COPY_RUNS]
        unsigned int first[MT_COPY_RUNS + 1]
        unsigned int per
        int count
