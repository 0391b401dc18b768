# Physical chunks mapped into a reservation (see _mapping.pyx): taking them
# down, shared by reserved arenas (_arena, _reserve) and the peers' slabs (_peer).
from libc.stdint cimport uintptr_t

from metrale._backends._backend cimport Backend

# Unmap each chunk (offset, bytes, handle) of `chunks` at base + offset and
# release its handle; a chunk unmapped leaves `mapped`, a handle whose release
# fails goes to `orphans`.  Every chunk is tried; returns the first error or None.
cdef object unmap_chunks(Backend be, uintptr_t base, object chunks, object mapped,
                         object orphans)
# Release again the (handle, bytes) of `orphans`; those that fail stay.  Returns
# the first error or None.
cdef object release_orphans(Backend be, object orphans)
# Free a reservation of `nbytes` at `alloc`, whose chunks are mapped at offsets
# from `base` (alloc, or above it where the layout's base alignment moved it),
# and what is in it: wait for the device (unless `waited`: the caller just
# did), unmap every chunk of `chunks` (a list it empties), release the
# orphans, then the reservation itself if nothing stays mapped (`others`:
# something the caller holds is still mapped in it, so it stays).  Returns (error or None, whether
# the reservation was freed); an unmap or release error counts only if
# something is still held.
cdef tuple free_reservation(Backend be, uintptr_t base, uintptr_t alloc, size_t nbytes,
                            object chunks, object orphans, bint waited=*, bint others=*)
