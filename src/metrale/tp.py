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
group's own (torch.distributed's process-group timeout).
"""

import itertools
import json
import os
import secrets
import socket
import struct
import sys
import time

from metrale.reference import REFERENCE
from metrale._common import check_index, seconds_arg
from metrale.errors import MetraleError

__all__ = ["PeerGroup", "PeerBuffers", "shared_arenas"]

#: Seconds a rank waits for a peer's descriptors (PeerGroup's default).
DEFAULT_TIMEOUT = 60.0
_HEADER_MAX = 1 << 20


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
    from metrale._peer import _shared_arenas
    return _shared_arenas()


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


_SERIAL = itertools.count()


class _Sharing:
    """What a shared arena keeps: the group's shape, the peers' mappings, the
    pointer cells handed out through PeerBuffers, and what attach_peers needs
    to map the peers again (the listening socket, the gathered descriptions)."""

    __slots__ = ("rank", "size", "local", "exported", "buffers", "bases", "signals", "reduces",
                 "detached", "serial", "_slabs", "_cells", "_peers", "_srv", "_infos")

    def __init__(self, rank, size, local, slabs, cells, exported, buffers, bases, signals,
                 srv=None, infos=None):
        self.rank, self.size, self.local = rank, size, local
        self.exported = exported        # this rank's handles exported (chunks and signal area)
        self.buffers = buffers
        self.bases = bases              # rank -> its slab's base here (own included)
        self.signals = signals          # rank -> its signal area here ({} without local peers)
        self.reduces = {}               # peer_all_reduce's parameter blocks, by buffer ids
        self.detached = False           # detach_peers unmapped the peers' memory
        self.serial = next(_SERIAL)     # this process's shared arenas, in construction order
        self._slabs, self._cells = slabs, cells
        self._peers = {}
        self._srv, self._infos = srv, infos

    def imported(self):
        """(handles, bytes) of the peers' slabs mapped here."""
        return self._slabs.mapped()

    def peer(self, rank):
        r = check_index(rank, "rank", 0, self.size - 1)
        if self.detached and r != self.rank:
            raise MetraleError("peer: the peers' memory is detached (detach_peers); "
                               "attach_peers maps it again at the same addresses")
        cell = self._cells.get(r)
        if cell is None:
            raise MetraleError(f"peer: rank {r} runs on another host (or network namespace); "
                               f"only ranks {self.local} share memory with rank {self.rank}")
        p = self._peers.get(r)
        if p is None:
            p = self._peers[r] = PeerBuffers(r, cell, self.buffers)
        return p

    def detach(self):
        self.detached = True            # first: a failed unmap must not leave it usable
        self._slabs.detach()

    def attach(self, gpu, chunks, timeout):
        """Export this rank's memory again, send it to each local peer over
        their kept sockets, and map theirs at the addresses detach kept; the
        errors of every step raise together, the arena staying detached."""
        if not self.detached:
            raise MetraleError("attach_peers: the peers' memory is attached (detach_peers first)")
        peers = [r for r in self.local if r != self.rank]
        if peers:
            own = [tuple(c) for c in chunks] + [self._slabs.own_signal()]
            errors, gone = _send_all(gpu, self.rank, self._infos, peers, own, None, timeout)
            try:
                _gather_slabs(self._slabs, self.rank, self._infos, set(peers) - gone, self._srv,
                              timeout, {}, {}, errors, 0, attach=True)
            except Exception as e:
                errors.append(f"rank {self.rank} failed while receiving its peers' memory: "
                              f"{type(e).__name__}: {e}")
            if errors:
                raise MetraleError("attach_peers: " + "; ".join(errors))
        self.detached = False

    def close(self):
        zeros = (0,) * len(self.buffers)
        for cell in self._cells.values():
            cell[0] = zeros
        if self._srv is not None:
            self._srv.close()
            self._srv = None
        self._slabs.close()


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _ns(kind):
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return ""


def _host_key():
    """Ranks with the same key can pass descriptors over an abstract socket:
    the same boot of the same machine and the same network namespace."""
    return f"{_read('/proc/sys/kernel/random/boot_id') or socket.gethostname()}/{_ns('net')}"


def _version():
    try:
        from metrale._version import __version__
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


_INFO_KEYS = ("version", "device_type", "device", "host", "pidns", "pid", "socket",
              "granularity", "signal", "slab", "max_batch_tokens", "buffers", "layout", "chunks")


def _malformed(info):
    """What is wrong with a gathered arena description (None: nothing), so
    that a rank sending garbage fails every rank with the same error."""
    if not isinstance(info, dict) or type(info.get("ok")) is not bool:
        return f"{type(info).__name__}, not a metrale arena description"
    if not info["ok"]:
        return None if isinstance(info.get("error"), str) else "a failure without its error"
    missing = [k for k in _INFO_KEYS if k not in info]
    if missing:
        return f"an arena description without {', '.join(missing)}"
    layout, chunks = info["layout"], info["chunks"]
    if not isinstance(info["buffers"], str):
        return "a buffer set without its fingerprint"
    if type(info["signal"]) is not int or info["signal"] <= 0:
        return "a signal area of no size"
    if (not isinstance(layout, (list, tuple)) or
            not all(isinstance(e, (list, tuple)) and len(e) == 3 and
                    all(type(x) is int for x in e) for e in layout)):
        return "a layout of the wrong shape"
    if not isinstance(chunks, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(type(x) is int for x in c) for c in chunks):
        return "a malformed chunk list"
    return None


def _check_agreement(infos, names):
    """Raise MetraleError unless every rank's info agrees with rank 0's; the
    same message on every rank (computed from the same gathered list; the
    buffer `names` are compared, by fingerprint, before they are used)."""
    for r, info in enumerate(infos):
        why = _malformed(info)
        if why is not None:
            raise MetraleError(f"tensor-parallel arena: rank {r} sent {why}")
        if not info["ok"]:
            raise MetraleError(f"tensor-parallel arena: rank {r} failed to build its arena "
                               f"({info['error']}); nothing is shared")
    ref = infos[0]
    for r, info in enumerate(infos[1:], 1):
        for key, what in (("version", "the metrale version"),
                          ("device_type", "the backend's device type"),
                          ("granularity", "the allocation granularity"),
                          ("signal", "the signal area's size"),
                          ("buffers", "the buffer set (its fingerprint)")):
            if info[key] != ref[key]:
                raise MetraleError(f"tensor-parallel arena: rank {r} and rank 0 disagree on "
                                   f"{what}: {info[key]!r} vs {ref[key]!r}")
        if len(info["layout"]) != len(names) or len(ref["layout"]) != len(names):
            raise MetraleError(f"tensor-parallel arena: rank {r} sent a layout of "
                               f"{len(info['layout'])} buffers for a set of {len(names)}")
        if info["layout"] != ref["layout"]:
            order = sorted(range(len(names)), key=lambda i: (ref["layout"][i][0], i))
            for i in order:
                a, b = ref["layout"][i], info["layout"][i]
                if a != b:
                    raise MetraleError(
                        f"tensor-parallel arena: rank {r} and rank 0 disagree on buffer "
                        f"{names[i]!r}: rank 0 has {a[1]} bytes at offset {a[0]:#x} "
                        f"(room {a[2]}), rank {r} {b[1]} bytes at offset {b[0]:#x} (room {b[2]}); "
                        "build every rank's arena from the same config, limits and levers")
        for key, what in (("max_batch_tokens", "max_batch_tokens"), ("slab", "the slab size"),
                          ("chunks", "the physical chunks")):
            if info[key] != ref[key]:
                raise MetraleError(f"tensor-parallel arena: rank {r} and rank 0 disagree on "
                                   f"{what}: {info[key]!r} vs {ref[key]!r}")


def _share(gpu, group, base, nbytes, chunks, layout, ptrs, granularity, max_batch_tokens,
           buffers, base_align):
    """The collective setup (module docstring): returns a _Sharing, or raises
    MetraleError on every rank with nothing of the peers left mapped."""
    from metrale._peer import SIGNAL_BYTES, PeerSlabs
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
    return _Sharing(me, size, local, slabs, cells, exported, buffers, bases, signals, srv, infos)


def _header(me, to, chunks, error):
    """What rank `me` sends rank `to` before its descriptors (JSON): one per
    chunk, then one for its signal area."""
    return json.dumps({"rank": me, "to": to, "chunks": [[c[0], c[1]] for c in chunks],
                       "error": error}).encode()


def _exchange(gpu, slabs, me, infos, local, chunks, srv, timeout, bases, signals, base_align):
    """Make this rank's signal area, send its chunks and signal area to each
    local peer, receive and map theirs; returns the errors seen here (the
    caller all-gathers them).  Never raises for what a peer or a stranger
    sends: every rank must reach the second all-gather, or the others would
    wait out the group's timeout."""
    own = error = None
    try:
        n = infos[me]["signal"]
        signals[me], handle = slabs.map_signal(n)
        own = list(chunks) + [(0, n, handle)]
    except Exception as e:
        error = f"rank {me} could not export its slab: {type(e).__name__}: {e}"
    errors, gone = _send_all(gpu, me, infos, [q for q in local if q != me], own, error, timeout)
    pending = set(local) - {me} - gone
    try:
        _gather_slabs(slabs, me, infos, pending, srv, timeout, bases, signals, errors, base_align)
    except Exception as e:          # a bug here must not strand the other ranks
        errors.append(f"rank {me} failed while receiving its peers' slabs: "
                      f"{type(e).__name__}: {e}")
    return errors


def _send_all(gpu, me, infos, peers, own, error, timeout):
    """Export `own` (this rank's chunks, then its signal area: (offset,
    bytes, handle) each) and send them to each of `peers` over its socket,
    after a header; with `error` (or when the export fails) send that
    instead.  Returns the errors seen here and the peers known gone (their
    socket refused the connection: nobody listens there); never raises for
    a peer."""
    from metrale._peer import export_chunks
    errors = [error] if error else []
    gone = set()
    fds = []
    if error is None:
        try:
            fds = export_chunks(gpu, own)
        except Exception as e:
            error = f"rank {me} could not export its slab: {type(e).__name__}: {e}"
            errors.append(error)
    chunks = own[:-1] if own else []
    try:
        for q in peers:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as c:
                    c.settimeout(timeout)
                    c.connect(infos[q]["socket"])
                    c.send(_header(me, q, chunks, error))
                    if error is None:
                        for fd in fds:
                            socket.send_fds(c, [b"c"], [fd])
            except (ConnectionRefusedError, FileNotFoundError) as e:
                gone.add(q)
                errors.append(f"rank {me} could not send its slab to rank {q}, which is gone "
                              f"(its socket refused the connection: {e}); not waited for")
            except OSError as e:
                errors.append(f"rank {me} could not send its slab to rank {q}: {e}")
    finally:
        for fd in fds:
            os.close(fd)
    return errors, gone


def _gather_slabs(slabs, me, infos, pending, srv, timeout, bases, signals, errors, base_align,
                  attach=False):
    """Accept connections until every pending rank's slab is mapped (or has
    failed, or the deadline passes).  Connections are read when they have
    data, so a silent stranger holds up nobody; one whose peer credentials
    show it is no rank of the group is closed at once."""
    import selectors
    deadline = time.monotonic() + timeout
    pids = {infos[r]["pid"]: r for r in pending} if all(
        infos[r]["pidns"] == _ns("pid") for r in pending) else None
    sel = selectors.DefaultSelector()
    srv.setblocking(False)
    sel.register(srv, selectors.EVENT_READ)
    try:
        while pending:
            if pids is not None:        # a rank known dead is not waited for
                for r in sorted(pending):
                    if _gone(infos[r]["pid"]):
                        pending.discard(r)
                        errors.append(f"rank {me} got no slab from rank {r}: its process "
                                      f"{infos[r]['pid']} is gone; not waited for")
                if not pending:
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                errors.append(f"rank {me} got no slab from rank(s) {sorted(pending)} within "
                              f"{timeout:g} s (did they die?)")
                return
            # in slices, so that a rank that dies meanwhile is seen
            for key, _ in sel.select(min(left, _POLL) if pids is not None else left):
                if key.fileobj is srv:
                    try:
                        conn, _ = srv.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as e:    # e.g. out of descriptors: retrying would spin
                        errors.append(f"rank {me} could not accept a peer's connection: {e}")
                        return
                    who = _peer_rank(conn, pids)
                    if who is False:        # provably no rank of the group: ignored
                        conn.close()
                        continue
                    sel.register(conn, selectors.EVENT_READ, who)
                    continue
                conn = key.fileobj
                sel.unregister(conn)
                with conn:
                    conn.settimeout(max(deadline - time.monotonic(), 0.001))
                    r, err = _receive(conn, key.data, slabs, me, infos, pending, bases,
                                      signals, base_align, attach)
                if r is None:
                    continue                # a stranger's message: ignored
                pending.discard(r)
                if err:
                    errors.append(err)
    finally:
        for key in list(sel.get_map().values()):
            if key.fileobj is not srv:
                key.fileobj.close()
        sel.close()


# How often a wait for the peers' slabs looks whether a pending rank died (s).
_POLL = 0.25


def _gone(pid):
    """Whether process `pid` (of this pid namespace) has exited: no such
    process, or a zombie its parent has not reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")


def _peer_rank(conn, pids):
    """The pending rank whose process is at the other end of `conn` (by its
    peer credentials), None when that cannot be told (another pid
    namespace), False when it is no pending rank."""
    if pids is None:
        return None
    try:
        pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  struct.calcsize("3i")))[0]
    except OSError:
        return None
    return pids.get(pid, False)


def _receive(conn, sender, slabs, me, infos, pending, bases, signals, base_align, attach=False):
    """One peer's header and descriptors: (rank, its error or None), or
    (None, None) for a message that is no pending rank's.  `sender` is the
    rank the peer credentials showed (None: unknown).  Whatever a rank sends
    that is malformed becomes an error naming it; nothing here raises."""
    try:
        raw = conn.recv(_HEADER_MAX)
    except OSError as e:
        if sender is None:
            return None, None
        return sender, f"rank {me} could not read rank {sender}'s header: {e}"
    try:
        header = json.loads(raw)
    except Exception:               # not JSON, or nested too deeply
        header = None
    claimed = header.get("rank") if isinstance(header, dict) else None
    r = sender if sender is not None else claimed
    if type(r) is not int or r not in pending:
        return None, None
    if sender is None and (not isinstance(header, dict) or header.get("to") != me):
        return None, None           # not provably from rank r, and not for this rank
    try:
        if not isinstance(header, dict) or header.get("rank") != r or header.get("to") != me:
            raise ValueError(f"not a header from rank {r} to rank {me}: {raw[:200]!r}")
        if header.get("error"):
            return r, str(header["error"])
        chunks = header.get("chunks")
        if (not isinstance(chunks, list) or
                not all(isinstance(c, list) and len(c) == 2 and all(type(x) is int for x in c)
                        for c in chunks)):
            raise ValueError(f"malformed chunk list {chunks!r}"[:300])
        if chunks != infos[r]["chunks"]:
            raise ValueError(f"sent chunks {chunks}, not the ones it announced")
        fds = []
        try:
            for _ in range(len(chunks) + 1):        # the chunks, then the signal area
                _msg, got, flags, _addr = socket.recv_fds(conn, 16, 1)
                fds.extend(got)
                if flags & socket.MSG_CTRUNC or len(got) != 1:
                    raise OSError(f"a descriptor did not arrive (flags {flags:#x}, "
                                  f"{len(got)} descriptors; out of descriptors?)")
            n = infos[r]["signal"]
            if attach:          # the same addresses as before detach_peers
                slabs.remap_peer(("signal", r), [(0, n)], fds[-1:])
                slabs.remap_peer(r, [tuple(c) for c in chunks], fds[:-1])
            else:
                signals[r] = slabs.map_peer(("signal", r), n, [(0, n)], fds[-1:])
                bases[r] = slabs.map_peer(r, infos[r]["slab"], [tuple(c) for c in chunks],
                                          fds[:-1], base_align)
        finally:
            for fd in fds:
                os.close(fd)
    except Exception as e:
        return r, f"rank {me} failed to map rank {r}'s slab: {type(e).__name__}: {e}"
    return r, None
