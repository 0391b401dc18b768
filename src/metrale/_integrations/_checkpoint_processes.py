"""Process checkpoints over one process or several, from anywhere
(docs/checkpoint.md): `suspend` (lock + checkpoint) and `resume` (restore +
unlock), each driver call timed and waited for at most its timeout, the
processes' states said when a step fails.  The driver's calls on one pid are
metrale._integrations._checkpoint_driver's; metrale.checkpoint publishes
these beside them.
"""

import time

from . import _checkpoint_driver as _driver
from ._checkpoint_driver import (CHECKPOINTED, DEFAULT_LOCK_TIMEOUT, DEFAULT_TIMEOUT, LOCKED,
                                 _gpu_pairs, _pid, _resident, _state_now, checkpoint, lock,
                                 restore, state, unlock)
from .._base._common import seconds_arg
from .._base.errors import MetraleError

__all__ = ["suspend", "resume"]


def _pids(value):
    """One pid or several, as a tuple (suspend and resume take either)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"pids must be an int or an iterable of ints, got {type(value).__name__}")
    if hasattr(value, "__index__") or isinstance(value, bool):
        return (_pid(value, "pids"),)
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"pids must be an int or an iterable of ints, "
                        f"got {type(value).__name__}") from None
    out = tuple(_pid(p, "pids") for p in items)
    if not out:
        raise ValueError("pids must name at least one process")
    if len(set(out)) != len(out):
        raise ValueError(f"pids names a process twice: {list(out)}")
    return out


def _timed(times, step, fn):
    t0 = time.perf_counter()
    try:
        fn()
    finally:
        times[step] = times.get(step, 0.0) + time.perf_counter() - t0


def _plus(total, value):
    """A sum of figures that may be missing (None): missing once one is."""
    return None if total is None or value is None else total + value


def _settle(pids, skip):
    """Bring each process of `pids` (but those in `skip`, whose calls may still
    run) back to running where it can; return 'pid: state' for each."""
    out = []
    for p in pids:
        if p in skip:
            out.append(f"{p}: left as it is (its call did not return)")
            continue
        try:
            s = state(p, timeout=_driver._AFTER_TIMEOUT)
            if s == CHECKPOINTED:
                restore(p)
                s = LOCKED
            if s == LOCKED:
                unlock(p)
            out.append(f"{p}: {state(p, timeout=_driver._AFTER_TIMEOUT)}")
        except MetraleError as e:
            out.append(f"{p}: {e}")
    return "; ".join(out)


def suspend(pids, *, lock_timeout=DEFAULT_LOCK_TIMEOUT, timeout=DEFAULT_TIMEOUT):
    """Lock, then checkpoint, one CUDA process or several.

    Every process is locked before any is checkpointed, so that none is
    checkpointed while another still runs work that may wait for it.  On a
    failure, every process this call changed is brought back to running
    where it can (restored and unlocked); a process whose call did not
    return in time is left as it is.  The error then names each process's
    state.

    Call `prepare` in each engine process first (its shared arenas'
    peers), on every rank before any rank is suspended.

    Parameters
    ----------
    pids : int or iterable of int
        The processes, each in state ``"running"``.
    lock_timeout : float, optional
        Seconds each lock may wait (default 10; `lock`).
    timeout : float, optional
        Seconds each checkpoint may take (default 300).

    Returns
    -------
    dict
        ``"lock"``, ``"checkpoint"``: the seconds each step took (over all
        the processes); ``"rss_before"``, ``"rss_checkpointed"``: the
        processes' resident host memory in bytes (``VmRSS``, summed) just
        before and just after their checkpoints, None where /proc cannot
        be read.  The difference is the host memory the checkpoint took:
        the image of the device memory the driver copied out (the driver
        itself gives no figure).

    Raises
    ------
    TypeError, ValueError
        An argument is not valid (`pids` empty or naming a process twice).
    MetraleError
        A lock or checkpoint failed or timed out; the message names it and
        the state of every process afterwards.
    """
    pids = _pids(pids)
    lock_timeout = seconds_arg(lock_timeout, "lock_timeout")
    timeout = seconds_arg(timeout, "timeout")
    times, locked, step = {}, [], None
    rss = {"rss_before": 0, "rss_checkpointed": 0}
    try:
        for p in pids:
            step = (p, "lock")
            _timed(times, "lock", lambda: lock(p, timeout=lock_timeout))
            locked.append(p)
        for p in pids:
            step = (p, "checkpoint")
            # Read right around the call (a file read: no CUDA call, so it
            # works in the process being checkpointed itself).
            rss["rss_before"] = _plus(rss["rss_before"], _resident(p))
            _timed(times, "checkpoint", lambda: checkpoint(p, timeout=timeout))
            rss["rss_checkpointed"] = _plus(rss["rss_checkpointed"], _resident(p))
    except MetraleError as e:
        failed, what = step
        if what == "lock" and not locked:
            raise               # the first lock failed: nothing changed
        skip = {failed} if getattr(e, "_timed_out", False) else set()
        touched = locked + [p for p in (failed,) if p not in locked]
        raise MetraleError(f"suspend: {e}; afterwards: {_settle(touched, skip)}") from e
    times.update(rss)
    return times


def resume(pids, *, timeout=DEFAULT_TIMEOUT, gpu_map=None):
    """Restore, then unlock, one CUDA process or several.

    Every process is restored before any is unlocked.  A restore that fails
    does not stop the others: each process that was restored is unlocked,
    and the error names every process's state (one left ``"checkpointed"``
    cannot run CUDA work; kill it if no restore will succeed).

    Then call `finish` in each engine process (on every rank).

    Parameters
    ----------
    pids : int or iterable of int
        The processes, each in state ``"checkpointed"``.
    timeout : float, optional
        Seconds each restore may take (default 300).
    gpu_map : mapping, optional
        As for `restore` (for every process).

    Returns
    -------
    dict
        ``"restore"``, ``"unlock"``: the seconds each step took;
        ``"rss_after"``: the processes' resident host memory in bytes
        (``VmRSS``, summed) once unlocked, None where /proc cannot be read.

    Raises
    ------
    TypeError, ValueError
        An argument is not valid.
    MetraleError
        A restore or an unlock failed or timed out; the message names each
        process's state afterwards.
    """
    pids = _pids(pids)
    timeout = seconds_arg(timeout, "timeout")
    _gpu_pairs(gpu_map)         # checked before anything changes
    times, errors, restored = {}, [], []
    for p in pids:
        try:
            _timed(times, "restore", lambda: restore(p, timeout=timeout, gpu_map=gpu_map))
            restored.append(p)
        except MetraleError as e:
            errors.append(str(e))
    for p in restored:
        try:
            _timed(times, "unlock", lambda: unlock(p))
        except MetraleError as e:
            errors.append(str(e))
    if errors:
        if len(pids) == 1:
            raise MetraleError(errors[0])
        states = "; ".join(f"{p}: {_state_now(p)}" for p in pids)
        raise MetraleError(f"resume: {' / '.join(errors)}; afterwards: {states}")
    times["rss_after"] = 0
    for p in pids:
        times["rss_after"] = _plus(times["rss_after"], _resident(p))
    return times
