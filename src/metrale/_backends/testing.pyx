# cython: language_level=3, binding=False
"""Backends for testing failure paths.

``FaultyBackend`` is a ``HostBackend`` whose operations fail on demand: the
shipped backends never ask "should I fail?", the failure behaviour lives in
this adaptor only (the way RMM keeps it in resource adaptors).
"""

cimport cython
from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memset

from metrale._backends._host_backend cimport HostBackend
from metrale._base._common cimport index_arg

from metrale._base.errors import MetraleError, OutOfMemoryError

__all__ = ["FaultyBackend"]

OPERATIONS = ("alloc", "free", "memset", "d2h", "h2d", "sync", "reserve", "unreserve",
              "create", "release_handle", "map", "set_access", "unmap", "host_alloc",
              "export", "import", "copy")


# The exceptions a failing operation raises, as the real backends do.
_REFUSALS = frozenset(["alloc", "reserve", "create", "map", "set_access", "host_alloc"])


@cython.final
cdef class Faults:
    """Faults()
--

The failures and calls armed for a backend's next operations, by kind.

    The state of `FaultyBackend` and of the CUDA one (``metrale._backends._faulty_cuda``):
    each kind of `OPERATIONS` holds one armed failure (the nth next operation
    fails, once) and one armed call (made at the start of the nth next one).
    """

    def __cinit__(self):
        self._faults = {}
        self._calls = {}

    cdef int arm(self, object op, object nth) except -1:
        self._faults[_kind(op)] = index_arg(nth, "nth", 1)
        return 0

    cdef int arm_call(self, object op, object fn, object nth) except -1:
        op = _kind(op)
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self._calls[op] = [index_arg(nth, "nth", 1), fn]
        return 0

    cdef int clear(self) except -1:
        self._faults.clear()
        self._calls.clear()
        return 0

    cdef bint fails(self, str op) except -1:
        armed = self._calls.get(op)
        if armed is not None:
            if armed[0] > 1:
                armed[0] -= 1
            else:
                del self._calls[op]
                armed[1]()
        left = self._faults.get(op)
        if left is None:
            return False
        if left > 1:
            self._faults[op] = left - 1
            return False
        del self._faults[op]
        return True

    cdef int check(self, str op, str what) except -1:
        if self.fails(op):
            if op in _REFUSALS:
                raise OutOfMemoryError(f"{what} refused (injected fault)")
            raise MetraleError(f"INJECTED_FAULT: {what} failed")
        return 0

    def __repr__(self):
        return f"armed={dict(self._faults)}, calls={sorted(self._calls)}"


cdef bint _bool_arg(object v, str name) except -1:
    if type(v) is not bool:
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    return v


cdef str _kind(object op):
    if not isinstance(op, str):
        raise TypeError(f"op must be a str, got {type(op).__name__}")
    if op not in OPERATIONS:
        raise ValueError(f"op must be one of {', '.join(OPERATIONS)}, got {op!r}")
    return op


@cython.no_gc_clear         # as every backend (see _backend.pyx)
cdef class FaultyBackend(HostBackend):
    """FaultyBackend(*, maps_over=True, fresh=None)
--

A HostBackend whose nth next operation of a kind fails, on demand.

    For testing an engine's error paths without a GPU: start-up out of
    memory, a failing step, a failing teardown.  With ``maps_over=False``
    it maps memory only where none is mapped, as CUDA does, so that an
    offload takes the path a GPU takes (device memory unmapped before host
    memory is mapped at the same addresses).  `inject_fault` arms one
    failure per kind of operation; the failing operation raises as the real
    backends do (``OutOfMemoryError`` for an allocation, ``MetraleError``
    whose message starts with ``HOST_INJECTED_FAULT`` for the others) and
    does nothing else: no memory is touched and no counter moves.  Otherwise
    it behaves exactly as `HostBackend`.

    Parameters
    ----------
    maps_over : bool, optional
        Whether it maps memory over memory in one step (True, the host
        backend's way) or only where none is mapped (False, CUDA's).
    fresh : int, optional
        A byte (0 .. 255) that every new mapping of device memory holds, as
        fresh device memory holds whatever it held (the host's new pages
        are zeros): what a wake must not leave where a contract promises
        zeros or a fill.  None (the default): the host's zeros.

    Examples
    --------
    >>> gpu = FaultyBackend()            # or FaultyBackend(maps_over=False): CUDA's order
    >>> gpu.inject_fault("alloc")        # the next allocation fails
    >>> gpu.inject_fault("memset", 3)    # the 3rd memset from now fails
    >>> gpu.clear_faults()
    """
    cdef Faults _armed
    cdef bint _over
    cdef int _fresh
    cdef set _new                   # handles of device memory not mapped yet (fresh)

    def __cinit__(self, *, maps_over=True, fresh=None):
        self._armed = Faults()
        self._over = _bool_arg(maps_over, "maps_over")
        self._fresh = -1 if fresh is None else index_arg(fresh, "fresh", 0, 255)
        self._new = set()

    def inject_fault(self, op, nth=1):
        """Arm a failure of the `nth` next operation of kind `op`.

        The failure fires once; later operations succeed.  Each kind holds
        one armed failure, so arming it again replaces the count.

        Parameters
        ----------
        op : str
            ``"alloc"`` (arena construction), ``"free"`` (``release()`` and
            the cleanup of a failed construction), ``"memset"`` (construction,
            the zeroing helpers, ``clear_ranges``), ``"d2h"`` (the copies of
            ``debug_buffer_checksum``, the count read of
            ``zero_all_rows(tokens_at=...)``), ``"h2d"`` (``wake``'s copies
            of kept buffers, ``StepInputs.upload``) or
            ``"sync"`` (construction, ``debug_buffer_checksum``); and the
            steps of a reserved arena (construction, ``resize``, ``sleep``,
            ``wake``, ``release``): ``"reserve"`` and ``"create"`` (raise
            ``OutOfMemoryError``), ``"map"`` (``OutOfMemoryError``),
            ``"set_access"`` (CUDA's access grant after a mapping, which it
            then undoes: the range is left as it was, then
            ``OutOfMemoryError``), ``"unmap"``, ``"release_handle"``,
            ``"unreserve"`` and ``"host_alloc"`` (the host copies of
            ``sleep(keep=...)``; ``OutOfMemoryError``); and the peer
            sharing of a tensor-parallel arena: ``"export"`` and
            ``"import"`` (``MetraleError``; ``"create"`` fails its
            shareable handles too); ``"copy"``, the copies out of
            ``sleep(keep=..., offload=...)`` and the offloaded ones back at
            ``wake`` (``"create"``, ``"map"`` and ``"unmap"`` fail the
            offload's host memory handles and mappings too, and ``"map"``
            the mappings over memory of a backend that maps over).
        nth : int, optional
            Which of the next operations of that kind fails: 1 (the default)
            for the very next one.

        Raises
        ------
        TypeError
            `op` is not a str or `nth` is not an int.
        ValueError
            `op` is not one of the kinds above, or `nth` is below 1 or does
            not fit 64 bits.
        """
        self._armed.arm(op, nth)

    def inject_call(self, op, fn, nth=1):
        """Call `fn()` at the start of the `nth` next operation of kind `op`.

        For testing what happens while an operation runs: `fn` runs inside
        it (the arena is held, as for a real device call), on the calling
        thread; it may block, start threads or call back into metrale.  An
        exception from `fn` becomes the operation's.  Fires once; each kind
        holds one armed call.

        Parameters
        ----------
        op : str
            One of the kinds `inject_fault` takes.
        fn : callable
            Called with no arguments.
        nth : int, optional
            Which of the next operations of that kind calls it (1, the
            default, for the very next one).

        Raises
        ------
        TypeError
            `op` is not a str, `fn` is not callable or `nth` is not an int.
        ValueError
            `op` is not a known kind, or `nth` is below 1.
        """
        self._armed.arm_call(op, fn, nth)

    def clear_faults(self):
        """Disarm every armed failure and call."""
        self._armed.clear()

    cdef bint _fails(self, str op) except -1:
        return self._armed.fails(op)

    cdef int alloc(self, size_t n, uintptr_t *out) except -1:
        if self._fails("alloc"):
            raise OutOfMemoryError(f"host allocation of {n} bytes refused (injected fault)")
        return HostBackend.alloc(self, n, out)

    cdef int free(self, uintptr_t p, size_t n) except -1:
        if self._fails("free"):
            raise MetraleError(f"HOST_INJECTED_FAULT: free of {n} bytes at {p:#x} failed")
        return HostBackend.free(self, p, n)

    cdef int memset(self, uintptr_t p, size_t n, uintptr_t stream) except -1:
        if self._fails("memset"):
            raise MetraleError("HOST_INJECTED_FAULT: memset failed")
        return HostBackend.memset(self, p, n, stream)

    cdef int d2h(self, void *dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        if self._fails("d2h"):
            raise MetraleError("HOST_INJECTED_FAULT: copy failed")
        return HostBackend.d2h(self, dst, src, n, stream)

    cdef int h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        if self._fails("h2d"):
            raise MetraleError("HOST_INJECTED_FAULT: copy failed")
        return HostBackend.h2d(self, dst, src, n, stream)

    cdef int copy_h2d(self, uintptr_t dst, const void *src, size_t n, uintptr_t stream) except -1:
        if self._fails("h2d"):
            raise MetraleError("HOST_INJECTED_FAULT: copy failed")
        return HostBackend.copy_h2d(self, dst, src, n, stream)

    cdef int sync(self, uintptr_t stream) except -1:
        if self._fails("sync"):
            raise MetraleError("HOST_INJECTED_FAULT: synchronize failed")
        return HostBackend.sync(self, stream)

    cdef int reserve(self, size_t n, uintptr_t *out) except -1:
        if self._fails("reserve"):
            raise OutOfMemoryError(f"host reservation of {n} bytes refused (injected fault)")
        return HostBackend.reserve(self, n, out)

    cdef int unreserve(self, uintptr_t p, size_t n) except -1:
        if self._fails("unreserve"):
            raise MetraleError("HOST_INJECTED_FAULT: unreserve failed")
        return HostBackend.unreserve(self, p, n)

    cdef int create(self, size_t n, uint64_t *handle) except -1:
        if self._fails("create"):
            raise OutOfMemoryError(f"physical handle of {n} bytes refused (injected fault)")
        HostBackend.create(self, n, handle)
        if self._fresh >= 0:
            self._new.add(handle[0])
        return 0

    cdef int release_handle(self, uint64_t handle, size_t n) except -1:
        if self._fails("release_handle"):
            raise MetraleError("HOST_INJECTED_FAULT: release of a physical handle failed")
        return HostBackend.release_handle(self, handle, n)

    cdef int map(self, uintptr_t p, size_t n, uint64_t handle) except -1:
        if self._fails("map"):
            raise OutOfMemoryError(f"mapping {n} bytes at {p:#x} refused (injected fault)")
        # CUDA maps, then sets access and unmaps when that fails: the range as
        # it was, as here, where a mapping over memory could not be undone
        if self._fails("set_access"):
            raise OutOfMemoryError(f"access to {n} bytes at {p:#x} refused (injected fault)")
        HostBackend.map(self, p, n, handle)
        if handle in self._new:     # device memory, mapped the first time (not host memory)
            self._new.discard(handle)
            memset(<void *>p, self._fresh, n)
        return 0

    cdef int unmap(self, uintptr_t p, size_t n) except -1:
        if self._fails("unmap"):
            raise MetraleError("HOST_INJECTED_FAULT: unmap failed")
        return HostBackend.unmap(self, p, n)

    cdef int unmap_host(self, uintptr_t p, size_t n) except -1:
        if self._fails("unmap"):
            raise MetraleError("HOST_INJECTED_FAULT: unmap failed")
        return HostBackend.unmap_host(self, p, n)

    cdef bint maps_over(self):
        return self._over

    cdef int map_filled(self, uintptr_t p, size_t n, uint64_t handle, uintptr_t src) except -1:
        if self._fails("map"):
            raise OutOfMemoryError(f"mapping {n} bytes at {p:#x} refused (injected fault)")
        return HostBackend.map_filled(self, p, n, handle, src)

    cdef int refill(self, uintptr_t p, size_t n, uintptr_t src) except -1:
        if self._fails("map"):
            raise OutOfMemoryError(f"mapping {n} bytes at {p:#x} refused (injected fault)")
        return HostBackend.refill(self, p, n, src)

    cdef int copy(self, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) except -1:
        if self._fails("copy"):
            raise MetraleError("HOST_INJECTED_FAULT: copy failed")
        return HostBackend.copy(self, dst, src, n, stream)

    cdef int host_alloc(self, size_t n, void **out) except -1:
        if self._fails("host_alloc"):
            raise OutOfMemoryError(f"host copy buffer of {n} bytes refused (injected fault)")
        return HostBackend.host_alloc(self, n, out)

    cdef int create_exportable(self, size_t n, uint64_t *handle) except -1:
        if self._fails("create"):
            raise OutOfMemoryError(f"shareable handle of {n} bytes refused (injected fault)")
        return HostBackend.create_exportable(self, n, handle)

    cdef int export_handle(self, uint64_t handle, size_t n, int *fd) except -1:
        if self._fails("export"):
            raise MetraleError("HOST_INJECTED_FAULT: export of a physical handle failed")
        return HostBackend.export_handle(self, handle, n, fd)

    cdef int import_handle(self, int fd, size_t n, uint64_t *handle) except -1:
        if self._fails("import"):
            raise MetraleError("HOST_INJECTED_FAULT: import of a peer's handle failed")
        return HostBackend.import_handle(self, fd, n, handle)

    def __repr__(self):
        return (f"FaultyBackend(live_alloc_count={self.live_alloc_count}, "
                f"live_bytes={self.live_bytes}, {self._armed!r})")
