"""metrale.checkpoint on the host: argument checks, the order of the driver
calls, timeouts, rollback, the driver-too-old path and the argument structs.

There is no process checkpoint on the host, so a fake driver stands in for
libcuda: it keeps each pid's state as the driver's state machine does (cuda.h:
lock running -> locked, checkpoint locked -> checkpointed, restore
checkpointed -> locked, unlock locked -> running; a call in the wrong state
returns CUDA_ERROR_ILLEGAL_STATE), logs every call, and fails or blocks a call
on demand.  The real calls run on the GPU in test_checkpoint_cuda.py."""

import ctypes
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest

import metrale
import metrale._integrations._checkpoint_driver as ckdriver
import metrale.checkpoint as ckpt
import metrale.tp
from metrale import MetraleError

# CUresult values, from cuda.h (CUDA 13.0).
SUCCESS, INVALID_VALUE, ILLEGAL_STATE, NOT_READY, NOT_SUPPORTED = 0, 1, 401, 600, 801
NAMES = {SUCCESS: "CUDA_SUCCESS", INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
         ILLEGAL_STATE: "CUDA_ERROR_ILLEGAL_STATE", NOT_READY: "CUDA_ERROR_NOT_READY",
         NOT_SUPPORTED: "CUDA_ERROR_NOT_SUPPORTED"}
RUNNING, LOCKED, CHECKPOINTED, FAILED = range(4)     # CUprocessState


class FakeDriver:
    """The driver object metrale.checkpoint calls (the interface of
    metrale._integrations._checkpoint_driver._CudaDriver)."""

    def __init__(self, pids=(), api=13000):
        self.states = {p: RUNNING for p in pids}
        self.log = []
        self.fail = {}          # (call, pid) -> CUresult to return instead (state unchanged)
        self.block = {}         # (call, pid) -> Event the call waits on first
        self.api, self.branch = api, "580.00.01"

    def _enter(self, call, pid, *extra):
        self.log.append((call, pid) + extra)
        ev = self.block.get((call, pid))
        if ev is not None:
            ev.wait(30)
        return self.fail.get((call, pid))

    def _move(self, call, pid, before, after, *extra):
        err = self._enter(call, pid, *extra)
        if err is not None:
            return err
        if pid not in self.states:
            return INVALID_VALUE
        if self.states[pid] != before:
            return ILLEGAL_STATE
        self.states[pid] = after
        return SUCCESS

    def error_name(self, code):
        return NAMES.get(code, f"CUresult {code}")

    def get_state(self, pid):
        err = self._enter("state", pid)
        if err is not None:
            return err, -1
        if pid not in self.states:
            return INVALID_VALUE, -1
        return SUCCESS, self.states[pid]

    def restore_thread_id(self, pid):
        self._enter("tid", pid)
        return (SUCCESS, pid + 1000) if pid in self.states else (INVALID_VALUE, 0)

    def lock(self, pid, timeout_ms):
        return self._move("lock", pid, RUNNING, LOCKED, timeout_ms)

    def checkpoint(self, pid):
        return self._move("checkpoint", pid, LOCKED, CHECKPOINTED)

    def restore(self, pid, pairs):
        return self._move("restore", pid, CHECKPOINTED, LOCKED, pairs)

    def unlock(self, pid):
        return self._move("unlock", pid, LOCKED, RUNNING)

    def calls(self):
        """The calls that change a state, without the state queries."""
        return [c[:2] for c in self.log if c[0] not in ("state", "tid")]


# Three distinct live pids (the fake does not care, but the error for a missing
# process reads /proc): this process, its parent and init, or where two of them
# are one (pytest run as pid 1, or its parent gone and pytest reparented to
# init) a child that lives until this process exits and closes its stdin.
def _three_live_pids():
    pids = list(dict.fromkeys((os.getpid(), os.getppid(), 1)))
    while len(pids) < 3:
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                 stdin=subprocess.PIPE)
        _CHILDREN.append(child)
        pids.append(child.pid)
    return tuple(pids)


_CHILDREN = []
PIDS = _three_live_pids()


@pytest.fixture
def drv(monkeypatch):
    d = FakeDriver(PIDS)
    monkeypatch.setattr(ckdriver, "_driver", lambda: d)
    monkeypatch.setattr(ckdriver, "_AFTER_TIMEOUT", 0.5)
    return d


def state_of(d, pid):
    return ckpt.STATES[d.states[pid]]


# -- the import, the names -----------------------------------------------------------


def test_import_loads_no_driver_and_no_ctypes():
    code = ("import sys, metrale.checkpoint, metrale._integrations._checkpoint_driver as c; "
            "print(sorted(m for m in sys.modules if m in ('ctypes', 'numpy', 'metrale._arena._buffer_arena') "
            "or m.startswith('cuda')), c._loaded)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       timeout=60)
    assert r.stdout.split() == ["[]", "None"]


def test_checkpoint_is_not_a_top_level_name():
    # users import metrale.checkpoint themselves; `import metrale` stays as it was
    assert "checkpoint" not in metrale.__all__


def test_states_follow_the_driver_enum():
    assert ckpt.STATES == ("running", "locked", "checkpointed", "failed")
    assert (ckpt.RUNNING, ckpt.LOCKED, ckpt.CHECKPOINTED, ckpt.FAILED) == ckpt.STATES


# -- arguments: refused before any driver call ----------------------------------------


@pytest.mark.parametrize("bad,exc", [(True, TypeError), ("12", TypeError), (1.0, TypeError),
                                     (None, TypeError), (0, ValueError), (-3, ValueError),
                                     (2 ** 31, ValueError)])
def test_pid_is_checked(drv, bad, exc):
    for fn in (ckpt.state, ckpt.restore_thread_id, ckpt.lock, ckpt.checkpoint, ckpt.restore,
               ckpt.unlock):
        with pytest.raises(exc, match="pid"):
            fn(bad)
    assert drv.log == []


@pytest.mark.parametrize("bad,exc", [(True, TypeError), ("1", TypeError), (None, TypeError),
                                     (0, ValueError), (-1, ValueError),
                                     (float("inf"), ValueError), (float("nan"), ValueError)])
def test_timeouts_are_checked(drv, bad, exc):
    pid = PIDS[0]
    for fn in (ckpt.state, ckpt.restore_thread_id, ckpt.lock, ckpt.checkpoint, ckpt.restore,
               ckpt.unlock, ckpt.suspend, ckpt.resume):
        with pytest.raises(exc, match="timeout"):
            fn(pid, timeout=bad)
    with pytest.raises(exc, match="lock_timeout"):
        ckpt.suspend(pid, lock_timeout=bad)
    with pytest.raises(exc, match="timeout"):
        ckpt.finish([], timeout=bad)
    assert drv.log == []


def test_the_lock_timeout_fits_the_drivers_milliseconds(drv):
    """The one bound of every timeout (a day, metrale._base._common.MAX_SECONDS)
    is what the driver's 32-bit milliseconds hold; 4294967 s used to pass
    here and 1e9 s to fail later inside."""
    assert 86400 * 1000 < 2 ** 32
    for bad in (86400.5, 4294968, 1e9, 1e300):
        with pytest.raises(ValueError, match=r"timeout must be a number of seconds in \(0, 86400\]"):
            ckpt.lock(PIDS[0], timeout=bad)
        with pytest.raises(ValueError, match=r"lock_timeout must be a number of seconds"):
            ckpt.suspend(PIDS[0], lock_timeout=bad)
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            ckpt.finish([], timeout=bad)
    assert drv.log == []


def test_lock_passes_its_timeout_in_milliseconds(drv):
    p = PIDS[0]
    ckpt.lock(p, timeout=2.5)
    ckpt.unlock(p)
    ckpt.lock(p, timeout=0.0001)             # rounded up: 0 would mean no timeout at all
    ckpt.unlock(p)
    ckpt.lock(p)
    assert [c[2] for c in drv.log if c[0] == "lock"] == [2500, 1, 10000]


@pytest.mark.parametrize("bad,exc,what", [
    ([], ValueError, "at least one"), ([PIDS[0], PIDS[0]], ValueError, "twice"),
    ("123", TypeError, "pids"), (b"1", TypeError, "pids"), (1.5, TypeError, "pids"),
    ([1, "2"], TypeError, "pids"), ([1, 0], ValueError, "pids"), (object(), TypeError, "pids")])
def test_pids_are_checked(drv, bad, exc, what):
    for fn in (ckpt.suspend, ckpt.resume):
        with pytest.raises(exc, match=what):
            fn(bad)
    assert drv.log == []


@pytest.mark.parametrize("bad,exc,what", [
    ([("GPU-0", "GPU-1")], TypeError, "gpu_map must be a mapping"),
    ({}, ValueError, "gpu_map is empty"),
    ({"GPU-1234": "GPU-" + "0" * 32}, ValueError, "not a GPU UUID"),
    ({"GPU-" + "zz" * 16: "GPU-" + "0" * 32}, ValueError, "not a GPU UUID"),
    ({b"\0" * 15: b"\0" * 16}, ValueError, "not a GPU UUID"),
    ({1: b"\0" * 16}, TypeError, "gpu_map: a GPU UUID must be")])
def test_gpu_map_is_checked(drv, bad, exc, what):
    ckpt.suspend(PIDS[0])
    before = list(drv.log)
    for fn in (ckpt.restore, ckpt.resume):
        with pytest.raises(exc, match=what):
            fn(PIDS[0], gpu_map=bad)
    assert drv.log == before and state_of(drv, PIDS[0]) == "checkpointed"


def test_gpu_map_reaches_the_driver_as_byte_pairs(drv):
    p = PIDS[0]
    ckpt.suspend(p)
    old, new = "GPU-" + "0123456789abcdef" * 2, bytes(range(16))
    ckpt.resume(p, gpu_map={old: new})
    (pairs,) = [c[2] for c in drv.log if c[0] == "restore"]
    assert pairs == [(bytes.fromhex("0123456789abcdef" * 2), new)]
    # the bare hex and the dashed form are the same UUID
    ckpt.suspend(p)
    ckpt.resume(p, gpu_map={"01234567-89ab-cdef-0123-456789abcdef": new})
    assert [c[2] for c in drv.log if c[0] == "restore"][1] == pairs


# -- one call, its errors, its timeout -----------------------------------------------


def test_each_call_moves_the_state_as_the_driver_does(drv):
    p = PIDS[1]
    assert ckpt.state(p) == "running"
    ckpt.lock(p)
    assert ckpt.state(p) == "locked"
    ckpt.checkpoint(p)
    assert ckpt.state(p) == "checkpointed"
    ckpt.restore(p)
    assert ckpt.state(p) == "locked"
    ckpt.unlock(p)
    assert ckpt.state(p) == "running"
    assert ckpt.restore_thread_id(p) == p + 1000
    assert drv.calls() == [("lock", p), ("checkpoint", p), ("restore", p), ("unlock", p)]


def test_a_call_in_the_wrong_state_names_the_state(drv):
    p = PIDS[0]
    with pytest.raises(MetraleError, match=rf"checkpoint of pid {p} failed: "
                                           r"CUDA_ERROR_ILLEGAL_STATE; the process is in state "
                                           r"running$"):
        ckpt.checkpoint(p)
    ckpt.lock(p)
    with pytest.raises(MetraleError, match=r"lock of pid \d+ failed: CUDA_ERROR_ILLEGAL_STATE; "
                                           r"the process is in state locked"):
        ckpt.lock(p)


def test_a_refused_restore_says_the_process_stays_checkpointed(drv):
    p = PIDS[0]
    ckpt.suspend(p)
    drv.fail[("restore", p)] = NOT_SUPPORTED        # the imported-peer-memory case
    with pytest.raises(MetraleError, match=rf"restore of pid {p} failed: "
                                           r"CUDA_ERROR_NOT_SUPPORTED; the process is in state "
                                           r"checkpointed"):
        ckpt.resume(p)
    assert state_of(drv, p) == "checkpointed" and ("unlock", p) not in drv.calls()
    del drv.fail[("restore", p)]
    ckpt.resume(p)                  # a later restore that works
    assert state_of(drv, p) == "running"


def test_a_restore_that_hangs_raises_after_its_timeout(drv):
    p = PIDS[0]
    ckpt.suspend(p)
    drv.block[("restore", p)] = ev = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(MetraleError, match=rf"^restore of pid {p} did not finish within 0.3 s; "
                                           r"the process is in state checkpointed$"):
        ckpt.restore(p, timeout=0.3)
    assert 0.3 <= time.monotonic() - t0 < 5
    assert ckdriver._stuck[-1][:2] == ("restore", p)
    ev.set()                        # the blocked call finishes on its own thread
    ckdriver._stuck[-1][2].join(10)
    assert state_of(drv, p) == "locked"


def test_a_state_query_that_hangs_does_not_hang_the_error(drv):
    p = PIDS[0]
    ckpt.suspend(p)
    drv.block[("restore", p)] = ev1 = threading.Event()
    drv.block[("state", p)] = ev2 = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(MetraleError, match=r"did not finish within 0.2 s; the process is in state "
                                           r"unknown \(the state query did not answer within "
                                           r"0.5 s\)"):
        ckpt.restore(p, timeout=0.2)
    assert time.monotonic() - t0 < 5
    with pytest.raises(MetraleError, match=r"state query of pid \d+ did not finish within 0.2 s"):
        ckpt.state(p, timeout=0.2)
    ev1.set()
    ev2.set()


def test_a_lock_the_driver_timed_out_leaves_the_process_running(drv):
    p = PIDS[0]
    drv.fail[("lock", p)] = NOT_READY
    with pytest.raises(MetraleError, match=rf"lock of pid {p} did not succeed within 0.25 s "
                                           r"\(CUDA_ERROR_NOT_READY\): a CUDA call or work of the "
                                           r"process did not finish; the process is in state "
                                           r"running"):
        ckpt.lock(p, timeout=0.25)
    assert [c for c in drv.log if c[0] == "lock"] == [("lock", p, 250)]


def test_a_lock_the_driver_never_returns_is_bounded(drv, monkeypatch):
    monkeypatch.setattr(ckdriver, "_LOCK_GRACE", 0.2)
    p = PIDS[0]
    drv.block[("lock", p)] = ev = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(MetraleError, match=r"lock of pid \d+ did not finish within 0.3 s"):
        ckpt.lock(p, timeout=0.1)
    assert time.monotonic() - t0 < 5
    ev.set()


def test_an_unknown_state_value_is_named(drv):
    drv.states[PIDS[0]] = 7
    assert ckpt.state(PIDS[0]) == "unknown (CUprocessState 7)"


def test_a_process_that_does_not_exist_is_named():
    d = FakeDriver()                # knows no pid: the driver's INVALID_VALUE
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(60)                      # a pid that just ended (reused only after a wrap-around)
    ckpt_driver = ckdriver._driver
    ckdriver._driver = lambda: d
    try:
        with pytest.raises(MetraleError, match=rf"state query of pid {p.pid} failed: "
                                               rf"CUDA_ERROR_INVALID_VALUE; there is no process "
                                               rf"{p.pid}$"):
            ckpt.state(p.pid)
        with pytest.raises(MetraleError, match=r"CUDA_ERROR_INVALID_VALUE; the process is in "
                                               r"state unknown \(CUDA_ERROR_INVALID_VALUE\)"):
            ckpt.lock(os.getpid())  # alive, but no CUDA process the driver knows
    finally:
        ckdriver._driver = ckpt_driver


# -- suspend and resume: the order, and what a failure leaves -------------------------


def test_suspend_and_resume_one_process(drv):
    p = PIDS[0]
    times = ckpt.suspend(p)
    assert set(times) == {"lock", "checkpoint", "rss_before", "rss_checkpointed"}
    assert all(t >= 0 for t in times.values())      # seconds, and bytes (test_checkpoint_record)
    assert state_of(drv, p) == "checkpointed"
    times = ckpt.resume(p)
    assert set(times) == {"restore", "unlock", "rss_after"} and all(t >= 0 for t in times.values())
    assert state_of(drv, p) == "running"
    assert drv.calls() == [("lock", p), ("checkpoint", p), ("restore", p), ("unlock", p)]


def test_every_process_is_locked_before_any_is_checkpointed(drv):
    a, b, c = PIDS
    ckpt.suspend([a, b, c])
    assert drv.calls() == [("lock", a), ("lock", b), ("lock", c),
                           ("checkpoint", a), ("checkpoint", b), ("checkpoint", c)]
    drv.log.clear()
    ckpt.resume((c, b, a))
    assert drv.calls() == [("restore", c), ("restore", b), ("restore", a),
                           ("unlock", c), ("unlock", b), ("unlock", a)]
    assert all(state_of(drv, p) == "running" for p in PIDS)


def test_a_failed_first_lock_changes_nothing(drv):
    p = PIDS[0]
    drv.fail[("lock", p)] = NOT_SUPPORTED
    with pytest.raises(MetraleError, match=r"^lock of pid \d+ failed: CUDA_ERROR_NOT_SUPPORTED; "
                                           r"the process is in state running$"):
        ckpt.suspend(PIDS)
    assert drv.calls() == [("lock", p)]


def test_a_failed_lock_unlocks_the_processes_locked_before(drv):
    a, b, c = PIDS
    drv.fail[("lock", b)] = NOT_SUPPORTED
    with pytest.raises(MetraleError) as e:
        ckpt.suspend(PIDS)
    assert str(e.value).startswith(f"suspend: lock of pid {b} failed: CUDA_ERROR_NOT_SUPPORTED")
    assert str(e.value).endswith(f"afterwards: {a}: running; {b}: running")
    assert drv.calls() == [("lock", a), ("lock", b), ("unlock", a)]
    assert all(state_of(drv, p) == "running" for p in PIDS)


def test_a_failed_checkpoint_brings_every_process_back(drv):
    a, b, c = PIDS
    drv.fail[("checkpoint", b)] = NOT_SUPPORTED
    with pytest.raises(MetraleError) as e:
        ckpt.suspend(PIDS)
    msg = str(e.value)
    assert msg.startswith(f"suspend: checkpoint of pid {b} failed: CUDA_ERROR_NOT_SUPPORTED; "
                          "the process is in state locked; afterwards: ")
    assert msg.endswith(f"{a}: running; {b}: running; {c}: running")
    assert drv.calls()[:5] == [("lock", a), ("lock", b), ("lock", c), ("checkpoint", a),
                               ("checkpoint", b)]
    assert sorted(drv.calls()[5:]) == sorted([("restore", a), ("unlock", a), ("unlock", b),
                                              ("unlock", c)])
    assert all(state_of(drv, p) == "running" for p in PIDS)


def test_a_checkpoint_that_hangs_leaves_that_process_alone(drv):
    a, b, c = PIDS
    drv.block[("checkpoint", b)] = ev = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(MetraleError) as e:
        ckpt.suspend(PIDS, timeout=0.3)
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert f"checkpoint of pid {b} did not finish within 0.3 s; the process is in state " \
           "locked" in msg
    assert msg.endswith(f"afterwards: {a}: running; {b}: left as it is (its call did not "
                        f"return); {c}: running")
    assert ("unlock", b) not in drv.calls() and state_of(drv, b) == "locked"
    ev.set()


def test_a_failed_restore_does_not_keep_the_others_locked(drv):
    a, b, c = PIDS
    ckpt.suspend(PIDS)
    drv.fail[("restore", b)] = NOT_SUPPORTED
    with pytest.raises(MetraleError) as e:
        ckpt.resume(PIDS)
    msg = str(e.value)
    assert msg.startswith(f"resume: restore of pid {b} failed: CUDA_ERROR_NOT_SUPPORTED")
    assert msg.endswith(f"afterwards: {a}: running; {b}: checkpointed; {c}: running")
    assert [state_of(drv, p) for p in PIDS] == ["running", "checkpointed", "running"]


def test_suspend_of_a_process_already_locked_is_refused_and_left_locked(drv):
    p = PIDS[0]
    ckpt.lock(p)
    with pytest.raises(MetraleError, match="CUDA_ERROR_ILLEGAL_STATE; the process is in state "
                                           "locked$"):
        ckpt.suspend(p)
    assert state_of(drv, p) == "locked"     # someone else's lock is not undone


# -- the driver: loading, versions, structs --------------------------------------------


class FakeLib:
    """A libcuda stand-in for _CudaDriver: ctypes-style functions taking byref
    arguments; `calls` names the checkpoint calls it has."""

    def __init__(self, api, calls=ckdriver._CALLS, init=SUCCESS):
        self.api, self.init, self.seen = api, init, []
        for name in calls:
            setattr(self, name, self._fn(name))

    def _fn(self, name):
        def fn(pid, arg):
            self.seen.append((name, pid, arg))
            return SUCCESS
        return fn

    def cuDriverGetVersion(self, out):
        out._obj.value = self.api
        return SUCCESS

    def cuInit(self, flags):
        return self.init

    def cuGetErrorName(self, code, out):
        out._obj.value = NAMES.get(code, "?").encode()
        return SUCCESS


def test_a_driver_without_the_calls_is_too_old():
    with pytest.raises(MetraleError) as e:
        ckdriver._CudaDriver(FakeLib(12040, calls=()), "550.54.15")
    msg = str(e.value)
    assert "branch 570 or newer (CUDA 12.8)" in msg and "driver 550.54.15 (CUDA 12.4)" in msg
    assert "cuCheckpointProcessLock" in msg
    with pytest.raises(MetraleError, match=r"a driver for CUDA 12.6, without "
                                           r"cuCheckpointProcessRestore$"):
        ckdriver._CudaDriver(FakeLib(12060, calls=ckdriver._CALLS[:4] + ckdriver._CALLS[5:]))


def test_a_driver_that_reports_an_older_api_is_too_old():
    # the symbols alone are not enough: the API version must be 12.8 or newer
    with pytest.raises(MetraleError, match="570 or newer"):
        ckdriver._CudaDriver(FakeLib(12070))


def test_a_driver_that_does_not_initialize_is_named():
    with pytest.raises(MetraleError, match="cuInit failed: CUDA_ERROR_NOT_SUPPORTED"):
        ckdriver._CudaDriver(FakeLib(13000, init=NOT_SUPPORTED))


def test_the_driver_passes_its_arguments_laid_out_as_cuda_h():
    lib = FakeLib(13000)
    d = ckdriver._CudaDriver(lib, "580.1")
    assert d.lock(42, 1234) == SUCCESS
    name, pid, ref = lib.seen[-1]
    assert (name, pid, ref._obj.timeoutMs, ref._obj.reserved0) == \
           ("cuCheckpointProcessLock", 42, 1234, 0)
    assert list(ref._obj.reserved1) == [0] * 7
    assert d.checkpoint(42) == SUCCESS and lib.seen[-1][2] is None
    assert d.unlock(42) == SUCCESS and lib.seen[-1][2] is None
    assert d.restore(42, None) == SUCCESS and lib.seen[-1][2] is None
    pairs = [(bytes(range(16)), bytes(range(16, 32))), (b"\1" * 16, b"\2" * 16)]
    assert d.restore(42, pairs) == SUCCESS
    args = lib.seen[-1][2]._obj
    assert args.gpuPairsCount == 2
    got = [(bytes(args.gpuPairs[i].oldUuid), bytes(args.gpuPairs[i].newUuid)) for i in range(2)]
    assert got == pairs and bytes(args)[12:] == b"\0" * 52      # reserved, reserved1 zeroed
    assert d.error_name(NOT_READY) == "CUDA_ERROR_NOT_READY"


def test_gpu_map_needs_driver_580():
    d = ckdriver._CudaDriver(FakeLib(12080), "570.86.10")
    assert d.restore(1, None) == SUCCESS
    with pytest.raises(MetraleError, match=r"gpu_map needs an NVIDIA driver of branch 580 or "
                                           r"newer \(CUDA 13.0\); this is driver 570.86.10 "
                                           r"\(CUDA 12.8\)"):
        d.restore(1, [(b"\0" * 16, b"\1" * 16)])


def test_driver_info(monkeypatch):
    d = ckdriver._CudaDriver(FakeLib(12090), "575.51.03")
    monkeypatch.setattr(ckdriver, "_driver", lambda: d)
    assert ckpt.driver_info() == {"driver": "575.51.03", "cuda": 12090, "gpu_map": False}


# The layouts of cuda.h (CUDA 13.0), as (field, offset) and size; worked out
# by hand from its declarations on a 64-bit Linux ABI.
LAYOUTS = {
    "lock": (64, [("timeoutMs", 0), ("reserved0", 4), ("reserved1", 8)]),
    "restore": (64, [("gpuPairs", 0), ("gpuPairsCount", 8), ("reserved", 12),
                     ("reserved1", 56)]),
    "pair": (32, [("oldUuid", 0), ("newUuid", 16)]),
}
HEADER_NAMES = {"lock": "CUcheckpointLockArgs_st", "restore": "CUcheckpointRestoreArgs_st",
                "pair": "CUcheckpointGpuPair_st"}


def test_the_structs_have_the_layout_of_cuda_h():
    structs = ckdriver._structs(ctypes)
    for key, (size, fields) in LAYOUTS.items():
        cls = structs[key]
        assert ctypes.sizeof(cls) == size, key
        assert [(name, getattr(cls, name).offset) for name, _ in fields] == fields, key


def _headers():
    found = [pathlib.Path("/usr/local/cuda/include/cuda.h")]
    for root in sys.path:
        found.append(pathlib.Path(root) / "nvidia" / "cu13" / "include" / "cuda.h")
    return [p for p in found if p.is_file()]


@pytest.mark.skipif(not _headers(), reason="no cuda.h here to compare with")
def test_the_structs_name_the_fields_of_the_header():
    # the field order in the installed header, so a changed header fails here
    text = _headers()[0].read_text(errors="replace")
    for key, (_, fields) in LAYOUTS.items():
        m = re.search(r"typedef struct " + HEADER_NAMES[key] + r" \{(.*?)\}", text, re.S)
        assert m, HEADER_NAMES[key]
        body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
        names = re.findall(r"(\w+)\s*(?:\[[^\]]*\])?\s*;", body)
        assert names == [f for f, _ in fields], (key, names)
    enum = re.search(r"typedef enum CUprocessState_enum \{(.*?)\}", text, re.S).group(1)
    names = re.findall(r"CU_PROCESS_STATE_(\w+)", re.sub(r"/\*.*?\*/", "", enum, flags=re.S))
    assert [n.lower() for n in names] == list(ckpt.STATES)


def test_no_driver_library_is_named(monkeypatch):
    monkeypatch.setattr(ckdriver, "_loaded", None)
    monkeypatch.setattr(ckdriver, "_LIBCUDA", "libmetrale-no-such-driver.so.1")
    with pytest.raises(MetraleError, match=r"needs the NVIDIA driver \(libmetrale-no-such-driver"
                                           r"\.so\.1 did not load"):
        ckpt.state(os.getpid())
    assert ckdriver._loaded is None


def test_not_linux_is_named(monkeypatch):
    monkeypatch.setattr(ckdriver, "_loaded", None)
    monkeypatch.setattr(ckdriver.sys, "platform", "darwin")
    with pytest.raises(MetraleError, match="Linux-only"):
        ckpt.driver_info()


# -- prepare and finish: the engine's shared arenas ------------------------------------


class StandInArena:
    """The peer-detaching interface of a BufferArena (detach_peers,
    attach_peers, peers_detached), logging into a shared list."""

    def __init__(self, name, log, shared=True, backend=None, committed=0):
        self.name, self.log, self.shared, self._backend = name, log, shared, backend
        self.detached = False
        self.fail = None
        self.committed = committed

    def backend(self):
        return self._backend

    def memory_stats(self):
        return {"committed_bytes": self.committed, "pool_committed_bytes": 0, "kept_bytes": 0,
                "offloaded_bytes": 0, "pool_offloaded_bytes": 0}

    def detach_peers(self):
        self.log.append(("detach", self.name))
        if self.fail == "detach":
            raise MetraleError(f"{self.name}: detach failed")
        if self.shared:
            self.detached = True

    def attach_peers(self, timeout=60.0):
        self.log.append(("attach", self.name, timeout))
        if self.fail == "attach":
            raise MetraleError(f"{self.name}: attach failed")
        self.detached = False

    def peers_detached(self):
        return self.detached


@pytest.fixture
def arenas(monkeypatch):
    log = []
    live = [StandInArena("a", log), StandInArena("b", log), StandInArena("plain", log, False)]
    monkeypatch.setattr(metrale.tp, "shared_arenas", lambda: list(live))
    return live, log


def test_prepare_detaches_every_shared_arena_and_finish_attaches_them(arenas):
    (a, b, plain), log = arenas
    assert ckpt.prepare().arenas == (a, b)
    assert log == [("detach", "a"), ("detach", "b"), ("detach", "plain")]
    assert ckpt.prepare().arenas == (a, b)          # already detached: not again
    assert log[3:] == [("detach", "plain")]
    log.clear()
    assert ckpt.finish(timeout=7.5) == [a, b]
    assert log == [("attach", "a", 7.5), ("attach", "b", 7.5)]
    assert ckpt.finish() == [] and not a.detached and not b.detached


def test_prepare_and_finish_take_the_arenas_given(arenas):
    (a, b, plain), log = arenas
    assert ckpt.prepare([b]).arenas == (b,) and log == [("detach", "b")]
    assert ckpt.finish((a, b)) == [b] and log[1:] == [("attach", "b", 60.0)]


def test_a_failed_detach_leaves_the_others_for_finish(arenas):
    (a, b, plain), log = arenas
    b.fail = "detach"
    with pytest.raises(MetraleError, match="b: detach failed"):
        ckpt.prepare()
    assert a.detached and not b.detached
    assert ckpt.finish() == [a]


def test_a_failed_attach_is_raised(arenas):
    (a, b, plain), log = arenas
    ckpt.prepare()
    a.fail = "attach"
    with pytest.raises(MetraleError, match="a: attach failed"):
        ckpt.finish()


def test_prepare_and_finish_check_their_arguments(arenas):
    with pytest.raises(TypeError, match="arenas must be an iterable"):
        ckpt.prepare(3)
    with pytest.raises(TypeError, match="arenas must be an iterable"):
        ckpt.finish("ab")
    with pytest.raises(TypeError, match=r"arenas: object has no detach_peers\(\)"):
        ckpt.prepare([object()])
    assert arenas[1] == []


def test_a_locked_process_refuses_prepare_and_finish_of_device_arenas(monkeypatch, drv):
    # A device arena's detach and attach make CUDA calls, which block for good
    # in a locked process: refused instead (host arenas need no driver).
    from metrale._backends._backend import Backend
    log = []
    dev = StandInArena("dev", log, backend=Backend())
    host = StandInArena("host", log, backend=metrale.HostBackend())
    drv.states[os.getpid()] = LOCKED
    with pytest.raises(MetraleError, match="prepare: this process is in state locked"):
        ckpt.prepare([host, dev])
    assert log == []
    assert ckpt.prepare([host]).arenas == (host,)
    drv.states[os.getpid()] = CHECKPOINTED
    dev.detached = True
    with pytest.raises(MetraleError, match="finish: this process is in state checkpointed; its "
                                           "CUDA calls block until it is restored and unlocked"):
        ckpt.finish([dev])
    drv.states[os.getpid()] = RUNNING
    assert ckpt.finish([dev, host]) == [dev, host]


def test_no_driver_does_not_stop_prepare(monkeypatch):
    # a process that cannot be checkpointed cannot be locked either
    from metrale._backends._backend import Backend

    def no_driver():
        raise MetraleError("no driver here")
    monkeypatch.setattr(ckdriver, "_driver", no_driver)
    log = []
    dev = StandInArena("dev", log, backend=Backend())
    assert ckpt.prepare([dev]).arenas == (dev,) and ckpt.finish([dev]) == [dev]


# -- prepare and finish on real shared arenas (host backend, two ranks) --------------


def _detach_attach_rank(rank, size, path):
    """Two shared arenas per rank (attach is collective per arena, so finish()
    must take them in the same order on every rank): detach, attach again,
    then read each peer's sentinel through the same pointers as before."""
    from metrale import BufferArena, HostBackend
    from helpers import COMPACT, FileGroup, Mem
    import numpy as np
    gpu, other = HostBackend(), 1 - rank
    arenas = [BufferArena.new(COMPACT, 64, 256, 16, 4, gpu, group=FileGroup(f"{path}/g{i}", rank,
                                                                            size))
              for i in range(2)]
    for i, a in enumerate(arenas):
        Mem(a, gpu).fill("hidden_states", 10 * i + rank + 1)
    ptrs = [a.peer(other).hidden_states() for a in arenas]

    def barrier(name):
        FileGroup(f"{path}/{name}", rank, size).all_gather_object([None] * size, name)

    barrier("filled")
    detached = ckpt.prepare().arenas
    assert sorted(map(id, detached)) == sorted(map(id, arenas))
    assert all(a.peers_detached() for a in arenas)
    barrier("prepared")
    assert sorted(map(id, ckpt.finish(timeout=20))) == sorted(map(id, arenas))
    ok = []
    for i, (a, p) in enumerate(zip(arenas, ptrs)):
        assert not a.peers_detached() and a.peer(other).hidden_states() == p
        n = a.sizes().hidden_states
        got = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(p))
        ok.append(bool((got == 10 * i + other + 1).all()))
    barrier("read")
    for a in arenas:
        a.release()
    return ok


@pytest.mark.skipif(not hasattr(metrale.BufferArena, "detach_peers"),
                    reason="BufferArena.detach_peers is not in this build")
def test_prepare_and_finish_on_shared_host_arenas(tmp_path):
    from helpers import run_ranks
    for sub in ("g0", "g1", "filled", "prepared", "read"):
        (tmp_path / sub).mkdir()
    assert run_ranks(_detach_attach_rank, 2, 120, (str(tmp_path),)) == [[True, True]] * 2


# -- prepare(sleep=...): the arenas that are not shared sleep through a checkpoint ---------

@pytest.fixture(autouse=True)
def _own_sleepers(monkeypatch):
    # Each test its own record of the arenas prepare put to sleep.
    import weakref
    monkeypatch.setattr(ckpt, "_SLEPT", weakref.WeakKeyDictionary())


def _pooled_arena(gpu):
    from helpers import _reserved
    a = _reserved(gpu)
    pool = a.open_pool(8 * 4096)
    seg = pool.alloc(4096)
    ctypes.memset(seg, 0x7E, 4096)
    ctypes.memset(a.ptr("residual"), 0x3C, 4096)
    return a, seg


def _free(*pairs):
    for a, seg in pairs:
        a.pool.free(seg)
        a.release()


def test_prepare_sleeps_the_arenas_and_finish_wakes_them(arenas):
    (a, b, _), log = arenas
    gpu = metrale.HostBackend()
    x, xs = _pooled_arena(gpu)
    y, ys = _pooled_arena(gpu)
    done = ckpt.prepare([a, x, y], sleep=True).arenas
    assert done == (a, x, y) and x.is_sleeping() and y.is_sleeping()
    for r in (x, y):                            # nothing of them left on the device
        m = r.memory_stats()
        assert m["committed_bytes"] == m["pool_committed_bytes"] == 0
    assert ckpt.prepare([a, x, y], sleep=True).arenas == (a, x, y)    # asleep: not again
    assert ckpt.finish([x]) == [x] and not x.is_sleeping() and y.is_sleeping()
    assert ckpt.finish() == [y, a] and not y.is_sleeping()           # woken, then attached
    assert ckpt.finish() == []
    _free((x, xs), (y, ys))


def test_prepare_keeps_and_offloads_what_it_is_told(arenas):
    gpu = metrale.HostBackend()
    x, seg = _pooled_arena(gpu)
    ckpt.prepare([x], sleep={"offload": ["torch"], "keep": ["residual"]})
    assert x.memory_stats()["pool_offloaded_bytes"] == 4096
    assert ctypes.string_at(seg, 4) == b"\x7e" * 4          # readable while asleep
    assert ckpt.finish([x]) == [x]
    assert ctypes.string_at(seg, 4096) == b"\x7e" * 4096
    assert ctypes.string_at(x.ptr("residual"), 4096) == b"\x3c" * 4096
    _free((x, seg))


def test_one_mapping_serves_arenas_with_and_without_a_pool(arenas):
    # "torch" goes only to an arena with a pool; names given as an iterator
    # serve every arena, not the first alone.
    from helpers import _reserved
    gpu = metrale.HostBackend()
    x, seg = _pooled_arena(gpu)
    y = _reserved(gpu)
    ctypes.memset(y.ptr("residual"), 0x5D, 4096)
    ckpt.prepare([x, y], sleep={"offload": iter(["torch", "residual"])})
    assert x.is_sleeping() and y.is_sleeping()
    assert x.memory_stats()["pool_offloaded_bytes"] == 4096
    assert y.memory_stats()["offloaded_bytes"] == x.memory_stats()["offloaded_bytes"] > 0
    assert ckpt.finish() == [x, y]
    assert ctypes.string_at(y.ptr("residual"), 4096) == b"\x5d" * 4096
    assert ctypes.string_at(seg, 4096) == b"\x7e" * 4096
    y.release()
    _free((x, seg))


def test_prepare_checks_sleep_before_changing_anything(arenas):
    (a, b, _), log = arenas
    gpu = metrale.HostBackend()
    x, seg = _pooled_arena(gpu)
    for bad, exc, what in (("yes", TypeError, "sleep must be a bool or a mapping"),
                           (3, TypeError, "sleep must be"),
                           ({"keep": [], "nope": []}, ValueError, "sleep: unknown key.*'nope'"),
                           ({"keep": 3}, TypeError, "sleep: keep must be a buffer name")):
        with pytest.raises(exc, match=what):
            ckpt.prepare([a, x], sleep=bad)
    assert log == [] and not x.is_sleeping()
    _free((x, seg))


def test_a_sleep_refused_stops_prepare_and_finish_undoes_the_rest(arenas):
    gpu = metrale.HostBackend()
    x, xs = _pooled_arena(gpu)
    y, ys = _pooled_arena(gpu)
    z, zs = _pooled_arena(gpu)
    view = y.view("residual")
    with pytest.raises(BufferError, match="residual"):
        ckpt.prepare([x, y, z], sleep=True)
    assert x.is_sleeping() and not y.is_sleeping() and not z.is_sleeping()
    with pytest.raises(ValueError, match="offload: "):       # a name not its buffer's
        ckpt.prepare([z], sleep={"offload": ["nope"]})
    assert not z.is_sleeping()
    assert ckpt.finish() == [x] and not x.is_sleeping()
    del view
    _free((x, xs), (y, ys), (z, zs))


def test_a_failed_wake_is_raised_after_the_others_and_tried_again():
    from metrale.testing import FaultyBackend
    from helpers import _reserved
    gpu = FaultyBackend()
    x, y = _reserved(gpu), _reserved(gpu)
    assert ckpt.prepare([x, y], sleep=True).arenas == (x, y)
    gpu.inject_fault("create")                 # x's wake maps no memory
    with pytest.raises(metrale.OutOfMemoryError):
        ckpt.finish([x, y])
    assert x.is_sleeping() and not y.is_sleeping()
    assert ckpt.finish([x, y]) == [x] and not x.is_sleeping()
    x.release()
    y.release()


def test_the_default_set_is_every_reserved_arena_awake():
    # In a fresh interpreter: the process's own arenas and nothing else.
    code = """if True:
        import metrale, metrale.checkpoint as ckpt
        from metrale import BufferArena, ModelConfig
        cfg, gpu = ModelConfig.preset("qwen3-30b-a3b"), metrale.HostBackend()
        lim = (64, 512, 16, 8)
        first = BufferArena.new(cfg, *lim, gpu, reserve=lim)
        plain = BufferArena.new(cfg, *lim, gpu)
        asleep = BufferArena.new(cfg, *lim, gpu, reserve=lim)
        asleep.sleep()
        last = BufferArena.new(cfg, *lim, gpu, reserve=lim)
        gone = BufferArena.new(cfg, *lim, gpu, reserve=lim)
        gone.release()
        assert ckpt.prepare().arenas == ()               # no sleep asked: none sleeps
        assert ckpt.prepare(sleep=True).arenas == (first, last)
        # asleep by that prepare: in the default set of the next one too
        assert ckpt.prepare(sleep=True).arenas == (first, last)
        assert ckpt.finish() == [first, last] and asleep.is_sleeping()
        print("ok")
    """
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
