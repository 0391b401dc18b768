# The host backend (_host_backend.pyx): host memory, synchronous; its fields.
from libc.stdint cimport uint64_t
from metrale._backends._backend cimport Backend

cdef class HostBackend(Backend):
    cdef dict _live        # base -> bytes of every allocation it holds (for check_range)
    cdef uint64_t _next_handle   # the last token create() handed out
    cdef dict _memfds      # handle -> memfd of an exportable or imported handle (shared pages)
    cdef dict _host_at     # address -> bytes of each host handle mapped now (map_host)
    cdef dict _shared_at   # address -> (memfd, bytes) of each shareable handle mapped now:
                           # a wake's fill puts back its pages, not private ones
    cdef list _host_spans  # [(lo, hi)] sorted, disjoint: where host memory is mapped now (over
                           # device memory, after map_host over a chunk: maps_over)
