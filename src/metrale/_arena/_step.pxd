# One engine's step inputs (see _step.pyx): its fields, as the other concepts'
# are declared (cuda.core's way), for the modules that work on it.
from libc.stdint cimport uint64_t, uintptr_t

from metrale._arena._arena_state cimport ArenaState
from metrale._backends._backend cimport Backend
from metrale._backends._staging cimport _Staging
from metrale._base._core cimport mt_life, mt_rows_args


cdef class StepInputs:
    cdef ArenaState _arena        # the arena it uploads into (held: it outlives the inputs' use)
    cdef Backend _gpu             # the arena's backend (the event, the copy)
    cdef _Staging _staging        # the pinned memory and its lifetime word
    cdef mt_life *_life           # _staging's word: views, operations, released (hot path)
    cdef unsigned char *_host     # _staging's memory (hot path)
    cdef readonly uint64_t nbytes # the staging's bytes, each upload's copy
    cdef uintptr_t _dst           # where the span starts in the slab
    cdef uintptr_t _event         # recorded after each upload's copy (wait, event)
    cdef bint _has_event          # _event made (and to destroy)
    cdef uint64_t _count_off      # the token count's offset in the span
    cdef uint64_t _built_at       # the arena's reshape count when made (resize refuses)
    cdef mt_rows_args _rows       # zero_all_rows' parameter block, the count read on the device
    cdef dict _regions            # region -> (dtype, offset, shape)
    cdef dict _views              # region -> its numpy view, made on first use
    cdef dict _alias              # a role's buffer name -> its role's region
    cdef readonly object layout   # the reference's DecodeMetaLayout, or None
    cdef readonly uint64_t max_blocks, max_batch_tokens

    cdef int _build(self, ArenaState arena, object max_blocks) except -1
    cdef int _check(self) except -1
    cdef object _view(self, str name)
    cdef int _enter(self) except -1
