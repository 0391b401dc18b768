"""Library workspaces in declared buffers (metrale.torch.install_workspaces,
docs/torch.md): torch's cuBLAS workspace and Triton's scratch allocator made
buffers of an arena, so their memory is inside its slab.  Part of
metrale.torch (which imports torch)."""

import contextvars

import torch

from .._arena import _lend
from .._base.errors import MetraleError

__all__ = ["Workspaces", "install_workspaces"]


def _device_of(arena, what="pool", needs="torch's memory pool"):
    """The torch device of a CUDA arena; MetraleError naming `what` otherwise."""
    gpu = arena.backend()
    if gpu.device_type != 2:
        raise MetraleError(f"metrale.torch.{what}: the arena's backend is {type(gpu).__name__}; "
                           f"{needs} needs a CudaBackend arena")
    return torch.device("cuda", gpu.device_id)


def rearm_cublas():
    """After torch's cuBLAS workspaces were dropped: the installed one (if
    any) made again in its buffer."""
    installed = _INSTALLED["cublas"]
    if installed is not None and installed._cublas.mp is not None:   # a failed remove: not
        installed._cublas.arm()


# ---------------------------------------------------------------------------
# Library workspaces in declared buffers (install_workspaces).
# cuBLAS: torch takes no workspace pointer.  It keeps one workspace per
# (handle, stream), allocated through the current CUDA caching allocator at
# the pair's first handle fetch, and calls cublasSetWorkspace with it on
# every fetch, overwriting any pointer set from outside (aten/src/ATen/cuda/
# CublasHandlePool.cpp: getCurrentCUDABlasHandle -> setWorkspaceForHandle).
# The caching allocator honours the thread's active MemPool: the workspace is
# made in one whose allocator (C functions of metrale's own: the lent buffer of
# src/pool_slots.c) hands out the buffer, once, as its only segment.
# Triton: at the launch of a kernel needing global scratch the launcher calls
# allocator(grid * num_ctas * global_scratch_size, global_scratch_align,
# stream) and passes its data_ptr() (third_party/nvidia/backend/driver.py);
# from Triton 3.4 the allocator is a ContextVar (runtime/_allocation.py).
# ---------------------------------------------------------------------------

# The active install of each library in this process, holding its pins
# until Workspaces.remove however the caller keeps the handle.
_INSTALLED = {"cublas": None, "triton": None}

_ALIGN = 256        # cuBLAS's workspace alignment (cublasSetWorkspace)


def _bytes_view(arena, arg, name):
    """A view of all of buffer `name` as bytes (its pin), or the arena's own
    error for a bad name; ValueError naming `arg` for an empty buffer."""
    view = arena.view(name, "uint8")
    if view.nbytes == 0:
        del view        # no pin left behind by the raise
        raise ValueError(f"{arg}: buffer {name!r} is empty at the arena's limits")
    return view


class _CublasWorkspace:
    """torch's cuBLAS workspace of one (handle, stream) made in a buffer."""

    def __init__(self, view, arg, device, stream):
        self.view, self.name, self.device, self.stream = view, view.name, device, stream
        self.ptr, self.nbytes = view.ptr, view.nbytes
        del view                # a refusal's traceback must not pin the buffer
        # The MemPool's allocator is C (src/pool_slots.c: the lent buffer):
        # torch calls it under its allocator's mutex from any thread, where
        # Python would need the GIL (a deadlock with a thread holding it).
        _lend.lend(self.ptr, self.nbytes)
        self.mp = torch.cuda.MemPool(torch._C._cuda_customAllocator(*_lend.lender()))
        try:
            self.arm(arg)
        except BaseException:
            self.mp = None
            torch.cuda.empty_cache()        # the pool's segment, if torch took it
            if not _lend.lent()[0]:
                _lend.lend(0, 0)
                self.view = None
            raise

    def arm(self, arg="cublas"):
        """Drop torch's workspaces and make this one's again in the buffer."""
        torch.cuda.synchronize(self.device)     # GEMMs in flight use the old ones
        torch._C._cuda_clearCublasWorkspaces()  # remade at their next use
        try:
            with torch.cuda.device(self.device), torch.cuda.stream(self.stream), \
                    torch.cuda.use_mem_pool(self.mp, device=self.device):
                torch.cuda.current_blas_handle()    # makes the (handle, stream) workspace
        except torch.OutOfMemoryError as e:
            raise ValueError(
                f"{arg}: buffer {self.name!r} has {self.nbytes:,} bytes; torch's caching "
                f"allocator asked a segment of {_lend.lent()[1]:,} for its cuBLAS workspace: "
                "declare the buffer at least that large (or make the workspace smaller: "
                "CUBLAS_WORKSPACE_CONFIG, torch.backends.cuda.cublas_workspace_size)") from e
        if not self.in_buffer():
            raise MetraleError(
                f"{arg}: torch made no cached cuBLAS workspace when its handle was fetched, "
                "so there is none to install: this torch caches none (builds that allocate "
                "one per GEMM unless TORCH_CUBLAS_WORKSPACE_CACHE=1 is set before the first "
                "cuBLAS call); such GEMMs take theirs from the current pool (use_pool)")

    def in_buffer(self):
        # The pool's one segment is the buffer; a block allocated in it is the
        # workspace (torch frees it when it drops its workspaces).
        for seg in torch.cuda.memory_snapshot(self.mp.id):
            if seg.get("address") == self.ptr:
                return seg.get("allocated_size", 0) > 0
        return False

    def release(self):
        """Give the buffer back: torch's workspaces dropped, the pool's segment
        freed; MetraleError (the buffer stays pinned) if torch still holds it."""
        torch.cuda.synchronize(self.device)
        torch._C._cuda_clearCublasWorkspaces()
        self.mp = None          # the pool's segment is freed when the cache is emptied
        torch.cuda.empty_cache()
        if _lend.lent()[0]:
            raise MetraleError(
                f"Workspaces.remove: torch still holds buffer {self.name!r} as a segment of "
                "the workspace's pool; the buffer stays pinned")
        _lend.lend(0, 0)
        self.view = None


class _TritonScratch:
    """Triton's allocator over one buffer: ``fn(size, alignment, stream)``
    returns this object (its ``data_ptr()`` the buffer's pointer) for a
    request that fits the buffer at the asked alignment, and refuses any
    other, or any once removed."""

    __slots__ = ("_view", "name", "ptr", "nbytes", "calls", "peak")

    def __init__(self, view):
        self._view, self.name, self.ptr, self.nbytes = view, view.name, view.ptr, view.nbytes
        self.calls = self.peak = 0

    def __call__(self, size, alignment, stream):
        if self._view is None:
            raise MetraleError(f"metrale: Triton's scratch buffer {self.name!r} was removed "
                               "(Workspaces.remove) but this allocator is still set here")
        size = int(size)
        if size > self.nbytes:
            raise MetraleError(
                f"metrale: a Triton kernel asked {size:,} bytes of scratch; buffer "
                f"{self.name!r} has {self.nbytes:,}: declare it larger (the kernel asks "
                "grid size x CTAs x its global scratch)")
        if alignment and self.ptr % int(alignment):
            raise MetraleError(f"metrale: a Triton kernel asked scratch aligned to {alignment}; "
                               f"buffer {self.name!r} starts at {self.ptr:#x}")
        self.calls += 1
        self.peak = max(self.peak, size)
        return self

    def data_ptr(self):
        return self.ptr


def _triton_module():
    try:
        import triton
    except ImportError as e:
        raise ImportError("metrale.torch.install_workspaces: triton= needs Triton, which is "
                          "not importable here (pip install triton)") from e
    if not hasattr(triton, "set_allocator"):
        raise MetraleError(f"triton: Triton {getattr(triton, '__version__', '?')} has no "
                           "set_allocator (its kernels ask no scratch of an allocator)")
    return triton


def _triton_current():
    """Triton's allocator in the calling context, or None where it cannot be read."""
    try:
        from triton.runtime import _allocation
    except ImportError:
        return None
    var = getattr(_allocation, "_allocator", None)
    return var.get() if isinstance(var, contextvars.ContextVar) else var   # < 3.4: a global


class Workspaces:
    """Library workspaces that `install_workspaces` made declared buffers.

    Each buffer stays pinned (a view: ``arena.pins()`` names it, `release`
    refuses, and a `sleep` that discards it refuses) until `remove`.  A
    context manager: leaving it removes them.

    Parameters
    ----------
    arena : BufferArena
        The arena whose buffers they are (`install_workspaces` makes these).
    """

    def __init__(self, arena):
        self._arena, self._cublas, self._triton = arena, None, None
        self._previous = None       # Triton's allocator before ours

    @property
    def arena(self):
        """The arena whose buffers these are."""
        return self._arena

    @property
    def cublas(self):
        """The buffer that is torch's cuBLAS workspace (str), or None."""
        return None if self._cublas is None else self._cublas.name

    @property
    def triton(self):
        """The buffer that is Triton's scratch (str), or None."""
        return None if self._triton is None else self._triton.name

    def cublas_active(self):
        """Whether torch's cuBLAS workspace (of the installing thread's
        handle on the installed stream) still lies in the buffer.

        False once torch dropped it: ``torch._C._cuda_clearCublasWorkspaces``
        (torch.compile's CUDA-graph trees call it) or a larger workspace size
        set since; `remove` and install again to put it back.
        """
        return self._cublas is not None and self._cublas.in_buffer()

    def triton_active(self):
        """Whether this is Triton's allocator in the calling thread's context
        (torch.compile's Triton kernels set their own at their first launches,
        torch/_inductor/runtime/triton_heuristics.py)."""
        return self._triton is not None and _triton_current() is self._triton

    def triton_peak(self):
        """The largest scratch (bytes) Triton kernels asked of the buffer."""
        return 0 if self._triton is None else self._triton.peak

    def remove(self):
        """Take the workspaces back and unpin their buffers.

        cuBLAS: torch's workspaces are dropped (remade at their next use, in
        its own memory) and the buffer given back.  Triton: its previous
        allocator is set again where this one is still set in the calling
        context; elsewhere this one refuses every request from now on.
        CUDA graphs captured meanwhile still use the buffers as they were.
        Removing twice does nothing.

        Raises
        ------
        MetraleError
            Torch still holds the cuBLAS buffer (it stays pinned).
        """
        held = None
        if self._cublas is not None:
            try:
                self._cublas.release()
                self._cublas = _INSTALLED["cublas"] = None
            except MetraleError as e:   # the Triton half goes all the same
                held = e
        if self._triton is not None:
            import triton
            if _triton_current() is self._triton:
                triton.set_allocator(self._previous)
            self._triton._view = None
            self._triton = self._previous = _INSTALLED["triton"] = None
        if held is not None:
            raise held

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.remove()


def install_workspaces(arena, cublas=None, triton=None, *, stream=None):
    """Make declared buffers torch's cuBLAS workspace and Triton's scratch.

    Their memory is then inside the arena's slab: at stable addresses,
    counted in its plan, and what a CUDA graph captured meanwhile uses
    (frozen at capture).  Each buffer stays pinned until
    ``Workspaces.remove``.  One install of each library at a time in a
    process.

    cuBLAS: torch has no way to take a workspace pointer; it allocates one
    per (cuBLAS handle, stream) through its caching allocator at the
    handle's first use there and sets it on every use.  So torch's cached
    workspaces are dropped (remade at their next use, as torch.compile's
    CUDA-graph trees do) and the calling thread's handle is fetched on
    `stream` inside a MemPool whose one segment is the buffer: torch's own
    workspace is made there.  It covers that thread and stream only: torch
    gives each thread its handle and each stream its workspace, and
    ``torch.cuda.graph`` captures on a stream of its own, so capture with
    ``torch.cuda.graph(g, stream=s)`` after installing with ``stream=s``.
    cuBLASLt GEMMs use it where torch unifies the two workspaces
    (``TORCH_CUBLASLT_UNIFIED_WORKSPACE``); otherwise cuBLASLt's own is made
    at its first use.  `close_pool` makes it again after dropping torch's.

    Triton: ``triton.set_allocator`` gets a function that returns the
    buffer for a request that fits it (at the alignment asked) and raises
    MetraleError for any other: one buffer serves every launch, so kernels
    needing scratch must not run at once on two streams.  Since Triton 3.4
    the allocator is per thread (a ContextVar): it is set for the calling
    thread.

    Parameters
    ----------
    arena : BufferArena
        A reserved arena on a CudaBackend.
    cublas : str, optional
        The buffer for the cuBLAS workspace: at least torch's workspace
        size (``torch.backends.cuda.cublas_workspace_size()``, 32 MiB on
        Hopper and later by default), rounded as torch's caching allocator
        rounds a segment (up to 2 MiB; 20 MiB for workspaces between 1 and
        10 MiB), and 256-byte aligned.
    triton : str, optional
        The buffer for Triton's scratch; `Workspaces.triton_peak` tells the
        size kernels asked.
    stream : torch.cuda.Stream, optional
        The stream whose cuBLAS workspace becomes the buffer; None: the
        current stream of the arena's device.

    Returns
    -------
    Workspaces
        Also a context manager (leaving it removes them).

    Raises
    ------
    TypeError, ValueError
        As ``arena.view`` raises them for a bad name; no buffer given, one
        buffer for both, an empty buffer, a buffer smaller than the
        workspace torch asks or misaligned, a stream of another device
        (the message names the argument).
    ImportError
        `triton` given and Triton not importable.
    MetraleError
        The arena is not on CUDA, released or asleep; that library is
        installed already; this torch keeps no cuBLAS workspace to install;
        this Triton has no ``set_allocator``.
    """
    if cublas is None and triton is None:
        raise ValueError("install_workspaces: give a buffer for cublas, triton or both")
    cub = tri = ws = None
    try:
        cub = None if cublas is None else _bytes_view(arena, "cublas", cublas)
        tri = None if triton is None else _bytes_view(arena, "triton", triton)
        if cub is not None and tri is not None and cublas == triton:
            raise ValueError(f"triton: buffer {triton!r} is the cuBLAS workspace already: "
                             "give each library a buffer of its own")
        device = _device_of(arena, "install_workspaces", "a library workspace")
        for lib, view in (("cublas", cub), ("triton", tri)):
            held = _INSTALLED[lib]
            if view is not None and held is not None:
                raise MetraleError(f"{lib}: installed already (buffer {getattr(held, lib)!r}); "
                                   "remove those Workspaces first")
        mod = None if tri is None else _triton_module()
        if cub is not None:
            if cub.ptr % _ALIGN:
                raise ValueError(f"cublas: buffer {cublas!r} starts at {cub.ptr:#x}, not "
                                 f"{_ALIGN}-byte aligned as cuBLAS needs")
            if stream is None:
                stream = torch.cuda.current_stream(device)
            elif not isinstance(stream, torch.cuda.Stream) or stream.device != device:
                raise ValueError(f"stream: a torch.cuda.Stream of {device}, not {stream!r}")
            size = getattr(torch._C, "_cuda_getCublasWorkspaceSize", None)   # newer torch only
            need = None if size is None else size()
            if need is not None and need > cub.nbytes:
                raise ValueError(f"cublas: buffer {cublas!r} has {cub.nbytes:,} bytes; torch's "
                                 f"cuBLAS workspace takes {need:,}")
        ws = Workspaces(arena)
        if cub is not None:
            ws._cublas = _CublasWorkspace(cub, "cublas", device, stream)
            _INSTALLED["cublas"] = ws
        if tri is not None:
            ws._previous = _triton_current()
            ws._triton = _TritonScratch(tri)
            mod.set_allocator(ws._triton)
            _INSTALLED["triton"] = ws
        return ws
    except BaseException:
        cub = tri = None        # no pin outlives a refusal (the traceback keeps this frame)
        if ws is not None:
            ws.remove()
        raise
