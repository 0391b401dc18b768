"""Tensor-parallel arenas: one layout on every rank, the peers' slabs mapped once.

``BufferArena.new(..., group=g)`` builds a reserved arena whose physical
memory can be exported, checks collectively that every rank of `g` laid it
out identically, and maps the slab of every rank on the same host into this
process, once.  ``arena.peer(r)`` then gives rank r's buffers at addresses
this process (and its device) can use: the peer's base plus the same offsets.
Nothing more happens per step or at graph capture.  See
docs/tensor-parallel.md.

The protocol, run by every rank at construction:

1. every rank listens on a Unix socket with a random abstract name, then
   all-gathers what the others must check or know: the layout (each
   buffer's offset, size and room), the granularity, the physical chunks,
   its host and its socket's name (the group is the rendezvous: no store,
   no port);
2. every rank checks the gathered list the same way, so that either all
   go on or all raise the same MetraleError (a rank whose construction
   failed sends its error instead of a layout);
3. every rank exports each chunk once (a file descriptor), sends the
   descriptors to each local peer over that peer's socket (SCM_RIGHTS),
   closes them, then receives each peer's, imports and maps them into a
   reservation of its own, and closes them;
4. a second all-gather of every rank's outcome: one failure anywhere and
   every rank raises, having unmapped what it mapped.

Socket waits are bounded by `PeerGroup`'s timeout; all-gathers by the
group's own (torch.distributed's process-group timeout).  The checks of
step 2 and the exchange of step 3 are in `metrale._sharing._tp_exchange`.
"""

import os
import secrets
import socket
import sys

from .._sizing.reference import REFERENCE
from .._base._common import seconds_arg
from .._sharing._tp_exchange import _check_agreement, _exchange, _ns
from ._peers import Peers
from .._base.errors import MetraleError

__all__ = ["PeerGroup", "PeerBuffers", "shared_arenas"]

#: Seconds a rank waits for a peer's descriptors (PeerGroup's default).
DEFAULT_TIMEOUT = 60.0


class PeerGroup:
    """The ranks an arena is shared among, and how long to wait for them.

    ``BufferArena.new(..., group=g)`` wraps `g` in a PeerGroup itself; build
    one to set the timeout.  The group is only used at construction, for
    two all-gathers of small Python objects.

    Parameters
    ----------
    group : object
        A ``torch.distributed`` process group (torch's
        ``all_gather_object(..., group=group)`` is used, so an NCCL group
        needs ``torch.cuda.set_device`` first, as always); the
        ``torch.distributed`` module itself (its default group); or any
        object with ``all_gather_object(object_list, obj)`` (filling
        ``object_list`` with every rank's `obj`, in rank order) and
        ``rank()`` / ``size()`` (or ``get_rank()`` / ``get_world_size()``).
        A PeerGroup gives its group (with this `timeout`); `new` takes a
        PeerGroup as it is.
    timeout : float, optional
        Seconds a rank waits for each peer's descriptors (default 60).
        All-gathers wait as long as the group's own timeout.

    Attributes
    ----------
    group : object
        The group as given.
    timeout : float
        Seconds a rank waits for each peer's descriptors.

    Raises
    ------
    TypeError
        `group` has neither interface, or `timeout` is not a number.
    ValueError
        `timeout` is not a number of seconds in (0, 86400], or the group's rank is not in
        ``[0, size)``.
    """

    __slots__ = ("group", "timeout", "_gather", "_rank", "_size")

    def __init__(self, group, *, timeout=DEFAULT_TIMEOUT):
        timeout = seconds_arg(timeout, "timeout")
        if isinstance(group, PeerGroup):
            group = group.group
        self.group = group
        self.timeout = timeout
        gather = getattr(group, "all_gather_object", None)
        dist = sys.modules.get("torch.distributed")
        if gather is None and dist is not None and type(group).__module__.startswith("torch"):
            # A ProcessGroup: torch's collective takes it as an argument.
            def gather(out, obj, _dist=dist, _group=group):
                return _dist.all_gather_object(out, obj, group=_group)
            rank, size = dist.get_rank(group), dist.get_world_size(group)
        elif callable(gather):
            rank = _call_first(group, ("rank", "get_rank"))
            size = _call_first(group, ("size", "get_world_size"))
        else:
            raise TypeError(f"group must be a torch.distributed process group or have "
                            f"all_gather_object(object_list, obj), got {type(group).__name__}")
        if isinstance(rank, bool) or isinstance(size, bool):
            raise TypeError("group: rank() and size() must return ints")
        rank, size = _index(rank, "group: rank()"), _index(size, "group: size()")
        if not 0 <= rank < size:
            raise ValueError(f"group: rank {rank} is not in [0, {size})")
        self._gather, self._rank, self._size = gather, rank, size

    def rank(self):
        """This process's rank in the group.

        Returns
        -------
        int
        """
        return self._rank

    def size(self):
        """The number of ranks in the group.

        Returns
        -------
        int
        """
        return self._size

    def all_gather(self, obj):
        """Every rank's `obj`, in rank order (a collective call).

        Parameters
        ----------
        obj : object
            What this rank contributes (picklable).

        Returns
        -------
        list

        Raises
        ------
        MetraleError
            The group's all-gather failed (a rank died, the group timed out)
            or returned a list of the wrong length.
        """
        out = [None] * self._size
        try:
            self._gather(out, obj)
        except Exception as e:
            raise MetraleError(f"tensor-parallel arena: all_gather_object over the group failed "
                               f"on rank {self._rank}: {type(e).__name__}: {e}") from e
        if len(out) != self._size:
            raise MetraleError(f"tensor-parallel arena: all_gather_object gave {len(out)} "
                               f"objects for {self._size} ranks")
        return list(out)

    def __repr__(self):
        return (f"PeerGroup({type(self.group).__name__}, rank={self._rank}, size={self._size}, "
                f"timeout={self.timeout})")


def shared_arenas():
    """The live shared arenas of this process (built with ``group=``).

    What a process checkpoint detaches and attaches (metrale.checkpoint).

    Returns
    -------
    list of BufferArena
        Not released, in the order they were built.  Building a shared
        arena is collective, so every rank of a group lists the arenas it
        shares in the same order: the order `attach_peers` calls, each
        collective, must follow.
    """
    from ._arena_state import shared_arenas as arenas
    return arenas()


def _call_first(obj, names):
    for name in names:
        fn = getattr(obj, name, None)
        if callable(fn):
            return fn()
    raise TypeError(f"group: {type(obj).__name__} has all_gather_object but no "
                    f"{' / '.join(n + '()' for n in names)}")


def _index(v, what):
    try:
        return v.__index__()
    except AttributeError:
        raise TypeError(f"{what} must return an int, got {type(v).__name__}") from None


class PeerBuffers:
    """One rank's buffers at the addresses this process uses for them.

    Got from ``arena.peer(rank)``: the same pointer accessors as
    `BufferArena` (``hidden_states()``, ``logits()`` ...), each returning
    that rank's buffer as mapped here, the peer's base plus the buffer's
    offset; 0 for an empty buffer, and 0 for every buffer once the arena is
    released.  Valid on this process's device for kernels, copies and
    graph capture.  For this process's own rank it gives the arena's own
    pointers.

    Parameters
    ----------
    rank : int
        The rank whose buffers these are.
    cell : list
        A one-element list holding the pointers by buffer id (the arena
        replaces it with zeros at release).
    buffers : BufferSet
        The arena's buffer set (the ids).

    Attributes
    ----------
    rank : int
        The rank whose buffers these are.
    """

    __slots__ = ("rank", "_cell", "_buffers")

    def __init__(self, rank, cell, buffers):
        self.rank = rank
        self._cell = cell
        self._buffers = buffers

    def ptr(self, name):
        """The pointer of any buffer of the arena's set by name.

        Parameters
        ----------
        name : str
            A buffer name (the ones without an accessor included).

        Returns
        -------
        int

        Raises
        ------
        TypeError, ValueError
            `name` is not a str, or not a buffer name.
        """
        if type(name) is not str:
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        i = self._buffers._index.get(name)
        if i is None:
            raise ValueError(f"name: {self._buffers._unknown(name)}")
        return self._cell[0][i]

    def __repr__(self):
        first = self._buffers.names[0] if len(self._buffers) else None
        shown = f", {first}={self._cell[0][0]:#x}" if first else ""
        return f"PeerBuffers(rank={self.rank}{shown})"


def _accessor(name):
    def accessor(self):
        i = self._buffers._index.get(name)
        if i is None:
            raise MetraleError(f"{name}: not in this arena's buffer set (use ptr(name) for "
                               "the buffers it has)")
        return self._cell[0][i]
    accessor.__name__ = name
    accessor.__qualname__ = f"PeerBuffers.{name}"
    accessor.__doc__ = (f"This rank's ``{name}`` as mapped here (0 when empty or released).\n\n"
                        "Returns\n-------\nint\n")
    return accessor


# The accessors, derived from the reference buffers (tests/test_tp.py checks
# them against BufferArena's and the stub).
for _name in REFERENCE.groups["pointer"]:
    setattr(PeerBuffers, _name, _accessor(_name))
del _name


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _host_key():
    """Ranks with the same key can pass descriptors over an abstract socket:
    the same boot of the same machine and the same network namespace."""
    return f"{_read('/proc/sys/kernel/random/boot_id') or socket.gethostname()}/{_ns('net')}"


def _version():
    try:
        from .._version import __version__
        return __version__
    except ImportError:
        return "unknown"


def _abort(group, exc):
    """A rank whose construction failed: take part in the first all-gather
    with its error, so that the others raise instead of waiting."""
    try:
        group.all_gather({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    except Exception:
        pass


def _share(gpu, group, base, nbytes, chunks, layout, ptrs, granularity, max_batch_tokens,
           buffers, base_align):
    """The collective setup (module docstring): returns a _Sharing, or raises
    MetraleError on every rank with nothing of the peers left mapped."""
    from .._sharing._peer_slabs import SIGNAL_BYTES, PeerSlabs
    me, size, timeout = group.rank(), group.size(), group.timeout
    signal = -(-SIGNAL_BYTES // granularity) * granularity
    srv = slabs = None
    gathering = False
    try:
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        slabs = PeerSlabs(gpu)
        name = f"\0metrale-tp-{os.getpid()}-{secrets.token_hex(8)}"
        srv.bind(name)
        srv.listen(max(size, 1))
        info = {"ok": True, "version": _version(), "device_type": gpu.device_type,
                "device": gpu.device_id, "host": _host_key(), "pidns": _ns("pid"),
                "pid": os.getpid(), "socket": name, "granularity": granularity, "signal": signal,
                "slab": nbytes, "max_batch_tokens": max_batch_tokens,
                "buffers": buffers.fingerprint(), "layout": layout,
                "chunks": [[c[0], c[1]] for c in chunks]}
        gathering = True
        infos = group.all_gather(info)
        _check_agreement(infos, buffers.names)
        local = tuple(r for r in range(size) if infos[r]["host"] == info["host"])
        errors = []
        bases, signals = {}, {}
        if nbytes and len(local) > 1:
            errors = _exchange(gpu, slabs, me, infos, local, chunks, srv, timeout, bases,
                               signals, base_align)
        try:
            outcome = group.all_gather({"errors": errors})
        except MetraleError as e:
            if not errors:
                raise
            raise MetraleError(f"{e}; before that, on rank {me}: {'; '.join(errors)}") from e
        failed = list(dict.fromkeys(e for o in outcome for e in o["errors"]))   # each once
        if failed:
            raise MetraleError("tensor-parallel arena: setup failed: " + "; ".join(failed))
    except BaseException as e:
        if not gathering:
            _abort(group, e)    # failed before the first all-gather: the others raise too
        try:
            if slabs is not None:
                slabs.close()
        except Exception:
            pass        # PeerSlabs' finalizer retries
        if srv is not None:
            srv.close()
        raise
    if not bases:
        srv.close()             # no local peer: nothing to attach again
        srv = None
    cells = {me: [tuple(ptrs)]}
    for r, b in bases.items():
        cells[r] = [tuple(p - base + b if p else 0 for p in ptrs)]
    exported = len(chunks) + 1 if bases else 0
    bases[me] = base
    return Peers(me, size, local, slabs, cells, exported, buffers, bases, signals, srv, infos)
