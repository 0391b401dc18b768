# cython: language_level=3, binding=False
"""CudaDevice: an NVIDIA GPU as CudaBackend holds it (CudaBackend, _cuda.pyx,
is one).

The device's primary context (the one torch and CuPy use), retained at
construction and made current on whichever thread calls; what the backend
loads and makes once with it (the zeroing kernel, a side stream; the debug
and peer kernels on first use) and gives back when collected; the device's
facts (SM count, compute capability, free memory, the target it sizes for);
the launch shape of the device-count zeroing.  The backend's operations
over it are _cuda.pyx's.
"""

cimport cython

from cuda.bindings cimport cydriver
from metrale._backends cimport _kernels
from metrale._backends._backend cimport Backend
from metrale._base._common cimport mt_py_finalizing, u64_arg
from metrale._base._driver cimport check
from metrale._base._life cimport mt_fork_generation

from threading import Lock as _Lock

from metrale._backends import _transfer as transfer
from metrale._base.errors import MetraleError


cdef int _forked() except -1 with gil:
    raise MetraleError("CudaBackend: this process was forked after CUDA was initialized "
                       "in its parent; CUDA cannot be used here (use the spawn start "
                       "method, or make the backend in the child)")


@cython.no_gc_clear         # as every backend (see _backend.pyx)
cdef class CudaDevice(Backend):
    """CudaDevice(device=0)
--

The device a CudaBackend drives: its context, its facts, its kernels.

    Made as the base of `CudaBackend`, which is the backend to build.

    Parameters
    ----------
    device : int, optional
        The device ordinal (default 0).

    Attributes
    ----------
    launch_count : int
        Kernel launches made (read-only; besides the counters of `Backend`).
    """
    # its fields: _cuda_device.pxd

    def __cinit__(self, device=0):
        cdef cydriver.CUresult err
        cdef int ordinal = <int>u64_arg(device, "device", 0, 0x7FFFFFFF)
        cdef bytes ordinal_s = str(ordinal).encode()
        cdef const char *ordinal_c = ordinal_s
        self.device_type = 2
        self.device_id = ordinal
        self._fork_gen = mt_fork_generation()
        self._debug_lock = _Lock()
        try:
            with nogil:
                err = cydriver.cuInit(0)
        except Exception as e:      # cydriver raises when libcuda cannot be loaded
            raise MetraleError(f"CUDA driver unavailable: {e}") from e
        with nogil:
            check(err, "cuInit", "is an NVIDIA driver and GPU present?")
            check(cydriver.cuDeviceGet(&self._dev, ordinal), "cuDeviceGet", ordinal_c)
            check(cydriver.cuDevicePrimaryCtxRetain(&self._ctx, self._dev), "cuDevicePrimaryCtxRetain")
        self._retained = True
        with nogil:
            check(cydriver.cuDeviceGetAttribute(&self._sm_count,
                  cydriver.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self._dev), "cuDeviceGetAttribute")
            check(cydriver.cuDeviceGetAttribute(&self._cc_major,
                  cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self._dev), "cuDeviceGetAttribute")
            check(cydriver.cuDeviceGetAttribute(&self._cc_minor,
                  cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self._dev), "cuDeviceGetAttribute")
            self._current()
            check(cydriver.cuCtxGetLimit(&self._stack0, cydriver.CU_LIMIT_STACK_SIZE),
                  "cuCtxGetLimit")
        with nogil:
            check(cydriver.cuStreamCreate(&self._side, cydriver.CU_STREAM_NON_BLOCKING),
                  "cuStreamCreate")
        # Loaded once here, never inside a graph capture.
        _kernels.zero_load(&self._zero, self._side)

    def __dealloc__(self):
        if not self._retained or mt_py_finalizing() or mt_fork_generation() != self._fork_gen:
            return        # at exit the driver may already be gone (the process frees all);
                          # in a forked child every driver object is the parent's
        with nogil:
            if self._side != NULL:
                cydriver.cuCtxSetCurrent(self._ctx)
                cydriver.cuStreamDestroy(self._side)
            _kernels.unload(&self._zero, &self._debug, &self._peer, &self._copy)
            cydriver.cuDevicePrimaryCtxRelease(self._dev)

    cdef int _current(self) except -1 nogil:
        """Make the backend's context current on the calling thread: the step
        before every checked driver call, without the GIL."""
        cdef cydriver.CUcontext cur = NULL
        if mt_fork_generation() != self._fork_gen:
            return _forked()
        cydriver.cuCtxGetCurrent(&cur)
        if cur != self._ctx:
            return check(cydriver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        return 0

    cdef bint _capturing(self, cydriver.CUstream s) except -1 nogil:
        """Whether stream `s` is being captured into a graph (context current)."""
        cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
        check(cydriver.cuStreamIsCapturing(s, &status), "cuStreamIsCapturing")
        return status == cydriver.CU_STREAM_CAPTURE_STATUS_ACTIVE

    def mem_info(self):
        """Free and total memory of the device, as the driver reports them.

        Returns
        -------
        tuple of (int, int)
            ``(free, total)`` bytes (``cuMemGetInfo``).

        Raises
        ------
        MetraleError
            The driver call failed.
        """
        cdef size_t free_b = 0, total_b = 0
        with nogil:
            self._current()
            check(cydriver.cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo")
        return (free_b, total_b)

    def trim_stack(self, nbytes=None):
        """Set the threads' stack back down, giving back the device memory that
        kernels with deeper stacks made the driver take.

        The driver grows every thread's stack (``CU_LIMIT_STACK_SIZE``) when
        it launches a kernel that needs more, and keeps it grown: the device
        memory behind it, the stack times every thread the device holds at
        once, belongs to the context, and no allocator sees it.  A deep sleep
        trims it (docs/rl.md); the next kernel that needs more grows it
        again.  Waits for the device's work first (the driver does), so call
        it outside any stream capture, as a sleep is: a call that waits for
        the device may invalidate a capture in progress on another thread.

        Parameters
        ----------
        nbytes : int, optional
            The stack per thread, in bytes (None: its size when this backend
            was made).

        Returns
        -------
        tuple of (int, int)
            The stack per thread before and after, in bytes (the driver may
            round what it is asked).

        Raises
        ------
        TypeError, ValueError
            `nbytes` is not a non-negative int.
        MetraleError
            The driver refused the limit.
        """
        cdef size_t want = self._stack0 if nbytes is None else \
            <size_t>u64_arg(nbytes, "nbytes", 0, 1 << 40)
        cdef size_t before = 0, after = 0
        with nogil:
            self._current()
            check(cydriver.cuCtxGetLimit(&before, cydriver.CU_LIMIT_STACK_SIZE), "cuCtxGetLimit")
            if before != want:
                check(cydriver.cuCtxSetLimit(cydriver.CU_LIMIT_STACK_SIZE, want), "cuCtxSetLimit")
            check(cydriver.cuCtxGetLimit(&after, cydriver.CU_LIMIT_STACK_SIZE), "cuCtxGetLimit")
        return (before, after)

    def tune_rows_at(self, *, blocks_per_sm=None, tile_chunks=None, spread=None, queue=None):
        """Set the launch shape of ``zero_all_rows(tokens_at=...)``.

        That zeroing reads the token count when it runs, so its grid is fixed
        when it is enqueued (or captured): the bytes every count clears get
        blocks of their own, laid out as ``zero_all_rows(tokens=...)`` lays
        out its launch, and `blocks_per_sm` blocks per SM clear what the
        count adds, in tiles of at least `tile_chunks` 16-byte chunks sized
        so that a block takes about `spread` of them (64 KiB at most).  With
        `queue`, a block takes its next tile from a counter in device memory
        (the arena's own), so blocks that finish early take more; without,
        each block takes a fixed share.  The defaults, 1, 512, 8 and True,
        measured best on the H200 (``bench/bench_step.py``); this is for such
        measurements.  It applies to later launches (an already captured
        graph keeps its shape).  Arguments left None keep their value;
        nothing changes when one is refused.

        Parameters
        ----------
        blocks_per_sm : int, optional
            Blocks (of 512 threads) per streaming multiprocessor, 1 to 32.
        tile_chunks : int, optional
            The smallest tile in 16-byte chunks: a power of two, 1 to 4096
            (64 KiB, the largest tile the kernel makes).
        spread : int, optional
            Tiles a block aims at, 1 to 2**32 - 1.
        queue : bool, optional
            Whether blocks take their tiles from a counter.

        Raises
        ------
        TypeError
            An argument is not an int (`queue`: not a bool).
        ValueError
            An argument is out of its range, or `tile_chunks` is not a power
            of two; the message names it.
        """
        _kernels.tune_rows_at(&self._zero, blocks_per_sm, tile_chunks, spread, queue)

    def rows_at_tuning(self):
        """The launch shape of ``zero_all_rows(tokens_at=...)`` (`tune_rows_at`).

        Returns
        -------
        dict
            ``{"blocks_per_sm": int, "tile_chunks": int, "spread": int,
            "queue": bool}``, which ``tune_rows_at(**...)`` accepts back.
        """
        return _kernels.rows_at_tuning(&self._zero)

    def rows_at_counters(self):
        """The work counters of ``zero_all_rows(tokens_at=...)``: how many are lent.

        An arena borrows one at its first such call and gives it back when
        it is released or collected; an arena that finds none left zeroes
        in fixed shares (`tune_rows_at`'s ``queue=False``: the same bytes,
        slower at large counts).

        Returns
        -------
        tuple of (int, int)
            ``(lent, total)``; the backend has 4096.
        """
        return _kernels.queues_lent(&self._zero)

    # -- Python-level helpers ------------------------------------------------------------
    def target(self):
        """The target of this device, which ``BufferArena.new`` sizes for.

        Returns
        -------
        Target
            ``Target(sm_count, "auto")`` on compute capability 9.x (Hopper),
            ``Target(sm_count, "legacy")`` on every other device.
        """
        from metrale._sizing.target import Target
        return Target(self._sm_count, "auto" if self._cc_major == 9 else "legacy")

    def sm_count(self):
        """The device's streaming multiprocessor count.

        Returns
        -------
        int
            The multiprocessor count the driver reports.
        """
        return self._sm_count

    def compute_capability(self):
        """The device's compute capability.

        Returns
        -------
        tuple of (int, int)
            ``(major, minor)``, for example ``(9, 0)`` on an H100 or H200.
        """
        return (self._cc_major, self._cc_minor)

    @property
    def device(self):
        """The device ordinal (int) this backend was built for."""
        return self.device_id

    # the copies of tests and tools, written once over the backend interface
    upload = transfer.upload
    download = transfer.download
    synchronize = transfer.synchronize

    def __repr__(self):
        return (f"CudaBackend(device={self.device_id}, sm_count={self._sm_count}, "
                f"cc={self._cc_major}.{self._cc_minor}, live_bytes={self.live_bytes})")
