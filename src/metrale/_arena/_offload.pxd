# The offload engine (see _offload.pyx): device memory moved to host memory
# mapped at the same addresses and back, for the two owners of device memory
# that sleep (a Reservation's chunks, a Pool's), through one protocol.
from libc.stdint cimport uint64_t, uintptr_t

from metrale._backends._backend cimport Backend
from metrale._base._held cimport Held


cdef class Owner:
    # Physical chunks mapped at offsets of one reserved range, which the
    # engine unmaps one at a time and asks for again.
    # The chunks mapped now: [(offset, bytes)] in address order.
    cdef list mapped(self)
    # Unmap and release the chunk at `offset` (the device waited for): None,
    # or the error (the chunk stays mapped where its unmap failed; a handle
    # whose release failed is kept, released again later, the chunk gone).
    cdef object unmap_one(self, uintptr_t base, uint64_t offset)
    # Map what `need` ([(offset, bytes)], sorted) holds in [lo, hi) and is
    # not mapped, all or nothing.  `fill` (backends that map over): each new
    # chunk mapped over the host memory there, holding the bytes at
    # fill + its offset.
    cdef int commit_need(self, uintptr_t base, list need, uint64_t lo, uint64_t hi,
                         uintptr_t fill) except -1


cdef class Offload:
    cdef Backend gpu
    cdef uint64_t span            # the owner's range: the staging range's bytes
    cdef uint64_t granule
    cdef uint64_t piece           # host memory in pieces of at most this (the last tapered)
    cdef uintptr_t stage          # a reservation of `span` where `hosted` stay mapped
    cdef uintptr_t base           # the owner's addresses `at_base` is mapped at (show sets it)
    cdef Held hosted              # [(offset, bytes, handle)] host memory, made once, reused
    cdef Held at_base             # asleep: those of `hosted` mapped at the owner's addresses
    cdef Held orphans             # [(handle, bytes)] host handles whose release failed

    # Host memory covering every (offset, bytes) run, mapped at the staging
    # range: what it has when it covers them, else made anew (the old given
    # back first).
    cdef int host_memory(self, list runs) except -1
    cdef int _drop(self, list hosted) except -1
    # The host pieces that hold some of `runs`.
    cdef list overlapping(self, list runs)
    # Map `entries` (some of `hosted`) at the owner's addresses from `base`;
    # on failure what this call mapped is unmapped again (mapping over: it
    # stays in `at_base`, over the device memory, for a wake to take down).
    cdef int show(self, uintptr_t base, list entries) except -1
    cdef uint64_t host_bytes(self)
    cdef bint holds(self)
    # Give everything back (unmapped from the owner's addresses and the
    # staging range, released); what fails stays for the next call: the
    # first error, or None.
    cdef object close(self)
    # In a forked child: the memory is the parent's (or the child's copy,
    # given back with its ranges); forget it all.
    cdef void forget(self) noexcept


# One owner's part of a sleep or a wake.
cdef class Lane:
    cdef Offload engine
    cdef Owner owner
    cdef uintptr_t base
    cdef list moves               # [(offset, bytes)] bytes that go to host memory mapped at
                                  # their addresses (offloaded) and come back
    cdef list keeps               # [(offset, bytes, host address)] bytes copied to pinned
                                  # copies and back
    cdef list runs                # the granules of `moves`, merged: the host memory under them
    cdef list need                # wake: [(offset, bytes)] what the owner needs mapped
    cdef bint asleep              # its memory given back (set by sleep_lanes, wake_lanes)
    cdef list _pending            # sleep: host pieces not yet mapped at `base`


cdef Offload offload_new(Backend gpu, uint64_t span)
cdef Lane lane_new(Offload engine, Owner owner, uintptr_t base, list moves, list keeps,
                   list need)
# Sleep every lane in one pipeline: the device's work waited for by the
# caller; each chunk's bytes copied out (moves to the staging range, keeps to
# their copies), then each chunk unmapped and the host memory mapped at the
# owners' addresses, no offloaded address ever left without memory where the
# backend maps over.  All or nothing but for unmaps and releases: a copy or
# a mapping failing leaves every lane awake with its moved and kept bytes
# (`asleep` False); a failed unmap or release leaves the lanes asleep (that
# chunk mapped; a handle kept); the first error follows.  `after()` (None:
# nothing) runs once a failed sleep brought the memory back, as for wake.
cdef int sleep_lanes(Backend be, list lanes, object after) except -1
# Wake every lane: each host piece at an owner's addresses taken down, the
# device memory under it mapped and its bytes copied back (range by range,
# each copy running while the next range is mapped), the rest of `need`
# mapped, the kept bytes copied back; then `after()` (None: nothing), the
# owner's own work on the new memory; then the copies are waited for.  All
# or nothing: on failure every lane sleeps as before.
cdef int wake_lanes(Backend be, list lanes, object after) except -1

# The granules the (offset, bytes) spans touch, as merged (offset, bytes) runs.
cdef list granule_runs(list spans, uint64_t g)
# The (offset, bytes) stretches both lists of runs cover.
cdef list overlap(list a, list b)
# The parts of [lo, hi) outside the (lo, hi) `ranges` (any order, overlapping
# or not), as (lo, hi) pairs.
cdef list outside(uint64_t lo, uint64_t hi, list ranges)
# The (offset, bytes) `runs` cut in pieces of at most `piece` bytes (0: whole).
cdef list cut(list runs, uint64_t piece)
# `pieces` (in address order) with the last one halved again and again, each
# part whole granules, until the last is at most `least` bytes: what is done
# piece by piece behind a stream of copies (an offloading sleep maps each host
# piece at its owner's addresses once its copy is done) leaves only the last,
# smallest, piece's part after the copies.
cdef list tapered(list pieces, uint64_t granule, uint64_t least)
