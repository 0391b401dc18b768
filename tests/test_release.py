"""Release of an arena's memory against operations in flight (other
threads, re-entrant calls, reshapes, a fork) and at interpreter exit.  The
contract: no call ever touches a freed slab, release refuses (MetraleError
for running operations) and frees nothing, a wait always ends, and once
nothing is live it frees at once.  Views and their exports:
test_view_lifetime.py; the cyclic collector: test_collector.py."""

import logging
import subprocess
import sys
import threading

import pytest

from metrale import BufferSizes, MetraleError

from metrale.testing import FaultyBackend

from helpers import PRESET, HookStream, _reserved, live_counts, new, run_watched


# Each operation that touches the slab, and the kind of backend call it makes
# while it holds the arena: FaultyBackend.inject_call runs test code there.
# (No argument of an operation runs code while it holds the arena.)
OPERATIONS = {
    "zero_all": (lambda a, g, s: a.zero_all(g, s), "memset"),
    "zero_all_rows": (lambda a, g, s: a.zero_all_rows(g, s, 3), "memset"),
    "zero_prefill_essentials": (lambda a, g, s: a.zero_prefill_essentials(g, s), "memset"),
    "debug_buffer_checksum": (lambda a, g, s: a.debug_buffer_checksum(g, s, "t"), "d2h"),
}


def _run(op, arena, gpu, stream=0):
    return OPERATIONS[op][0](arena, gpu, stream)


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_release_inside_an_operation_is_refused(op):
    """The same thread releases while the operation holds the slab (code a
    finalizer could run): waiting would wait for itself, so it is refused."""
    gpu = FaultyBackend()
    base = live_counts(gpu)
    arena = new(gpu, m=16)
    seen = []

    def hook():
        with pytest.raises(MetraleError, match="from inside an operation") as e:
            arena.release(gpu)
        seen.append(str(e.value))

    gpu.inject_call(OPERATIONS[op][1], hook)
    _run(op, arena, gpu)
    assert len(seen) == 1 and not arena.is_released() and arena.hidden_states() != 0
    arena.release(gpu)                           # nothing running now: frees at once
    assert arena.is_released() and live_counts(gpu) == base


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_an_argument_runs_before_the_operation_holds_the_arena(backend, op):
    """A stream object's protocol method is user code: it runs before the
    operation takes the arena, so a release there frees at once and the
    operation then refuses."""
    gpu = backend
    base = live_counts(gpu)
    arena = new(gpu, m=16)
    with pytest.raises(MetraleError, match="released"):
        _run(op, arena, gpu, HookStream(lambda: arena.release(gpu)))
    assert arena.is_released() and live_counts(gpu) == base


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_release_from_another_thread_waits_for_the_operation(op):
    """Another thread releases while the operation is in flight: new operations
    are refused at once, the slab stays until the running one returns, then
    it is freed."""
    import time
    gpu = FaultyBackend()
    base = live_counts(gpu)
    arena = new(gpu, m=16)
    other = threading.Thread(target=arena.release, args=(gpu,))
    inside = {}

    def hook():
        other.start()
        while not arena.is_released():       # the release has begun and now waits
            time.sleep(0.001)
        time.sleep(0.01)
        inside["ptr"] = arena.hidden_states()
        inside["live"] = live_counts(gpu)
        with pytest.raises(MetraleError, match="released"):
            arena.zero_all(gpu, 0)           # nothing new starts

    gpu.inject_call(OPERATIONS[op][1], hook)
    _run(op, arena, gpu)
    other.join()
    assert inside["ptr"] != 0 and inside["live"] != base   # not freed under the operation
    assert arena.hidden_states() == 0 and live_counts(gpu) == base


def test_release_in_a_checksum_logging_handler():
    """ARENA.md §7 logs one record per buffer: the records are logged after
    the arena is left, so a handler that releases frees it at once, and every
    record still carries the sums read from the live slab."""
    from metrale import HostBackend
    gpu = HostBackend()
    arena = new(gpu, m=16)
    records = []

    class Releasing(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
            arena.release(gpu)

    log = logging.getLogger("metrale")
    h = Releasing(logging.WARNING)
    log.addHandler(h)
    try:
        arena.debug_buffer_checksum(gpu, 0, "x")
    finally:
        log.removeHandler(h)
    assert len(records) == 16 and gpu.d2h_count == 16
    assert all(r.startswith("METRALE_BUF_CKSUM[x] ") for r in records)
    assert arena.is_released() and gpu.live_alloc_count == 0


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_stress_release_against_a_running_loop(backend, op):
    """A thread runs `op` in a loop while this one releases: release waits for
    the call in flight, the loop then ends with 'released', nothing crashes
    or leaks."""
    gpu = backend
    base = live_counts(gpu)
    arena = new(gpu, m=64)
    call = OPERATIONS[op][0]
    started = threading.Event()
    out = {"calls": 0}
    log = logging.getLogger("metrale")
    level = log.level
    log.setLevel(logging.ERROR)                  # the checksum's records

    def loop():
        try:
            while True:
                call(arena, gpu, 0)
                out["calls"] += 1
                started.set()
        except MetraleError as e:
            out["stopped"] = str(e)
            started.set()

    t = threading.Thread(target=loop)
    t.start()
    try:
        started.wait()
        arena.release(gpu)
    finally:
        t.join()
        log.setLevel(level)
    assert out["stopped"] == "the buffer arena has been released"
    assert out["calls"] >= 1 and live_counts(gpu) == base


def test_nothing_starts_on_a_released_arena(backend):
    gpu = backend
    arena = new(gpu, m=16)
    arena.release(gpu)
    for name in OPERATIONS:
        with pytest.raises(MetraleError, match="released"):
            _run(name, arena, gpu)
    with pytest.raises(MetraleError, match="released"):
        arena.view("hidden_states", "uint8")
    with pytest.raises(MetraleError, match="slab is absent"):
        arena.take_ssm_rowwise_w_bf16(0)
    arena.release(gpu)                            # idempotent


# -- interpreter exit -----------------------------------------------------------------------

EXIT_SCRIPT = """
import sys
import metrale
gpu = metrale.HostBackend()
cfg = metrale.ModelConfig.preset("qwen3-next-80b")
arena = metrale.BufferArena.new(cfg, 4, 4096, 16, 32, gpu)
view = arena.view("hidden_states", "uint8")
steps = arena.step_inputs()
ids = steps.token_ids
asleep = metrale.BufferArena.new(cfg, 4, 4096, 16, 32, gpu, reserve=(64, 4096, 16, 32))
asleep.sleep(keep=("hidden_states",))
class One:
    def rank(self): return 0
    def size(self): return 1
    def all_gather_object(self, out, obj): out[0] = obj
shared = metrale.BufferArena.new(cfg, 4, 4096, 16, 32, gpu, group=One())
class Holder:
    pass
h = Holder()
h.self = h              # a cycle: collected late in shutdown, after sys.meta_path is None
h.arena, h.view, h.steps, h.ids, h.asleep, h.shared = arena, view, steps, ids, asleep, shared
sys.modules.pop("warnings", None)
del arena, view, steps, ids, asleep, shared
"""


def test_unreleased_arena_at_interpreter_exit_is_quiet():
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Error" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_sizes_only_arena_has_nothing_to_hold():
    from metrale import BufferArena, HostBackend
    from metrale.sizes import BUFFER_NAMES
    gpu = HostBackend()
    zero = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0))
    arena = BufferArena.from_sizes(PRESET, zero, 1, 0, gpu)
    v = arena.view("hidden_states", "uint8", 0)       # a NULL buffer: an empty view
    assert v.ptr == 0 and v.shape == (0,)
    with pytest.raises(MetraleError, match="hidden_states is NULL"):
        arena.view("hidden_states", "uint8", 1)
    _ = pytest.raises(BufferError, arena.release, gpu)
    del v
    arena.release(gpu)
    assert gpu.alloc_count == 0


# -- waits that end: no self-wait, no lost wake-up, interruptible ----------------------------
#
# Each scenario runs in a fresh process under a watchdog (helpers.run_watched):
# a hang fails the test instead of blocking the run.  Its reserved arena:
# helpers._reserved.


def _release_races_a_reshape(reshape):
    """An operation holds the arena; a reshape begins and waits for it; a
    release begins and waits for both.  When the operation returns, the
    reshape must run (not wait for itself), then the release free."""
    import time
    from helpers import blocked_operation, vm_counts
    gpu = FaultyBackend()
    arena = _reserved(gpu)
    op, go = blocked_operation(gpu, arena)
    call = {"resize": lambda: arena.resize(max_batch_tokens=512), "sleep": arena.sleep}[reshape]
    re = threading.Thread(target=call)
    re.start()
    time.sleep(0.05)                         # the reshape has begun and waits for the operation
    rel = threading.Thread(target=arena.release)
    rel.start()
    while not arena.is_released():           # the release has begun and waits too
        time.sleep(0.001)
    go.set()
    for t in (op, re, rel):
        t.join(30)
        assert not t.is_alive(), "a thread is stuck"
    return vm_counts(gpu), gpu.live_host_alloc_count


@pytest.mark.parametrize("reshape", ["resize", "sleep"])
def test_release_racing_a_reshape_on_another_thread_ends(reshape):
    assert run_watched(_release_races_a_reshape, reshape) == ((0, 0, 0), 0)


def _release_racing_reshapes_stress(rounds):
    """Threads zero, resize, sleep and wake in a loop while another releases at
    a random moment (so a release often lands while a reshape waits for an
    operation): every thread ends, nothing stays reserved or mapped."""
    import random
    import time
    from helpers import vm_counts
    rng = random.Random(7)
    for _ in range(rounds):
        gpu = FaultyBackend()
        arena = _reserved(gpu)

        def zero():
            while True:
                try:
                    arena.zero_all()
                except MetraleError as e:
                    if "released" in str(e):
                        return

        def reshape():
            k = 0
            while True:
                try:
                    if k % 3 == 0:
                        arena.resize(max_batch_tokens=64 if k % 2 else 512)
                    elif k % 3 == 1:
                        arena.sleep()
                    else:
                        arena.wake()
                except MetraleError as e:
                    if "released" in str(e):
                        return
                k += 1

        ts = [threading.Thread(target=reshape) for _ in range(2)] + [threading.Thread(target=zero)]
        [t.start() for t in ts]
        time.sleep(rng.random() * 0.01)
        arena.release()
        for t in ts:
            t.join(30)
            assert not t.is_alive(), "a reshape never ended"
        assert vm_counts(gpu) == (0, 0, 0)
    return True


def test_release_racing_reshapes_stress():
    assert run_watched(_release_racing_reshapes_stress, 30, timeout=120)


@pytest.mark.parametrize("reshape", ["resize", "sleep", "wake"])
def test_release_inside_a_reshape_on_the_same_thread_is_refused(reshape):
    """User code that runs inside a reshape (a finalizer during one of its
    allocations; here the backend's hook) and releases the arena is refused:
    waiting would wait for itself.  The reshape then completes."""
    from helpers import vm_counts
    gpu = FaultyBackend()
    arena = _reserved(gpu)
    if reshape == "wake":
        arena.sleep()
    seen = []

    def hook():
        with pytest.raises(MetraleError, match="inside a resize, sleep, wake or export"):
            arena.release()
        seen.append(reshape)

    gpu.inject_call("unmap" if reshape == "sleep" else "map", hook)
    {"resize": lambda: arena.resize(max_batch_tokens=512), "sleep": arena.sleep,
     "wake": arena.wake}[reshape]()
    assert seen == [reshape] and not arena.is_released()
    assert arena.is_sleeping() == (reshape == "sleep")
    arena.release()
    assert vm_counts(gpu) == (0, 0, 0)


class _ReleasingIndex:
    def __init__(self, arena, value):
        self.arena, self.value = arena, value

    def __index__(self):
        self.arena.release()
        return self.value


def test_an_argument_that_releases_runs_before_a_reshape_holds_the_arena():
    from helpers import vm_counts
    gpu = FaultyBackend()
    arena = _reserved(gpu)
    with pytest.raises(MetraleError, match="released"):
        arena.resize(max_batch_tokens=_ReleasingIndex(arena, 512))
    assert arena.is_released() and vm_counts(gpu) == (0, 0, 0)


def _interrupted_wait(what):
    """Ctrl-C while `what` waits for an operation in flight: KeyboardInterrupt
    surfaces within a wait slice, and the arena is as before the call."""
    import signal
    import time
    from helpers import blocked_operation
    # Python installs its KeyboardInterrupt handler only where SIGINT is not
    # ignored at start-up, and a job started in the background of a
    # non-interactive shell (a CI runner's) inherits it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    gpu = FaultyBackend()
    arena = _reserved(gpu)
    op, go = blocked_operation(gpu, arena)
    main = threading.main_thread().ident
    timer = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        if what == "release":
            arena.release()
        else:
            arena.resize(max_batch_tokens=512)
    except KeyboardInterrupt:
        took = time.monotonic() - t0
    else:
        raise AssertionError(f"{what} returned while an operation held the arena")
    state = (arena.is_released(), arena.is_sleeping(), arena.max_batch_tokens())
    go.set()
    op.join(30)
    arena.zero_all()                         # the arena works as before
    arena.resize(max_batch_tokens=512)
    arena.release()
    return took, state


@pytest.mark.parametrize("what", ["release", "resize"])
def test_ctrl_c_interrupts_a_wait_and_leaves_the_arena_as_it_was(what):
    took, state = run_watched(_interrupted_wait, what)
    assert took < 5 and state == (False, False, 64)


# -- fork ----------------------------------------------------------------------------------

def _wait_child(pid, timeout=30):
    """The forked child's wait status; a child alive past `timeout` seconds
    is killed and fails the test (it hung)."""
    import os
    import time
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung")
        time.sleep(0.01)


def _fork_while_held(during):
    """fork() while another thread is inside an operation or a reshape: the
    child's release returns at once (those threads do not exist there) and
    everything else refuses; the parent goes on as if nothing happened."""
    import os
    import warnings
    from helpers import blocked_operation, vm_counts
    gpu = FaultyBackend()
    arena = _reserved(gpu)
    if during == "operation":
        t, go = blocked_operation(gpu, arena)
    else:                                    # a resize held inside its mapping
        inside, go = threading.Event(), threading.Event()
        gpu.inject_call("map", lambda: (inside.set(), go.wait(60)))
        t = threading.Thread(target=arena.resize, kwargs={"max_batch_tokens": 512})
        t.start()
        assert inside.wait(60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)     # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for call in (arena.zero_all, lambda: arena.view("hidden_states", "uint8"),
                         arena.sleep):
                try:
                    call()
                except MetraleError as e:
                    assert "fork" in str(e), e
                else:
                    raise AssertionError("a call on an inherited arena ran")
            arena.release()                  # returns: nothing of the parent's to wait for
            assert arena.is_released() and arena.hidden_states() == 0
            code = 0
        finally:
            os._exit(code)
    status = _wait_child(pid)
    go.set()
    t.join(30)
    arena.zero_all()                         # the parent's arena is untouched
    arena.release()
    return os.waitstatus_to_exitcode(status), vm_counts(gpu)


@pytest.mark.parametrize("during", ["operation", "reshape"])
def test_a_forked_child_can_release_an_inherited_arena(during):
    assert run_watched(_fork_while_held, during) == (0, (0, 0, 0))


def _mapped_in_proc(lo, hi):
    """Whether any mapping of this process overlaps [lo, hi) (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            a, b = (int(x, 16) for x in line.split()[0].split("-"))
            if a < hi and lo < b:
                return True
    return False


def _fork_with_the_pool_held():
    """fork() while a thread is inside the pool, holding its lock (a mapping of
    a segment blocked), with a segment written: in the child every call on
    the pool and the arena refuses at once, without that lock, and release
    returns at once and gives the child's copy of the pool's range back; the
    parent's pool and its bytes are untouched."""
    import ctypes
    import os
    import warnings
    from helpers import vm_counts
    gpu = FaultyBackend()
    arena = _reserved(gpu)
    pool = arena.open_pool(64 * 4096)
    seg = pool.alloc(3 * 4096)
    ctypes.memset(seg, 0x5A, 3 * 4096)
    inside, go = threading.Event(), threading.Event()
    gpu.inject_call("map", lambda: (inside.set(), go.wait(60)))
    t = threading.Thread(target=pool.alloc, args=(4096,))
    t.start()
    assert inside.wait(60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)     # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            assert repr(pool) == "Pool(inherited across fork())"
            for call in (lambda: pool.alloc(4096), lambda: pool.free(seg), pool.trim, pool.stats,
                         pool.segments, pool.chunks, arena.close_pool, arena.memory_stats,
                         lambda: arena.sleep(offload=["torch"]), arena.summary):
                try:
                    call()
                except MetraleError as e:
                    assert "inherited across fork()" in str(e), e
                else:
                    raise AssertionError("a call on an inherited pool ran")
            base, n = pool.base, pool.nbytes
            assert _mapped_in_proc(base, base + n)
            arena.release()                  # a segment is held: the parent's, not the child's
            assert arena.is_released() and pool.closed and arena.pool is None
            assert not _mapped_in_proc(base, base + n)      # the child's copy is given back
            code = 0
        finally:
            os._exit(code)
    status = _wait_child(pid)
    go.set()
    t.join(30)
    assert ctypes.string_at(seg, 3 * 4096) == b"\x5a" * (3 * 4096)     # the parent's, untouched
    assert pool.stats()["segments"] == 2
    for p, _n in pool.segments():
        pool.free(p)
    arena.release()
    return os.waitstatus_to_exitcode(status), vm_counts(gpu)


def test_a_forked_child_can_release_an_inherited_pool_held_by_a_parent_thread():
    assert run_watched(_fork_with_the_pool_held) == (0, (0, 0, 0))
