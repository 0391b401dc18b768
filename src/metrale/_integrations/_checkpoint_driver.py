"""The CUDA driver's process checkpoint calls, one pid at a time.

``cuCheckpointProcess*`` reached through ctypes (``libcuda.so.1``, loaded on
first use: importing this module loads nothing but the standard library),
each call run on a worker thread and waited for at most its timeout.
`metrale.checkpoint` offers these calls and puts them in order: several
processes (`suspend`, `resume`) and the engine's own arenas (`prepare`,
`finish`).  See docs/checkpoint.md.
"""

import math
import os
import sys
import threading

from .._base._common import seconds_arg
from .._base.errors import MetraleError

#: The process states of CUprocessState, as `state` returns them.
RUNNING, LOCKED, CHECKPOINTED, FAILED = "running", "locked", "checkpointed", "failed"
STATES = (RUNNING, LOCKED, CHECKPOINTED, FAILED)    # indexed by the enum's value (cuda.h)

#: Seconds `lock` waits for the process's CUDA calls and work to finish.
DEFAULT_LOCK_TIMEOUT = 10.0
#: Seconds `checkpoint` and `restore` may take (they copy every byte of device memory).
DEFAULT_TIMEOUT = 300.0
#: Seconds `state`, `restore_thread_id` and `unlock` may take.
QUERY_TIMEOUT = 10.0

# The driver API versions (cuDriverGetVersion) and driver branches that have them.
_MIN_API, _MIN_BRANCH = 12080, "570"            # the cuCheckpointProcess* calls
_REMAP_API, _REMAP_BRANCH = 13000, "580"        # restore onto other GPUs (gpuPairs)
_LIBCUDA = "libcuda.so.1"
_CALLS = ("cuCheckpointProcessGetState", "cuCheckpointProcessGetRestoreThreadId",
          "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
          "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock")
_SUCCESS = 0
_NOT_READY = 600                # CUDA_ERROR_NOT_READY: what a lock that timed out returns
# Seconds the thread of a lock is waited for past the driver's lock timeout.
_LOCK_GRACE = 5.0
# Reading the state back after a failure, for the error message.
_AFTER_TIMEOUT = 5.0


def _pid(value, name="pid"):
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        v = value.__index__()
    except (AttributeError, TypeError):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if not 0 < v < 1 << 31:
        raise ValueError(f"{name} must be a process id in [1, 2**31), got {v}")
    return v


def _uuid(value):
    """16 bytes from a GPU UUID: nvidia-smi's 'GPU-xxxxxxxx-xxxx-...' form, the
    bare hex, or the bytes themselves."""
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
    elif isinstance(value, str):
        text = value[4:] if value.upper().startswith("GPU-") else value
        try:
            raw = bytes.fromhex(text.replace("-", ""))
        except ValueError:
            raw = b""
    else:
        raise TypeError(f"gpu_map: a GPU UUID must be a str or bytes, got {type(value).__name__}")
    if len(raw) != 16:
        raise ValueError(f"gpu_map: {value!r} is not a GPU UUID (16 bytes, or 'GPU-' and "
                         "32 hex digits as nvidia-smi -L prints them)")
    return raw


def _gpu_pairs(gpu_map):
    if gpu_map is None:
        return None
    if not hasattr(gpu_map, "items"):
        raise TypeError(f"gpu_map must be a mapping of GPU UUIDs, got {type(gpu_map).__name__}")
    pairs = [(_uuid(old), _uuid(new)) for old, new in gpu_map.items()]
    if not pairs:
        raise ValueError("gpu_map is empty: give None to restore onto the same GPUs")
    return pairs


# -- the driver -----------------------------------------------------------------------


def _branch():
    """The kernel driver's version ('580.159.04'), or None where it cannot be read."""
    for path in ("/sys/module/nvidia/version", "/proc/driver/nvidia/version"):
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            continue
        for word in text.split():
            if word[:1].isdigit() and "." in word:
                return word
    return None


def _describe(api, branch):
    cuda = f"CUDA {api // 1000}.{api % 1000 // 10}"
    return f"driver {branch} ({cuda})" if branch else f"a driver for {cuda}"


def _too_old(api, branch, missing):
    return (f"process checkpointing needs an NVIDIA driver of branch {_MIN_BRANCH} or newer "
            f"(CUDA 12.8); this is {_describe(api, branch)}, without {', '.join(missing)}")


class _CudaDriver:
    """The checkpoint calls of libcuda, through ctypes (resolved at run time: a
    driver older than 570 lacks them, and a cimport would break the import)."""

    def __init__(self, lib, branch=None):
        import ctypes
        self._ct = ctypes
        self.branch = branch
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) != _SUCCESS:
            raise MetraleError("process checkpointing: cuDriverGetVersion failed")
        self.api = v.value
        missing = [name for name in _CALLS if not hasattr(lib, name)]
        if missing or self.api < _MIN_API:
            raise MetraleError(_too_old(self.api, branch, missing or ["them (too old)"]))
        self._lib = lib
        self._name_fn = getattr(lib, "cuGetErrorName", None)
        for name in _CALLS:
            getattr(lib, name).restype = ctypes.c_int
        # cuda.h: restore needs persistence mode or cuInit in the caller.
        err = lib.cuInit(0)
        if err != _SUCCESS:
            raise MetraleError(f"process checkpointing: cuInit failed: {self.error_name(err)}")
        self._structs = _structs(ctypes)

    def error_name(self, code):
        ct = self._ct
        s = ct.c_char_p()
        if self._name_fn is not None and self._name_fn(code, ct.byref(s)) == _SUCCESS and s.value:
            return s.value.decode()
        return f"CUresult {code}"

    def get_state(self, pid):
        st = self._ct.c_int(-1)
        return self._lib.cuCheckpointProcessGetState(pid, self._ct.byref(st)), st.value

    def restore_thread_id(self, pid):
        tid = self._ct.c_int(0)
        return self._lib.cuCheckpointProcessGetRestoreThreadId(pid, self._ct.byref(tid)), tid.value

    def lock(self, pid, timeout_ms):
        args = self._structs["lock"](timeoutMs=timeout_ms)
        return self._lib.cuCheckpointProcessLock(pid, self._ct.byref(args))

    def checkpoint(self, pid):
        return self._lib.cuCheckpointProcessCheckpoint(pid, None)     # no arguments: NULL

    def restore(self, pid, pairs):
        if pairs is None:
            return self._lib.cuCheckpointProcessRestore(pid, None)
        if self.api < _REMAP_API:
            raise MetraleError(f"restore with gpu_map needs an NVIDIA driver of branch "
                               f"{_REMAP_BRANCH} or newer (CUDA 13.0); this is "
                               f"{_describe(self.api, self.branch)}")
        args = _restore_args(self._ct, self._structs, pairs)
        return self._lib.cuCheckpointProcessRestore(pid, self._ct.byref(args))

    def unlock(self, pid):
        return self._lib.cuCheckpointProcessUnlock(pid, None)


def _structs(ctypes):
    """The argument structs, laid out as cuda.h (CUDA 13.0) declares them:
    64 bytes each, the reserved fields zeroed (ctypes zero-fills)."""
    u64 = ctypes.c_uint64

    class LockArgs(ctypes.Structure):
        _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                    ("reserved1", u64 * 7)]

    class GpuPair(ctypes.Structure):        # two CUuuid: char bytes[16] each
        _fields_ = [("oldUuid", ctypes.c_ubyte * 16), ("newUuid", ctypes.c_ubyte * 16)]

    class RestoreArgs(ctypes.Structure):
        _fields_ = [("gpuPairs", ctypes.POINTER(GpuPair)), ("gpuPairsCount", ctypes.c_uint),
                    ("reserved", ctypes.c_char * (52 - ctypes.sizeof(ctypes.c_void_p))),
                    ("reserved1", u64)]

    return {"lock": LockArgs, "pair": GpuPair, "restore": RestoreArgs}


def _restore_args(ctypes, structs, pairs):
    arr = (structs["pair"] * len(pairs))()
    for slot, (old, new) in zip(arr, pairs):
        ctypes.memmove(slot.oldUuid, old, 16)
        ctypes.memmove(slot.newUuid, new, 16)
    args = structs["restore"](gpuPairs=ctypes.cast(arr, ctypes.POINTER(structs["pair"])),
                              gpuPairsCount=len(pairs))
    args._keep = arr            # the pairs live as long as the arguments
    return args


_loaded = None
_load_lock = threading.Lock()


def _driver():
    """The process-wide driver object (loaded once; tests replace this function)."""
    global _loaded
    with _load_lock:
        if _loaded is None:
            if not sys.platform.startswith("linux"):
                raise MetraleError("process checkpointing is Linux-only (the CUDA driver's "
                                   f"checkpoint calls), not {sys.platform}")
            import ctypes
            try:
                lib = ctypes.CDLL(_LIBCUDA)
            except OSError as e:
                raise MetraleError(f"process checkpointing needs the NVIDIA driver ({_LIBCUDA} "
                                   f"did not load: {e})") from None
            _loaded = _CudaDriver(lib, _branch())
        return _loaded


def driver_info():
    """What the driver here offers for process checkpointing.

    Loads the driver (``libcuda.so.1``) on first use, as every function of
    this module does, and initializes it (``cuInit``; no context is made).

    Returns
    -------
    dict
        ``"driver"``: the kernel driver's version (``"580.159.04"``; None
        where it cannot be read), ``"cuda"``: the driver API version
        (``cuDriverGetVersion``, 13000 for CUDA 13.0), ``"gpu_map"``:
        whether `restore` can remap GPUs (driver 580 or newer).

    Raises
    ------
    MetraleError
        No NVIDIA driver here, not Linux, or a driver older than 570 (CUDA
        12.8): the message names the version needed and the one found.
    """
    d = _driver()
    api = getattr(d, "api", _REMAP_API)
    return {"driver": getattr(d, "branch", None), "cuda": api, "gpu_map": api >= _REMAP_API}


# -- bounded calls --------------------------------------------------------------------

# Calls that outlived their timeout, still blocked in the driver: (what, pid, thread).
_stuck = []


def _bounded(fn, timeout):
    """fn() on a worker thread, waited for at most `timeout` seconds: (True,
    its result), or (False, the thread) while it still runs (left to finish,
    or to stay blocked, on its own)."""
    box = {}

    def work():
        try:
            box["value"] = fn()
        except BaseException as e:          # re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=work, name="metrale-checkpoint", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return False, t
    if "error" in box:
        raise box["error"]
    return True, box["value"]


def _state_now(pid):
    """The state of `pid` for an error message: a name, or why there is none."""
    try:
        d = _driver()
        done, res = _bounded(lambda: d.get_state(pid), _AFTER_TIMEOUT)
    except MetraleError as e:
        return f"unknown ({e})"
    if not done:
        return f"unknown (the state query did not answer within {_AFTER_TIMEOUT:g} s)"
    err, value = res
    if err != _SUCCESS:
        return f"unknown ({d.error_name(err)})"
    return _state_name(value)


def _state_name(value):
    return STATES[value] if 0 <= value < len(STATES) else f"unknown (CUprocessState {value})"


def _resident(pid):
    """The resident host memory of process `pid` in bytes (``VmRSS`` of
    /proc/<pid>/status: the kernel's counters, read without waiting on the
    process, so a locked or checkpointed one answers too), or None where it
    cannot be read (no such process, no /proc, a kernel thread)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024      # in kB, the kernel's unit
    except (OSError, ValueError, IndexError):
        pass
    return None


def _exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:         # another user's process: it exists
        pass
    return True


def _run(what, pid, fn, timeout):
    """fn(driver) on a worker thread within `timeout`: (driver, its result);
    MetraleError (marked as timed out) past it."""
    d = _driver()
    done, res = _bounded(lambda: fn(d), timeout)
    if not done:
        _stuck.append((what, pid, res))
        err = MetraleError(f"{what} of pid {pid} did not finish within {timeout:g} s; the "
                           f"process is in state {_state_now(pid)}")
        err._timed_out = True           # suspend leaves such a process alone
        raise err
    return d, res


def _check(d, what, pid, res, hint=""):
    """The value of a finished driver call (for the calls that give one);
    MetraleError naming the call, the pid, the driver's error and the state
    the process is in afterwards."""
    err, value = res if isinstance(res, tuple) else (res, None)
    if err == _SUCCESS:
        return value
    name = d.error_name(err)
    if not _exists(pid):
        raise MetraleError(f"{what} of pid {pid} failed: {name}; there is no process {pid}")
    raise MetraleError(f"{what} of pid {pid} failed: {name}; the process is in state "
                       f"{_state_now(pid)}{hint}")


def _call(what, pid, fn, timeout, hint=""):
    d, res = _run(what, pid, fn, timeout)
    return _check(d, what, pid, res, hint)


# -- one call on a pid ----------------------------------------------------------------


def state(pid, *, timeout=QUERY_TIMEOUT):
    """The checkpoint state of a CUDA process.

    Parameters
    ----------
    pid : int
        The process (this one's own pid works too).
    timeout : float, optional
        Seconds to wait for the driver's answer (default 10).

    Returns
    -------
    str
        ``"running"``, ``"locked"``, ``"checkpointed"`` or ``"failed"``
        (`STATES`).

    Raises
    ------
    TypeError, ValueError
        `pid` or `timeout` is not valid.
    MetraleError
        The driver refused (the process has no CUDA state, or does not
        exist), did not answer within `timeout`, or cannot checkpoint (see
        `driver_info`).
    """
    pid, timeout = _pid(pid), seconds_arg(timeout, "timeout")
    return _state_name(_call("state query", pid, lambda d: d.get_state(pid), timeout))


def restore_thread_id(pid, *, timeout=QUERY_TIMEOUT):
    """The id of the thread in `pid` that the driver restores it with.

    A tool that stops the process's threads (a debugger, ptrace, CRIU) must
    leave this one running, or `checkpoint` and `restore` wait for it.

    Parameters
    ----------
    pid : int
        The process.
    timeout : float, optional
        Seconds to wait for the driver's answer (default 10).

    Returns
    -------
    int
        A thread id (``/proc/<pid>/task/<tid>``).

    Raises
    ------
    TypeError, ValueError
        `pid` or `timeout` is not valid.
    MetraleError
        As for `state`.
    """
    pid, timeout = _pid(pid), seconds_arg(timeout, "timeout")
    return _call("restore thread query", pid, lambda d: d.restore_thread_id(pid), timeout)


def lock(pid, *, timeout=DEFAULT_LOCK_TIMEOUT):
    """Lock a running CUDA process: its CUDA calls block, its pending work finishes.

    Parameters
    ----------
    pid : int
        The process, in state ``"running"``.
    timeout : float, optional
        Seconds the driver waits for the process's CUDA calls and work to
        finish (its lock timeout; default 10).  Past it the process stays
        running and MetraleError says so.

    Raises
    ------
    TypeError, ValueError
        `pid` or `timeout` is not valid (`timeout` at most 4294967 s).
    MetraleError
        The lock failed or timed out (the message names the driver's error
        and the process's state), or the driver cannot checkpoint.
    """
    pid = _pid(pid)
    timeout = seconds_arg(timeout, "timeout")
    ms = max(1, math.ceil(timeout * 1000))
    # The driver's own timeout fires first; the thread waits a little longer.
    d, res = _run("lock", pid, lambda d: d.lock(pid, ms), timeout + _LOCK_GRACE)
    if res == _NOT_READY:
        raise MetraleError(f"lock of pid {pid} did not succeed within {timeout:g} s "
                           f"({d.error_name(res)}): a CUDA call or work of the process did not "
                           f"finish; the process is in state {_state_now(pid)}")
    _check(d, "lock", pid, res)


def checkpoint(pid, *, timeout=DEFAULT_TIMEOUT):
    """Checkpoint a locked CUDA process: its device memory copied to host memory, the GPU given back.

    Parameters
    ----------
    pid : int
        The process, in state ``"locked"``.  Its imported peer memory must
        be released first (`prepare`): the driver cannot restore it.
    timeout : float, optional
        Seconds to wait (default 300); the time grows with the device memory
        the process holds.

    Raises
    ------
    TypeError, ValueError
        `pid` or `timeout` is not valid.
    MetraleError
        The driver refused or did not finish within `timeout`; the message
        names the process's state.
    """
    pid, timeout = _pid(pid), seconds_arg(timeout, "timeout")
    _call("checkpoint", pid, lambda d: d.checkpoint(pid), timeout)


def restore(pid, *, timeout=DEFAULT_TIMEOUT, gpu_map=None):
    """Restore a checkpointed CUDA process: its device memory back at the same addresses.

    The process is left locked: `unlock` lets it run (`resume` does both).

    Parameters
    ----------
    pid : int
        The process, in state ``"checkpointed"``.
    timeout : float, optional
        Seconds to wait (default 300).
    gpu_map : mapping, optional
        Restore onto other GPUs: each checkpointed GPU's UUID to the UUID of
        the GPU of the same kind to restore it onto (``"GPU-..."`` as
        ``nvidia-smi -L`` prints it, or 16 bytes); every checkpointed GPU
        must be named.  Needs driver 580 or newer.  None (the default): the
        same GPUs.

    Raises
    ------
    TypeError, ValueError
        `pid`, `timeout` or `gpu_map` is not valid.
    MetraleError
        The driver refused or did not finish within `timeout`: the message
        names the process's state (``"checkpointed"``: its CUDA calls block
        until a restore succeeds; kill it if none will).
    """
    pid, timeout = _pid(pid), seconds_arg(timeout, "timeout")
    pairs = _gpu_pairs(gpu_map)
    _call("restore", pid, lambda d: d.restore(pid, pairs), timeout,
          "" if pairs is None else f" (gpu_map of {len(pairs)} GPUs)")


def unlock(pid, *, timeout=QUERY_TIMEOUT):
    """Unlock a locked CUDA process: its CUDA calls go on.

    Parameters
    ----------
    pid : int
        The process, in state ``"locked"``.
    timeout : float, optional
        Seconds to wait (default 10).

    Raises
    ------
    TypeError, ValueError
        `pid` or `timeout` is not valid.
    MetraleError
        The driver refused or did not finish within `timeout`.
    """
    pid, timeout = _pid(pid), seconds_arg(timeout, "timeout")
    _call("unlock", pid, lambda d: d.unlock(pid), timeout)
