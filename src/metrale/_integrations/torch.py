"""metrale.torch: an arena's buffers as torch tensors, and torch's memory in
the arena's pool (docs/torch.md).

Optional (``pip install 'metrale[torch]'``): importing it imports torch;
``import metrale`` never does.

- `tensor` / `tensors`: a buffer as a tensor of its spec's dtype and shape,
  no copy (the data pointer is the buffer's), pinned as a view is.
- `pool` / `use_pool`: a ``torch.cuda.MemPool`` whose allocator is the
  arena's pool (``BufferArena.open_pool``): torch's segments are handed
  out of a range the arena reserves beside its buffers, mapped on demand,
  at addresses that never move; they sleep and wake with the arena, and
  CUDA graphs captured into the pool (``torch.cuda.graph(g,
  pool=metrale.torch.pool(arena).id)``) replay after a wake.  The pool's
  two C functions are metrale's own (src/pool.c), no library to load.
- `close_pool`: give torch's pool back, then the arena's.
- `graph`: a ``torch.cuda.CUDAGraph`` whose ``replay()`` first checks a
  guard over the classes it uses (``BufferArena.guard``): a replay over a
  class still asleep raises MetraleError instead of faulting the device.
- `bind`: a module's parameters made tensors of a weight arena
  (metrale.weights), without a copy: the module runs on the arena's memory.
- `install_workspaces`: declared buffers as torch's cuBLAS workspace and
  Triton's scratch allocator, so their memory is inside the slab (and so
  what a CUDA graph captures); `Workspaces.remove` takes them back.
"""

import contextlib
import gc
import weakref

try:
    import torch
except ImportError as e:        # the extra names what to install
    raise ImportError("metrale.torch needs torch: pip install 'metrale[torch]'") from e

from .._arena import _pool
from .._base.errors import MetraleError
from . import weights as _weights
from ._torch_workspaces import Workspaces, install_workspaces, rearm_cublas
from ._torch_workspaces import _device_of

__all__ = ["GuardedGraph", "Workspaces", "bind", "close_pool", "graph", "install_workspaces",
           "pool", "tensor", "tensors", "use_pool"]

# The element types DLPack may not carry into torch (its FP8 codes are
# DLPack 1.1's) -> the unsigned integers of their width they are exported as,
# then reinterpreted (torch names them as metrale does).  Every other type of
# metrale._base._dtypes crosses as it is.
_CARRIED = {"float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}

# arena -> the torch MemPool over its pool (one per arena, made by `pool`).
_MEMPOOLS = weakref.WeakKeyDictionary()


def tensor(arena, name, dtype=None, shape=None):
    """Buffer `name` of `arena` as a torch tensor, without a copy.

    The tensor holds a view of the buffer (``arena.view``): while it is
    alive the arena's `release` refuses, `pins()` names the buffer, and a
    `sleep` that discards the buffer refuses (offload keeps it valid).

    Parameters
    ----------
    arena : BufferArena
    name : str
        A buffer of the arena's set.
    dtype : str, optional
        As ``arena.view`` takes it; None: the buffer's own (its spec's).
    shape : int or tuple of int, optional
        As ``arena.view`` takes it; None with no `dtype`: the buffer's own
        shape at the arena's limits.

    Returns
    -------
    torch.Tensor
        On the arena's device (``cuda:N``, or the CPU for a host backend),
        ``data_ptr()`` the buffer's pointer.

    Raises
    ------
    TypeError, ValueError, MetraleError
        As ``arena.view`` raises them (unknown buffer, no dtype for a
        buffer of raw bytes, a shape larger than the buffer, the arena
        released or asleep).
    """
    view = arena.view(name, dtype, shape)
    carrier = _CARRIED.get(view.dtype)
    if carrier is None:
        return torch.from_dlpack(view)
    own = getattr(torch, view.dtype)
    return torch.from_dlpack(arena.view(name, carrier, view.shape)).view(own)


def tensors(arena, *names):
    """Several buffers as tensors (`tensor` of each, in the order given).

    Parameters
    ----------
    arena : BufferArena
    *names : str
        Buffers of the arena's set.

    Returns
    -------
    tuple of torch.Tensor
    """
    return tuple(tensor(arena, n) for n in names)


def pool(arena, nbytes=None):
    """The ``torch.cuda.MemPool`` whose memory is the arena's pool.

    Made once per arena (the arena's pool opened with `nbytes` if it has
    none yet) and kept until `close_pool`.  Route allocations with
    ``metrale.torch.use_pool(arena)`` (or ``torch.cuda.use_mem_pool``), and
    capture graphs into it with ``torch.cuda.graph(g, pool=pool.id)``.

    Parameters
    ----------
    arena : BufferArena
        A reserved arena on a CudaBackend.
    nbytes : int, optional
        The pool's range when the arena has no pool yet (required then).

    Returns
    -------
    torch.cuda.MemPool

    Raises
    ------
    ValueError
        No `nbytes` for an arena without a pool, or more than its pool has.
    MetraleError
        The arena is not reserved, not on CUDA, asleep or released; or every
        allocator slot is taken.
    """
    _device_of(arena)
    p = arena.pool
    if p is None:
        if nbytes is None:
            raise ValueError("nbytes: the arena has no pool yet: give the pool's size")
        p = arena.open_pool(nbytes)
    elif nbytes is not None and nbytes > p.nbytes:
        raise ValueError(f"nbytes: the arena's pool has {p.nbytes:,} bytes, not {nbytes:,}")
    mp = _MEMPOOLS.get(arena)
    if mp is None:
        alloc_fn, free_fn = p.allocator()
        mp = torch.cuda.MemPool(torch._C._cuda_customAllocator(alloc_fn, free_fn))
        # The slot's functions may be called until torch's pool object is gone.
        weakref.finalize(mp, _pool.unretire, p.slot)
        _MEMPOOLS[arena] = mp
    return mp


@contextlib.contextmanager
def use_pool(arena):
    """A context in which the calling thread's torch allocations on the
    arena's device come from the arena's pool (``torch.cuda.use_mem_pool``).

    Torch does not retry an allocation the pool refused (pytorch#159674):
    the ``torch.OutOfMemoryError`` raised in the context is raised again
    with the pool's figures added.

    Parameters
    ----------
    arena : BufferArena
        A reserved arena on a CudaBackend whose pool `pool` made or makes.

    Yields
    ------
    torch.cuda.MemPool
    """
    mp = pool(arena)
    try:
        with torch.cuda.use_mem_pool(mp, device=_device_of(arena)):
            yield mp
    except torch.OutOfMemoryError as e:
        s = arena.pool.stats()
        raise torch.OutOfMemoryError(
            f"{e}\nmetrale: the arena's pool has {s['in_use']:,} of {s['reserved']:,} bytes in "
            f"{s['segments']} segments, {s['committed']:,} mapped; it refused "
            f"{s['refused']} allocations (open a larger pool: metrale.torch.pool(arena, "
            "nbytes), or metrale.fit)") from e


def close_pool(arena):
    """Give torch's pool back, then close the arena's pool.

    Drops the MemPool `pool` made (torch then returns its cached segments)
    and torch's cuBLAS workspaces (remade at their next use; one made in
    the pool, by a capture, holds a segment of it; one `install_workspaces`
    put in a buffer is made there again), and closes the arena's pool when
    no segment is left.

    Parameters
    ----------
    arena : BufferArena

    Raises
    ------
    MetraleError
        Torch still holds segments: tensors allocated in the pool, or CUDA
        graphs captured into it (or another reference to the MemPool), are
        alive; the message gives their count and bytes.
    """
    p = arena.pool
    if p is None:
        return
    mp = _MEMPOOLS.pop(arena, None)
    del mp
    # Torch frees the segments of a pool whose MemPool is gone when its
    # cache is emptied (and those of a tensor that outlived it at the next
    # emptying): every call empties it.
    torch.cuda.synchronize(_device_of(arena))
    gc.collect()
    # cuBLAS keeps a workspace per (handle, stream), made through the caching
    # allocator: one made inside the pool (a capture's) holds its segment.
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    rearm_cublas()      # an installed workspace was dropped with the rest
    s = p.stats()
    if s["segments"]:
        raise MetraleError(
            f"close_pool: torch still holds {s['segments']} segments ({s['in_use']:,} bytes) "
            "of the arena's pool: tensors allocated in it, CUDA graphs captured into it, or "
            "another reference to its MemPool are alive")
    arena.close_pool()


class GuardedGraph(torch.cuda.CUDAGraph):
    """A ``torch.cuda.CUDAGraph`` whose `replay` checks its guard first (made
    by `graph`): captured, replayed and reset as torch's.

    Attributes
    ----------
    guard : metrale.Guard
        What `replay` checks: the classes the graph's kernels touch.
    replay : metrale.Guarded
        The graph's own replay behind the guard (``guard.wrap``): the check is
        made in C, with no Python frame between it and torch's replay.
    """

    def __new__(cls, guard, keep_graph=False):
        return super().__new__(cls, keep_graph)

    def __init__(self, guard, keep_graph=False):
        super().__init__(keep_graph)
        self.guard = guard
        # torch's own replay, bound, behind the guard: an instance attribute,
        # found before the class's method (which does the same, for a copy)
        self.replay = guard.wrap(torch._C._CUDAGraph.replay.__get__(self))

    def replay(self):       # noqa: F811 -- reached only where the instance's is gone
        """Replay the graph once no class it uses sleeps.

        Raises
        ------
        MetraleError
            A class it uses sleeps (each named), or the arena is released:
            nothing was launched.
        """
        self.guard.check()
        torch._C._CUDAGraph.replay(self)


def graph(arena, uses=(), keep_graph=False):
    """A CUDA graph that refuses to replay over sleeping memory.

    Capture it as any ``torch.cuda.CUDAGraph`` (``with torch.cuda.graph(g,
    pool=metrale.torch.pool(arena).id): ...``); its ``replay()`` first tests
    the arena's mask of sleeping classes (``arena.guard(*uses).check()``, a
    few tens of nanoseconds) and raises, launching nothing, while one of the
    classes the graph touches sleeps: a staged wake (weights first, the KV
    cache later) cannot run a pass over memory still unmapped.

    Parameters
    ----------
    arena : BufferArena
        A reserved arena.
    uses : iterable of str, optional
        The classes (``BufferSpec(tag=...)``; ``"torch"``: the pool) or
        buffers the graph reads or writes; empty: every class of the arena
        (and its pool's, where it has one).
    keep_graph : bool, optional
        As ``torch.cuda.CUDAGraph`` takes it.

    Returns
    -------
    GuardedGraph

    Raises
    ------
    TypeError, ValueError
        As `BufferArena.guard`, for `uses`.
    MetraleError
        The arena has no reservation.
    """
    if isinstance(uses, str):
        uses = (uses,)
    return GuardedGraph(arena.guard(*tuple(uses)), keep_graph)


def bind(module, arena, ws, *, copy=False):
    """Make every parameter of `module` a tensor of the weight arena, without a copy.

    Each parameter (``module.named_parameters()``, a tied one once) becomes
    a ``torch.nn.Parameter`` over its bytes in the arena's weights buffer,
    at the set's offset, with its dtype and shape: the module then runs on
    the arena's memory, and `metrale.weights.load` (or a refit) writing the
    buffer is what the module computes with.  A tied parameter stays tied
    (every module that holds it gets the same new one).

    The tensors hold one view of the buffer: while the module (or a
    parameter) is alive the arena's `release` refuses, and so does a sleep
    that would drop or unmap the weights; the default contract
    (``"offload"``) sleeps with them kept readable at their addresses.

    Parameters
    ----------
    module : torch.nn.Module
        Built for the set (on the meta device, or anywhere with `copy`).
    arena : BufferArena
        Made by `metrale.weights.weight_arena` for `ws`, awake.
    ws : metrale.weights.WeightSet
        Its parameters: exactly the module's names, dtypes and shapes.
    copy : bool, optional
        First copy each parameter's current values into the arena (a module
        with weights, e.g. randomly initialized); a parameter on the meta
        device is refused.  False (the default): the arena's bytes are kept
        as they are.

    Returns
    -------
    torch.nn.Module
        `module`, bound.

    Raises
    ------
    TypeError
        An argument is not of its type.
    ValueError
        The module's parameters are not the set's (missing, extra, or of
        another dtype or shape: each named), or `copy` meets a parameter
        with no data: the module is unchanged.
    MetraleError
        The arena does not hold the set, sleeps, or is released.
    """
    where = "bind"
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{where}: module must be a torch.nn.Module, got "
                        f"{type(module).__name__}")
    if type(copy) is not bool:
        raise TypeError(f"{where}: copy must be a bool, got {type(copy).__name__}")
    _weights._check_arena(arena, ws, where)
    if arena.is_sleeping():
        raise MetraleError(f"{where}: the weight arena sleeps: wake it first")
    named = list(module.named_parameters())
    _weights._check_names(where, ws, [n for n, _p in named])
    for name, p in named:
        dtype = _weights._dtype_arg(p.dtype, f"{where}: parameter {name!r}")
        want = ws[name]
        if (dtype, tuple(p.shape)) != (want.dtype, want.shape):
            _weights._mismatch(where, name, dtype, tuple(p.shape), want)
        if copy and p.is_meta:
            raise ValueError(f"{where}: parameter {name!r} is on the meta device: it has no "
                             "values to copy (bind with copy=False, then load)")
    whole = tensor(arena, ws.buffer, "uint8")   # the one view the parameters share
    made = {}
    for name, p in named:
        want = ws[name]
        t = whole[want.offset:want.offset + want.nbytes].view(p.dtype).view(p.shape)
        if copy:
            with torch.no_grad():
                t.copy_(p)
        made[id(p)] = torch.nn.Parameter(t, requires_grad=p.requires_grad)
    if copy and whole.is_cuda:
        torch.cuda.synchronize(whole.device)   # the old parameters may go once swapped
    # every check and copy is done: now the swap, which cannot fail
    for sub in module.modules():
        for key, p in sub._parameters.items():
            if p is not None and id(p) in made:
                sub._parameters[key] = made[id(p)]
    return module
