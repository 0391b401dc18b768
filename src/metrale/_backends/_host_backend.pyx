# cython: language_level=3, binding=False
"""The host backend: host memory, synchronous (the interface: _backend.pyx)."""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport free as c_free, malloc as c_malloc
from libc.string cimport memcpy, memset as c_memset

from metrale._backends._backend cimport Backend
from metrale._base._common cimport mt_py_finalizing
from metrale._base._core cimport MT_ALIGN
from metrale._base._debug_core cimport mt_debug_args, mt_debug_host, mt_debug_result
from metrale._base._peer_core cimport MT_RED_TIMEOUT, mt_peer_reduce_host, mt_reduce_args

import fcntl
import os

from metrale._base.errors import MetraleError, OutOfMemoryError

cdef extern from "<stdlib.h>" nogil:
    void *aligned_alloc(size_t alignment, size_t size)

cdef extern from "<sys/mman.h>" nogil:
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    # glibc's, with _GNU_SOURCE (pyconfig.h defines it)
    void *mremap(void *old, size_t old_size, size_t new_size, int flags, void *new_address)
    int PROT_NONE, PROT_READ, PROT_WRITE
    int MAP_PRIVATE, MAP_SHARED, MAP_ANONYMOUS, MAP_NORESERVE, MAP_FIXED
    int MREMAP_MAYMOVE, MREMAP_FIXED
    void *MAP_FAILED

cdef extern from "<unistd.h>" nogil:
    long sysconf(int name)
    int _SC_PAGESIZE

cdef extern from "<errno.h>" nogil:
    int errno


cdef int _decommit(uintptr_t p, size_t n) except -1:
    """[p, p + n) without memory again (reserved, PROT_NONE)."""
    cdef void *q
    with nogil:
        q = mmap(<void *>p, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                 -1, 0)
    if q == MAP_FAILED:
        raise MetraleError(f"host decommit of {n} bytes at {p:#x} failed (errno {errno})")
    return 0


cdef int _filled_over(uintptr_t p, size_t n, uintptr_t src, int fd=-1, size_t at=0) except -1:
    """New pages holding the n bytes at `src`, moved over [p, p + n) in one
    mremap: a reader there sees the old pages or the new, never none.  Private
    pages, or those of memfd `fd` from offset `at` (a shareable handle's, which
    its importers map too)."""
    cdef void *q
    cdef void *r
    with nogil:
        if fd >= 0:
            q = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, at)
        else:
            q = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if q == MAP_FAILED:
        raise OutOfMemoryError(f"host commit of {n} bytes at {p:#x} refused (errno {errno})")
    with nogil:
        memcpy(q, <void *>src, n)
        r = mremap(q, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, <void *>p)
    if r == MAP_FAILED:
        err = errno
        munmap(q, n)
        raise OutOfMemoryError(f"host commit of {n} bytes at {p:#x} refused (errno {err})")
    return 0


cdef list _parts(list spans, uintptr_t lo, uintptr_t hi, bint inside):
    """The parts of [lo, hi) inside (or outside) `spans`, sorted disjoint
    (lo, hi) pairs."""
    out = []
    at = lo
    for a, b in spans:
        if b <= lo or hi <= a:
            continue
        x, y = max(a, lo), min(b, hi)
        if inside:
            out.append((x, y))
        elif x > at:
            out.append((at, x))
        at = max(at, y)
    if not inside and at < hi:
        out.append((at, hi))
    return out


cdef list _less(list spans, uintptr_t lo, uintptr_t hi):
    """`spans` without [lo, hi)."""
    out = []
    for a, b in spans:
        if b <= lo or hi <= a:
            out.append((a, b))
            continue
        if a < lo:
            out.append((a, lo))
        if hi < b:
            out.append((hi, b))
    return out


cdef list _more(list spans, uintptr_t lo, uintptr_t hi):
    """`spans` with [lo, hi), merged."""
    out = []
    for a, b in sorted(_less(spans, lo, hi) + [(lo, hi)]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


@cython.no_gc_clear         # as every backend (see _backend.pyx)
cdef class HostBackend(Backend):
    """HostBackend()
--

Host memory, synchronous: everything the arena does, with no GPU.

    Memory comes from ``aligned_alloc``, 256-byte aligned; views of it are CPU
    arrays (``numpy.asarray``, ``numpy.from_dlpack``).  Every operation is
    finished when the call returns; stream arguments are checked, then
    ignored.  There is no upload / download / synchronize: read and write the
    memory through views.  For tests of an engine's buffer plumbing on
    machines without a GPU, for planning an arena's layout, and for CPU runs
    of reference kernels.  Its read-only counters (``alloc_count``,
    ``live_bytes``, ``memset_count`` ...; see `Backend`) let tests assert
    what an operation cost; ``metrale.testing.FaultyBackend`` is a
    HostBackend that fails on demand.
    """

    def __cinit__(self):
        self.device_type = 1
        self.device_id = 0
        self._live = {}
        self._memfds = {}
        self._host_spans = []
        self._host_at = {}
        self._shared_at = {}

    def __dealloc__(self):
        # Descriptors of handles nobody released (an arena's teardown that
        # failed): this backend is the last that could use them.
        if self._memfds and not mt_py_finalizing():
            for fd in self._memfds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass

    def target(self):
        """The reference target, whatever the machine.

        Sizes computed on the host are the reference device's.  To plan for
        a particular GPU without one, pass its target to
        ``BufferSizes.from_config`` instead.

        Returns
        -------
        Target
            ``Target.reference()``: 48 SMs, legacy split-K.
        """
        from metrale._sizing.target import Target
        return Target.reference()

    cdef int check_range(self, uintptr_t p, size_t n) except -1:
        for base, size in self._live.items():
            if base <= p and n <= size and p - base <= size - n:
                return 0
        raise ValueError(f"ranges: [{p:#x}, +{n}) is not inside memory this HostBackend allocated")

    cdef int alloc(self, size_t n, uintptr_t *out) except -1:
        cdef void *p
        with nogil:
            p = aligned_alloc(MT_ALIGN, (n + MT_ALIGN - 1) // MT_ALIGN * MT_ALIGN if n else MT_ALIGN)
        if p == NULL:
            raise OutOfMemoryError(f"host allocation of {n} bytes refused")
        out[0] = <uintptr_t>p
        self._live[<uintptr_t>p] = n
        self._note_alloc(n)
        return 0

    cdef int free(self, uintptr_t p, size_t n) except -1:
        self._live.pop(p, None)
        with nogil:
            c_free(<void *>p)
        self._note_free(n)
        return 0

    cdef void free_quiet(self, uintptr_t p, size_t n) noexcept:
        if self._live is not None:
            self._live.pop(p, None)
        c_free(<void *>p)
        self._note_free(n)

    cdef int memset(self, uintptr_t p, size_t n, uintptr_t stream) except -1:
        with nogil:
            c_memset(<void *>p, 0, n)
        self.memset_count += 1
        return 0

    cdef int d2h(self, void *dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        with nogil:
            memcpy(dst, <void *>src, n)
        self.d2h_count += 1
        return 0

    cdef int h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        with nogil:
            memcpy(<void *>dst, src, n)
        self.h2d_count += 1
        return 0

    cdef int sync(self, uintptr_t stream) except -1:
        self.sync_count += 1
        return 0

    cdef int copy_h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        with nogil:
            memcpy(<void *>dst, src, n)
        self.h2d_count += 1
        return 0

    # Work runs at the call: an event is complete once recorded.
    cdef int event_create(self, uintptr_t *out) except -1:
        out[0] = 1
        return 0

    cdef int event_record(self, uintptr_t event, uintptr_t stream) except -1:
        return 0

    cdef int event_wait(self, uintptr_t event) except -1:
        return 0

    # -- virtual memory: one PROT_NONE mapping reserved, pages committed by
    # mapping read/write over it and given back by mapping PROT_NONE again.
    cdef size_t granularity(self) except 0:
        return <size_t>sysconf(_SC_PAGESIZE)

    cdef int reserve(self, size_t n, uintptr_t *out) except -1:
        cdef void *p
        with nogil:
            p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        if p == MAP_FAILED:
            raise OutOfMemoryError(f"host reservation of {n} bytes refused (errno {errno})")
        out[0] = <uintptr_t>p
        self.reserved_bytes += n
        return 0

    cdef int unreserve(self, uintptr_t p, size_t n) except -1:
        cdef int rc
        with nogil:
            rc = munmap(<void *>p, n)
        if rc != 0:
            raise MetraleError(f"munmap of the {n}-byte reservation at {p:#x} failed (errno {errno})")
        self._host_spans = _less(self._host_spans, p, p + n)
        for q in [q for q in self._host_at if p <= q < p + n]:
            del self._host_at[q]
        self.reserved_bytes -= n
        return 0

    cdef int create(self, size_t n, uint64_t *handle) except -1:
        # The pages themselves come with map(): the handle is a token.
        self._next_handle += 1
        handle[0] = self._next_handle
        self.handle_count += 1
        return 0

    cdef int release_handle(self, uint64_t handle, size_t n) except -1:
        fd = self._memfds.pop(handle, None)
        if fd is not None:
            os.close(fd)
        self.handle_count -= 1
        return 0

    cdef int map(self, uintptr_t p, size_t n, uint64_t handle) except -1:
        cdef void *q
        cdef int fd = self._memfds.get(handle, -1)
        with nogil:
            if fd >= 0:     # a shareable handle: its memfd's pages, shared with the peers
                q = mmap(<void *>p, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
            else:
                q = mmap(<void *>p, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
        if q == MAP_FAILED:
            raise OutOfMemoryError(f"host commit of {n} bytes at {p:#x} refused (errno {errno})")
        if fd >= 0:
            self._shared_at[p] = (fd, n)
        self._host_spans = _less(self._host_spans, p, p + n)
        self._live[p] = n
        self.mapped_bytes += n
        return 0

    cdef int unmap(self, uintptr_t p, size_t n) except -1:
        # host memory mapped over part of the chunk (map_host, maps_over) stays
        for lo, hi in _parts(self._host_spans, p, p + n, False):
            _decommit(lo, hi - lo)
        self._live.pop(p, None)
        self._shared_at.pop(p, None)
        self.mapped_bytes -= n
        return 0

    # -- mapping over: host memory and device memory are both pages here, so
    # one mmap (or mremap) replaces one by the other with no moment between
    cdef int map_host(self, uintptr_t p, size_t n, uint64_t handle) except -1:
        # the memfd's pages, over whatever is there; a handle mapped there
        # already is shown again over what covers it (counted once)
        again = self._host_at.get(p) == n
        self.map(p, n, handle)
        self.mapped_bytes -= n
        if not again:
            self.host_mapped_bytes += n
            self._host_at[p] = n
        self._host_spans = _more(self._host_spans, p, p + n)
        return 0

    cdef int unmap_host(self, uintptr_t p, size_t n) except -1:
        # device memory mapped over part of it since (map_filled) stays
        for lo, hi in _parts(self._host_spans, p, p + n, True):
            _decommit(lo, hi - lo)
        self._host_spans = _less(self._host_spans, p, p + n)
        self._host_at.pop(p, None)
        self._live.pop(p, None)
        self.host_mapped_bytes -= n
        return 0

    cdef bint maps_over(self):
        return True

    cdef int map_filled(self, uintptr_t p, size_t n, uint64_t handle, uintptr_t src) except -1:
        cdef int fd = self._memfds.get(handle, -1)
        _filled_over(p, n, src, fd, 0)
        if fd >= 0:
            self._shared_at[p] = (fd, n)
        self._host_spans = _less(self._host_spans, p, p + n)
        self._live[p] = n
        self.mapped_bytes += n
        return 0

    cdef int refill(self, uintptr_t p, size_t n, uintptr_t src) except -1:
        cdef int fd = -1
        cdef size_t at = 0
        for a, (f, m) in self._shared_at.items():     # a shareable chunk: its own pages
            if a <= p < a + m:
                if p + n > a + m:       # past the memfd's end: its pages would fault
                    raise MetraleError(f"refill of [{p:#x}, +{n}) crosses the end of the "
                                       f"shareable chunk at {a:#x} ({m} bytes)")
                fd, at = f, p - a
                break
        _filled_over(p, n, src, fd, at)
        self._host_spans = _less(self._host_spans, p, p + n)
        return 0

    cdef int quiesce(self) except -1:
        return 0

    # Host memory for offloaded buffers: a memfd, so that it can be mapped at
    # two places (the arena's own addresses and its staging range) at once.
    cdef int create_host(self, size_t n, uint64_t *handle) except -1:
        self.create_exportable(n, handle)
        self.handle_count -= 1
        self.host_handle_count += 1
        self.host_handle_bytes += n
        return 0

    cdef int release_host(self, uint64_t handle, size_t n) except -1:
        self.release_handle(handle, n)
        self.handle_count += 1
        self.host_handle_count -= 1
        self.host_handle_bytes -= n
        return 0

    cdef int copy(self, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        with nogil:
            memcpy(<void *>dst, <void *>src, n)
        return 0

    cdef int side_stream(self, uintptr_t *out) except -1:
        out[0] = 0
        return 0

    cdef int host_alloc(self, size_t n, void **out) except -1:
        out[0] = c_malloc(n if n else 1)
        if out[0] == NULL:
            raise OutOfMemoryError(f"host copy buffer of {n} bytes refused")
        self.host_alloc_count += 1
        self.live_host_alloc_count += 1
        return 0

    cdef void host_free(self, void *p) noexcept:
        c_free(p)
        self.live_host_alloc_count -= 1

    cdef int debug_run(self, int op, mt_debug_args *a, mt_debug_result *out,
                       uintptr_t stream) except -1:
        with nogil:
            mt_debug_host(op, a, out)
        return 0

    cdef int peer_reduce(self, mt_reduce_args *a, uintptr_t stream) except -1:
        cdef unsigned int status
        if a == NULL:           # an arena is being shared: nothing to load here
            return 0
        with nogil:
            status = mt_peer_reduce_host(a)
        if status:
            raise MetraleError(
                f"peer_all_reduce: rank {a.me} waited more than {a.timeout_ns / 1e9:g} s for rank "
                f"{status - MT_RED_TIMEOUT} at a barrier (did it die, or make other calls?); "
                "this arena's reductions stay refused: release it on every rank and build it again")
        return 0

    # -- peer sharing: a memfd per exportable handle, passed as a descriptor and
    # mapped MAP_SHARED by map() in both processes (docs/tensor-parallel.md).
    cdef int create_exportable(self, size_t n, uint64_t *handle) except -1:
        try:
            fd = os.memfd_create("metrale", os.MFD_CLOEXEC)
        except OSError as e:
            raise OutOfMemoryError(f"shareable host memory of {n} bytes refused: {e}") from e
        try:
            os.ftruncate(fd, n)
        except OSError as e:
            os.close(fd)
            raise OutOfMemoryError(f"shareable host memory of {n} bytes refused: {e}") from e
        self._next_handle += 1
        handle[0] = self._next_handle
        self._memfds[self._next_handle] = fd
        self.handle_count += 1
        return 0

    cdef int export_handle(self, uint64_t handle, size_t n, int *fd) except -1:
        own = self._memfds.get(handle)
        if own is None:
            raise MetraleError(f"export of handle {handle}: not a shareable handle of this backend")
        try:
            fd[0] = fcntl.fcntl(own, fcntl.F_DUPFD_CLOEXEC, 0)
        except OSError as e:
            raise MetraleError(f"export of handle {handle}: {e}") from e
        self.export_count += 1
        return 0

    cdef int import_handle(self, int fd, size_t n, uint64_t *handle) except -1:
        try:
            size = os.fstat(fd).st_size
            if size < n:
                raise MetraleError(f"import of descriptor {fd}: it holds {size} bytes, "
                                   f"fewer than the {n} expected")
            own = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0)
        except OSError as e:
            raise MetraleError(f"import of descriptor {fd}: {e}") from e
        self._next_handle += 1
        handle[0] = self._next_handle
        self._memfds[self._next_handle] = own
        self.handle_count += 1
        self.import_count += 1
        return 0

    def __repr__(self):
        return (f"HostBackend(live_alloc_count={self.live_alloc_count}, "
                f"live_bytes={self.live_bytes})")
