# cython: language_level=3, binding=False
"""Taking down physical chunks mapped into a reservation.

A reserved arena (docs/stable-addresses.md) and the peers' slabs a shared
arena maps (docs/tensor-parallel.md) both hold chunks: a physical handle
mapped at an offset of a virtual reservation.  Unmapping a chunk and
releasing its handle are two backend calls that can each fail; this module
is the one loop that does both for a list of chunks, keeps every chunk it
could not unmap mapped (and recorded), and keeps every handle whose release
the backend refused, so that it is released again later instead of being
forgotten (`summary().unreleased_handles` counts an arena's).
"""

from libc.stdint cimport uintptr_t

from metrale._backends._backend cimport Backend

cdef object _log = None


cdef object _logger():
    global _log
    if _log is None:
        import logging
        _log = logging.getLogger("metrale")
    return _log


cdef object unmap_chunks(Backend be, uintptr_t base, object chunks, object mapped,
                         object orphans):
    first = None
    for c in list(chunks):
        try:
            be.unmap(base + c[0], c[1])
        except Exception as e:
            first = first or e
            continue
        if c in mapped:
            mapped.remove(c)
        try:
            be.release_handle(c[2], c[1])
        except Exception as e:
            first = first or e
            orphans.append((c[2], c[1]))
            _logger().warning("releasing a %d-byte physical handle failed (%s); it is kept and "
                              "released again later", c[1], e)
    return first


cdef object release_orphans(Backend be, object orphans):
    first = None
    for h, n in list(orphans):
        try:
            be.release_handle(h, n)
        except Exception as e:
            first = first or e
            continue
        orphans.remove((h, n))
    return first


cdef tuple free_reservation(Backend be, uintptr_t base, uintptr_t alloc, size_t nbytes,
                            object chunks, object orphans, bint waited=False, bint others=False):
    first = None
    try:
        if chunks and not waited:
            be.quiesce()            # no kernel may still use memory given back
    except Exception as e:
        first = e
    unmapping = unmap_chunks(be, base, chunks, chunks, orphans)
    retrying = release_orphans(be, orphans)
    if chunks or orphans:
        first = first or unmapping or retrying
    freed = False
    if base and not chunks and not others:
        try:
            be.unreserve(alloc, nbytes)
        except Exception as e:
            first = first or e
        else:
            freed = True
    return first, freed
