# Building a BufferArena (see _construct.pyx), for BufferArena.new and from_sizes.
from metrale._arena._arena_state cimport ArenaState

# `new`'s (sizes, reserved sizes or None), for the backend's target.
cdef tuple new_sizes(object config, tuple limits, object gpu, object reserve, object tp_size,
                     object env, object buffers)
# (config, sizes, max_batch_tokens, max_batch_size, gpu) of from_sizes' two forms.
cdef tuple sizes_args(tuple args)
# (max_batch_tokens, max_batch_size) of an arena of `sizes`, every argument checked.
cdef tuple limits_of(object sizes, object max_batch_tokens, object max_batch_size, object gpu,
                     object reserve_sizes)
# Set a new arena's state and make its memory; on failure nothing is left.
cdef int construct(ArenaState self, object config, object sizes, object max_batch_tokens,
                   object max_batch_size, object gpu, object reserve_sizes, object debug,
                   object group, bint exportable) except -1
