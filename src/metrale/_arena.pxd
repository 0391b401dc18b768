# BufferArena's fields, declared once: the modules of its other concepts
# (_reserve: reserved memory, _step: step inputs, _debug: debug operations,
# _peer: tensor-parallel sharing) cimport it and work on the arena directly.
from cpython.ref cimport PyObject
from libc.stdint cimport uint64_t, uintptr_t

from metrale._backend cimport Backend
from metrale._core cimport mt_cursor, mt_layout, mt_life
from metrale._held cimport Held


cdef class BufferArena:
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
    cdef object _debug            # DebugOptions of a debug arena, else None

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

    # -- reserved memory (_reserve.pyx; docs/stable-addresses.md) -------------------------
    # What stands for memory or handles is Held (_held.pyx): rows the cyclic
    # collector cannot clear before the finalizer frees what they hold.
    cdef bint _reserved           # built with a reservation: pointers never move
    cdef bint _sleeping           # sleep gave the physical memory back
    cdef uint64_t _granule        # the backend's allocation granularity
    cdef object _top_sizes        # BufferSizes of the reserved limits (each buffer's room)
    cdef object _top_limits       # the reserved limits, as _limits
    cdef Held _chunks             # [(offset, bytes, handle)] mapped now, sorted
    cdef Held _kept               # [(buffer id, host pointer, capacity)] pinned copies for
                                  # sleep(keep=...): made once, reused, freed by release
    cdef dict _keeping            # buffer id -> bytes this sleep copied to its _kept buffer
    cdef Held _hosted             # [(offset, bytes, handle)] host memory for sleep(offload=...):
                                  # made once, reused, freed by release
    cdef uintptr_t _stage         # a reservation of slab_bytes where _hosted stay mapped
    cdef Held _at_base            # asleep: the _hosted mapped at the buffers' own addresses too
    cdef Held _host_orphans       # [(handle, bytes)] host handles whose release failed: retried
    cdef dict _offloaded          # buffer id -> bytes this sleep moved to host memory
    cdef uint64_t _piece          # chunks no longer than this (0: any), set by the first
                                  # sleep that keeps or offloads, so that later ones pipeline
    cdef Held _orphans            # [(handle, bytes)] unmapped, whose release failed: retried
    cdef uint64_t _reshapes       # resizes so far (StepInputs made before one refuse)
    cdef uint64_t _peak           # the most bytes ever committed (memory_stats)

    # -- tensor-parallel sharing (_peer.pyx; docs/tensor-parallel.md) ---------------------
    cdef bint _shareable          # physical chunks created exportable
    cdef object _peers            # the peers' mappings (metrale.tp._Sharing), or None

    cdef object __weakref__
    # The process's arenas, a list linked through the arenas themselves (no
    # reference held: __dealloc__ unlinks), for metrale.stats().
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
    # Free the memory (a reservation with its chunks, host copies and the
    # peers' mappings); what fails stays recorded for the next call.
    cdef int _free(self) except -1
    # Whether it still holds memory, a reservation or a handle (what _free
    # frees): a release or a finalizer has something left to free.
    cdef bint _holds(self)


# Every arena alive in the process (new references, in no particular order).
cdef list live_arenas()
# Zero-fill the buffers whose specs ask for it at construction (init_zero), and
# wait for it.
cdef int init_zero(BufferArena a) except -1

