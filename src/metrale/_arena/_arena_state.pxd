# The arena's own fields, declared once (see _arena_state.pyx): BufferArena
# (_buffer_arena.pyx) is an ArenaState, and the modules of its concepts (_reserve,
# _sleep, _peer, _step, _view, _debug, _summary, ...: docs/architecture.md) work
# on this type; each concept's own state is one typed field.
from cpython.ref cimport PyObject
from libc.stdint cimport uint64_t, uintptr_t

from metrale._backends._backend cimport Backend
from metrale._base._core cimport mt_cursor, mt_layout, mt_life
from metrale._arena._peers cimport Peers
from metrale._arena._pool cimport Pool
from metrale._arena._reservation cimport Reservation
from metrale._arena._sleep_state cimport SleepState


cdef class ArenaState:
    # -- the hot path, first: next to the object's header -----------------------------
    cdef tuple _ptrs              # prebuilt pointer ints by buffer id: an accessor is one load;
                                  # replaced (never mutated) whenever a pointer changes
    cdef tuple _bytes             # sizes by buffer id; replaced whenever a size changes
    cdef tuple _ref_ptrs          # the same by REFERENCE id, for the compiled accessors (the
    cdef tuple _ref_bytes         # same tuples for REFERENCE; ABSENT where the set lacks one)
    cdef readonly object ptrs     # the pointer table: one attribute per buffer
    cdef dict _ptr_by_name        # name -> pointer (`ptr`); None until then after _ptrs changed

    # -- what the buffers are sized for -----------------------------------------------
    cdef object _buffers          # the BufferSet: which buffers, in which order (their ids)
    cdef dict _index              # its name -> id (the set's own dict, never changed)
    cdef object _config           # ModelConfig of one rank: what the sizes were computed from
    cdef object _model            # the whole model's ModelConfig (`new`), which resize sizes
                                  # again; None for `from_sizes`
    cdef object _tp               # tensor-parallel ranks the sizes are per-rank sizes for
    cdef object _sizes            # BufferSizes now
    cdef object _limits           # (max_batch_tokens, max_seq_len, kv_block_size,
                                  # max_batch_size) now; None when the sizes record none
    cdef object _max_tokens       # max_batch_tokens now: the row stride zero_all_rows trims by
    cdef object _max_seqs         # max_batch_size now
    cdef object _decode_meta      # DecodeMetaLayout of _max_seqs
    cdef object _debug            # DebugOptions of a debug arena (its guard bands), else None

    # -- where the buffers are ---------------------------------------------------------
    cdef Backend _gpu             # holds the memory; every operation goes through it
    cdef mt_layout _layout        # offsets and sizes (C core), the zero ranges derive from it
    cdef uintptr_t _base          # where the buffers start (offsets are from it); 0 once freed
    cdef uintptr_t _alloc         # the allocation (or reservation) holding them: _base, or
                                  # below it where a buffer's alignment moved the base up
    cdef dict _infos              # name -> BufferInfo, made from the two tuples in _infos_of
    cdef tuple _infos_of

    # -- lifetime ------------------------------------------------------------------------
    cdef mt_life *_life           # released flag, live views, operations in flight, reshape
    cdef bint _freeing            # a release is freeing the memory now
    cdef mt_cursor *_cursor       # the carve cursor of ssm_rowwise_w_bf16
    cdef dict _moe_cache          # (config, rows) -> MoeFp8Scratch

    # -- the concepts' state: each frees what it holds through close() ------------------
    cdef Reservation _reservation   # reserved memory (docs/stable-addresses.md); None: a plain
                                    # arena, one allocation
    cdef SleepState _sleep_state    # a reserved arena's sleep; None with _reservation
    cdef Peers _peers             # a shared arena's peers (docs/tensor-parallel.md), or None
    cdef Pool _pool               # the pool beside the buffers (open_pool, docs/torch.md), or None
    cdef uintptr_t _rows_queue    # the work counter of its zero_all_rows(tokens_at=...) launches,
                                  # lent by _gpu at the first (0: none yet, or none to lend),
                                  # given back when the arena is released or collected

    cdef object __weakref__
    # The process's arenas, a list linked through the arenas themselves (no
    # reference held: the finalizer unlinks), for metrale.stats().
    cdef PyObject *_live_prev
    cdef PyObject *_live_next

    # Start an operation that holds the arena (pair with mt_life_leave): refused
    # with the lifetime word's exception, or for a backend not the arena's own.
    cdef int _enter(self, object gpu) except -1
    # The live views by buffer, for a refusal's message.
    cdef str _exported(self)
    # Every buffer's pointer from _base and the layout (`room`: a reserved
    # arena's pointers are those of its reserved room).
    cdef tuple _pointers(self, bint room)
    # Replace the pointers (and the reference view and the pointer table) or
    # the sizes: the one place each changes.
    cdef int _set_ptrs(self, tuple ptrs) except -1
    cdef int _set_bytes(self, tuple sizes) except -1
    # BufferArena.release (_lifetime): wait for the operations in flight, then free.
    cdef int _release(self, object gpu) except -1
    # Free the memory: each concept closes what it holds (the peers, the pool,
    # the sleep, the reservation: docs/architecture.md); what fails stays
    # recorded for the next call.
    cdef int free_memory(self) except -1
    # The finalizer: unlinked, and what the arena still holds freed.
    cdef void finalize(self) noexcept
    # The work counter back to _gpu, once the memory is freed (release, finalize).
    cdef void _return_queue(self) noexcept
    # Whether it still holds memory, a reservation or a handle.
    cdef bint holds(self)


# Whether the arena sleeps (its physical memory given back).
# Raise for lifetime code `rc` of `what` (buffer `i`'s view; -1: an
# operation), naming the classes asleep where a sleep refuses it.
cdef int refuse(ArenaState a, int rc, str what, int i) except -1
cdef bint sleeping(ArenaState a)
# Resizes of a reserved arena so far (0 for a plain one).
cdef uint64_t reshapes(ArenaState a)
# Every arena alive in the process (new references, in no particular order).
cdef list live_arenas()
cdef void link(ArenaState a) noexcept
cdef void unlink(ArenaState a) noexcept
# All-zero pointers for the arena's set.
cdef tuple zeros(ArenaState a)

# The arena's work counter for zero_all_rows(tokens_at=...), lent by its
# backend at the first call (0 when the backend has none to lend: the launch
# then shares its tiles out in fixed shares); returned by the finalizer.
cdef uintptr_t rows_queue(ArenaState a) noexcept
