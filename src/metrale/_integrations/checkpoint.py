"""Process checkpoints of an engine: its GPU memory given back and restored at the same addresses.

The CUDA driver (570 or newer, CUDA 12.8) can checkpoint a whole process:
``cuCheckpointProcessLock`` blocks its CUDA calls and waits for its work,
``cuCheckpointProcessCheckpoint`` copies its device memory to host memory
and releases the GPU, ``cuCheckpointProcessRestore`` maps it back at the
same addresses with its contexts, streams and graph executables, and
``cuCheckpointProcessUnlock`` lets it run on.  Every call names the process
by pid, so a supervisor can drive it from outside, and a process can drive
itself (NVIDIA's own sample does).

Imported peer memory is not supported by the driver's checkpoint: a
tensor-parallel arena must unmap the peers' slabs first and map them again
after the restore.  This module puts the pieces in order:

* in the engine process, `prepare` (before the checkpoint: every shared
  arena detaches its peers and, asked to, every other reserved arena
  sleeps; it returns a `Prepared` record of what it kept out of the image)
  and `finish` (after the restore: the arenas wake, and every shared arena
  attaches its peers again, a collective call over the ranks on the host);
* anywhere, on a pid: `state`, `lock`, `checkpoint`, `restore`, `unlock`,
  `restore_thread_id`, and `suspend` / `resume` (lock + checkpoint, restore
  + unlock, for one process or several).

Each driver call runs on a worker thread and is waited for at most its
timeout: past it, MetraleError says so, with the state the process is in
(read back from the driver), instead of the caller hanging.  The driver is
reached through ctypes, on first use: importing this module loads nothing
but the standard library.  See docs/checkpoint.md.
"""

import itertools
import os
import weakref
from collections.abc import Mapping

# The driver's calls on one pid, and the constants, are metrale._integrations._checkpoint_driver's;
# the public ones are this module's API too (__all__).
from . import _checkpoint_driver as _driver
from ._checkpoint_driver import (CHECKPOINTED, DEFAULT_LOCK_TIMEOUT, DEFAULT_TIMEOUT, FAILED,
                                 LOCKED, QUERY_TIMEOUT, RUNNING, STATES, checkpoint, driver_info,
                                 lock, restore, restore_thread_id, state, unlock)
from ._checkpoint_processes import resume, suspend
from .._base._common import seconds_arg
from .._base._record import Record
from .._base.errors import MetraleError
from .._sizing._spec import POOL_NAME

__all__ = ["RUNNING", "LOCKED", "CHECKPOINTED", "FAILED", "STATES", "DEFAULT_LOCK_TIMEOUT",
           "DEFAULT_TIMEOUT", "QUERY_TIMEOUT", "driver_info", "state", "restore_thread_id", "lock",
           "checkpoint", "restore", "unlock", "suspend", "resume", "prepare", "finish",
           "Prepared"]


# -- in the engine process -----------------------------------------------------------


_PEERS = ("detach_peers", "attach_peers", "peers_detached")


def _arenas(arenas, needs=_PEERS):
    if arenas is None:
        from .._arena.tp import shared_arenas
        return shared_arenas()
    if isinstance(arenas, (str, bytes)) or not hasattr(arenas, "__iter__"):
        raise TypeError(f"arenas must be an iterable of BufferArena, got {type(arenas).__name__}")
    out = list(arenas)
    for a in out:
        for name in needs:
            if not callable(getattr(a, name, None)):
                raise TypeError(f"arenas: {type(a).__name__} has no {name}()")
    if len({id(a) for a in out}) != len(out):
        raise ValueError("arenas names an arena twice")
    return out


def _uses_cuda(arenas):
    """Whether any of `arenas` lives on a CUDA device (a host arena's peers need
    no driver; stand-ins without a backend count as host)."""
    from .._backends._backend import Backend
    from .._backends._host_backend import HostBackend
    for a in arenas:
        get = getattr(a, "backend", None)
        backend = get() if callable(get) else None
        if isinstance(backend, Backend) and not isinstance(backend, HostBackend):
            return True
    return False


def _check_running(arenas, what):
    """Refuse where this process is locked or checkpointed: detaching or
    attaching makes CUDA calls, which would block for good."""
    if not _uses_cuda(arenas):
        return
    try:
        s = state(os.getpid(), timeout=_driver._AFTER_TIMEOUT)
    except MetraleError:
        return              # no checkpoint support here: the process cannot be locked
    if s != RUNNING:
        raise MetraleError(f"{what}: this process is in state {s}; its CUDA calls block until "
                           "it is restored and unlocked (resume it first)")


# The arenas `prepare` put to sleep -> the order it did, for `finish` to wake
# them in (weakly: one released or collected meanwhile is simply gone).
_SLEPT = weakref.WeakKeyDictionary()
_ORDER = itertools.count()


def _sleep_args(sleep):
    """`prepare`'s sleep= as arena.sleep's keyword arguments, or None."""
    if sleep is False or sleep is None:
        return None
    if sleep is True:
        return {}
    if not isinstance(sleep, Mapping):
        raise TypeError(f"sleep must be a bool or a mapping with 'keep' and 'offload', got "
                        f"{type(sleep).__name__}")
    unknown = [k for k in sleep if k not in ("keep", "offload")]
    if unknown:
        raise ValueError(f"sleep: unknown key(s) {', '.join(map(repr, unknown))}: 'keep' and "
                         "'offload' are arena.sleep's")
    out = {}
    for k, names in sleep.items():      # read once: an iterator serves every arena
        if isinstance(names, str):
            names = (names,)
        try:
            out[k] = tuple(names)
        except TypeError:
            raise TypeError(f"sleep: {k} must be a buffer name or an iterable of buffer "
                            f"names, got {type(names).__name__}") from None
    return out


def _for(a, kwargs):
    """`kwargs` for arena `a`: the pool's name left out of `offload` where
    `a` has no pool (the mapping serves every arena)."""
    off = kwargs.get("offload")
    if off is None or getattr(a, "pool", None) is not None:
        return kwargs
    return {**kwargs, "offload": tuple(n for n in off
                                       if not (type(n) is str and n == POOL_NAME))}


def _size(n):
    """Bytes for a log line: 512 B, 1.0 KiB, 92.4 MiB, 2.11 GiB (negative too)."""
    v, unit = float(n), None
    for u in ("KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024:
            break
        v, unit = v / 1024, u
    if unit is None:
        return f"{n} B"
    return f"{v:.2f} {unit}" if unit in ("GiB", "TiB") else f"{v:.1f} {unit}"


class Prepared(Record):
    """What `prepare` did, and what it kept out of the checkpoint's image.

    The driver's checkpoint copies every byte of device memory the process
    maps into host memory (its image) and the restore copies it back; what
    an arena gave back by sleeping is in neither.  The byte counts are over
    the arenas `prepare` took (those given, or its default set), their
    buffers' memory and their pools'.  ``str(p)`` (`log_line`) is one line
    for an engine's log.

    Attributes
    ----------
    arenas : tuple of BufferArena
        The arenas whose peers are detached or that sleep now (because of
        this call or an earlier one): `finish` attaches and wakes them.
    committed_bytes : int
        Device memory the arenas mapped when `prepare` began.
    resident_bytes : int
        Device memory they still map, which the driver copies into the
        image: a shared arena's (it cannot sleep), and every arena's
        without `sleep`.
    kept_bytes : int
        Bytes of the buffers named in ``keep``, copied to pinned host
        memory by this call's sleeps (``memory_stats()["kept_bytes"]``).
    offloaded_bytes : int
        Bytes of the buffers named in ``offload`` and of the pools'
        segments (``"torch"``) moved to host memory by this call's sleeps.
    """

    __slots__ = ("arenas", "committed_bytes", "resident_bytes", "kept_bytes",
                 "offloaded_bytes")

    @property
    def released_bytes(self):
        """Device memory the sleeps gave back: kept out of the image."""
        return self.committed_bytes - self.resident_bytes

    @property
    def discarded_bytes(self):
        """Device memory given back with no copy of it kept: the discarded
        buffers' and pool segments', and the allocation granules' tails of
        kept and offloaded buffers (`released_bytes` less what was copied)."""
        return self.released_bytes - self.kept_bytes - self.offloaded_bytes

    def log_line(self, suspended=None):
        """One line for a log: the figures, and the image the checkpoint took.

        Parameters
        ----------
        suspended : mapping, optional
            The dict `suspend` returned for this process (an engine that
            checkpoints itself has it): its ``"rss_before"`` and
            ``"rss_checkpointed"`` add the host memory the checkpoint took.
            None (the default): `prepare`'s figures only.

        Returns
        -------
        str

        Raises
        ------
        TypeError, ValueError
            `suspended` is not a mapping, or lacks those keys.
        """
        text = (f"prepare: {len(self.arenas)} arena(s) detached or asleep; of "
                f"{_size(self.committed_bytes)} of device memory, {_size(self.discarded_bytes)} "
                f"discarded, {_size(self.kept_bytes)} kept and {_size(self.offloaded_bytes)} "
                f"offloaded to host memory, {_size(self.resident_bytes)} left on the device (in "
                "the checkpoint's image)")
        if suspended is None:
            return text
        if not isinstance(suspended, Mapping):
            raise TypeError(f"suspended must be the dict suspend returned, got "
                            f"{type(suspended).__name__}")
        missing = [k for k in ("rss_before", "rss_checkpointed") if k not in suspended]
        if missing:
            raise ValueError(f"suspended: no {' or '.join(map(repr, missing))} (the dict "
                             "suspend returns has them)")
        before, after = suspended["rss_before"], suspended["rss_checkpointed"]
        if before is None or after is None:
            return text + "; the checkpoint's host memory: unknown (/proc/<pid>/status not read)"
        return (text + f"; the checkpoint took {_size(after - before)} of host memory "
                f"(resident {_size(before)} -> {_size(after)})")

    def __str__(self):
        return self.log_line()


def _device(a):
    """(device bytes `a` maps now, its kept bytes, its offloaded bytes): its
    buffers' and its pool's."""
    m = a.memory_stats()
    return (m["committed_bytes"] + m["pool_committed_bytes"], m["kept_bytes"],
            m["offloaded_bytes"] + m["pool_offloaded_bytes"])


def prepare(arenas=None, *, sleep=False):
    """Get this process ready for a checkpoint: every shared arena detaches
    its peers, and with `sleep` every other reserved arena sleeps.

    Each tensor-parallel arena unmaps and releases the peers' memory it
    imported, keeping the address ranges reserved, so that the driver can
    checkpoint this process (it cannot restore imported memory).  Call it
    on every rank, and let every rank finish it, before any rank is locked:
    a peer's checkpoint cannot free memory this process still maps.  No
    kernel may read a peer's buffers from then until `finish`.

    With `sleep`, each arena that is not shared sleeps (``arena.sleep``):
    the device memory it gives back (its buffers', its pool's, what torch
    holds there) is then not in the driver's image, so the checkpoint
    writes and the restore reads only what the engine keeps; `finish`
    wakes it at the same addresses, graphs captured over it valid.  The
    `Prepared` record it returns says how much that was.

    Parameters
    ----------
    arenas : iterable of BufferArena, optional
        The arenas; None (the default): every live shared arena of this
        process (``metrale.tp.shared_arenas()``) and, with `sleep`, every
        live reserved arena that is not shared and not asleep (or asleep
        by an earlier `prepare`), in the order they were built.  An arena
        given twice is a ValueError.  A shared arena is detached (it cannot
        sleep); with `sleep`, every other arena given sleeps (a plain one,
        built without ``reserve=``, refuses: MetraleError), but one asleep
        already is left as it is (and `finish` leaves it asleep).
    sleep : bool or mapping, optional
        False (the default): no arena sleeps.  True: each sleeps
        discarding its memory (``arena.sleep()``).  A mapping with the
        keys ``"keep"`` and ``"offload"`` (either may be left out): passed
        to every arena's ``sleep`` (``"torch"``, the pool, only to those
        that have one), e.g. ``{"offload": ["torch"]}`` (kept
        buffers go to pinned host memory, offloaded ones to host memory
        mapped at their addresses).

    Returns
    -------
    Prepared
        Its ``arenas``: those whose peers are detached or that sleep now
        because of this call or an earlier one; and the figures: the
        device memory they mapped, what the sleeps discarded, kept and
        offloaded, what is left for the image (``str()`` is a log line).

    Raises
    ------
    TypeError, ValueError
        `arenas` is not an iterable of arenas, or `sleep` is not a bool or
        a mapping of those keys to names; nothing changed.  (A name an
        arena does not have is its ``sleep``'s ValueError, below.)
    MetraleError, BufferError, OutOfMemoryError
        This process is already locked or checkpointed, or an arena failed
        to detach or to sleep (as ``arena.sleep`` raises: a view alive, a
        name not its buffer's, ...).  Prepare stops there, with no record:
        the arenas before it stay detached or asleep (`finish` attaches and
        wakes them); that arena stays as ``detach_peers`` or ``sleep`` left
        it.
    """
    kwargs = _sleep_args(sleep)
    if arenas is None and kwargs is not None:
        from .._arena._arena_state import reserved_arenas
        arenas = _arenas(None) + [a for a in reserved_arenas()
                                  if not a.is_sleeping() or a in _SLEPT]
    else:
        arenas = _arenas(arenas, _PEERS + ("memory_stats",))
    _check_running(arenas, "prepare")
    done, committed, resident, kept, offloaded = [], 0, 0, 0, 0
    for a in arenas:
        committed += _device(a)[0]
        if not a.peers_detached():
            a.detach_peers()            # nothing for an arena that is not shared
        if a.peers_detached():
            done.append(a)              # shared: detached (it cannot sleep)
        elif kwargs is not None and not a.is_sleeping():
            a.sleep(**_for(a, kwargs))
            _SLEPT[a] = next(_ORDER)
            done.append(a)
            _, k, o = _device(a)        # what this sleep copied (an earlier one's is not)
            kept, offloaded = kept + k, offloaded + o
        elif a in _SLEPT and a.is_sleeping():
            done.append(a)
        resident += _device(a)[0]
    return Prepared(tuple(done), committed, resident, kept, offloaded)


def finish(arenas=None, *, timeout=60.0):
    """After a restore: every arena `prepare` put to sleep wakes, and every
    shared arena whose peers are detached attaches them again.

    A collective call: every rank on the host must make it, with its arenas
    in the same order (each arena's attach waits for its peers).  By
    default that is the order of ``metrale.tp.shared_arenas()``, which
    follows construction, itself collective and so in the same order on
    every rank; pass `arenas` to choose.  The peers' memory is imported and
    mapped again at the same addresses, so pointers from ``arena.peer(r)``
    and graphs captured over them work again.

    Parameters
    ----------
    arenas : iterable of BufferArena, optional
        The arenas; None (the default): every live shared arena of this
        process, and every arena `prepare` put to sleep.  Given, only those
        of them are woken.
    timeout : float, optional
        Seconds each arena waits for its peers (default 60).

    Returns
    -------
    list of BufferArena
        The arenas woken (in the order `prepare` put them to sleep), then
        those whose peers were attached.

    Raises
    ------
    TypeError, ValueError
        An argument is not valid.
    MetraleError, OutOfMemoryError
        This process is still locked or checkpointed (resume it first), an
        arena failed to wake (it still sleeps, and the next `finish` tries
        again; the others woke and the peers attached before this is
        raised), or an arena failed to attach (a peer missing past
        `timeout`, say).
    """
    timeout = seconds_arg(timeout, "timeout")
    given = arenas is not None
    arenas = _arenas(arenas)
    slept = sorted(((n, a) for a, n in list(_SLEPT.items())
                    if not given or any(a is b for b in arenas)), key=lambda t: t[0])
    _check_running(arenas + [a for _, a in slept], "finish")
    done, first = [], None
    for n, a in slept:
        del _SLEPT[a]
        if a.is_released() or not a.is_sleeping():
            continue
        try:
            a.wake()
            done.append(a)
        except Exception as e:      # the others still wake, and the peers attach
            _SLEPT[a] = n           # for the next finish
            first = first or e
    for a in arenas:
        if a.peers_detached():
            a.attach_peers(timeout=timeout)
            done.append(a)
    if first is not None:
        raise first
    return done
