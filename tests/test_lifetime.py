"""Lifetime of an arena's memory: release against operations in flight (other
threads, re-entrant calls), against live views and their exports, and at
interpreter exit.  The contract: no call ever touches a freed slab, release
refuses (BufferError for live views, MetraleError for running operations)
and frees nothing, and once nothing is live it frees at once."""

import logging
import subprocess
import sys
import threading

import pytest

from metrale import BufferSizes, MetraleError

from metrale.testing import FaultyBackend

from helpers import PRESET, Cycle, HookStream, live_counts, new, run_watched

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


# -- views and exports ----------------------------------------------------------------

def _refused(arena, gpu, *names):
    with pytest.raises(BufferError) as e:
        arena.release(gpu)
    msg = str(e.value)
    for name in names:
        assert name in msg
    assert not arena.is_released() and arena.hidden_states() != 0
    return msg


def test_live_view_blocks_release_until_dropped(backend):
    gpu = backend
    base = live_counts(gpu)
    arena = new(gpu, m=16)
    v = arena.view("hidden_states", "uint8")
    w = arena.view("hidden_states", "float32")
    x = arena.view("logits", "bfloat16", (4, 8))
    msg = _refused(arena, gpu, "hidden_states: 2 views", "logits: 1 view")
    assert "nothing was freed" in msg and live_counts(gpu) != base
    del v, w
    _refused(arena, gpu, "logits: 1 view")
    del x
    arena.release(gpu)
    assert live_counts(gpu) == base


def test_context_manager_exit_refuses_with_a_live_view():
    from metrale import HostBackend
    gpu = HostBackend()
    with pytest.raises(BufferError, match="residual"):
        with new(gpu, m=16) as arena:
            keep = arena.view("residual", "uint8")
    assert not arena.is_released()
    del keep
    arena.release(gpu)
    assert gpu.live_alloc_count == 0


def test_numpy_exports_keep_the_memory():
    np = pytest.importorskip("numpy")
    from metrale import HostBackend
    gpu = HostBackend()
    arena = new(gpu, m=16)
    a = np.asarray(arena.view("hidden_states", "float32"))        # __array_interface__
    b = np.from_dlpack(arena.view("residual", "uint8"))            # DLPack, consumed
    cap = arena.view("logits", "uint8").__dlpack__()               # DLPack, never consumed
    a[:] = 1.5
    _refused(arena, gpu, "hidden_states: 1 view", "residual: 1 view", "logits: 1 view")
    assert (a == 1.5).all() and b.sum() >= 0         # still readable: nothing was freed
    del a
    _refused(arena, gpu, "residual", "logits")
    del b
    _refused(arena, gpu, "logits")
    del cap                                          # the capsule's destructor drops the view
    arena.release(gpu)
    assert gpu.live_alloc_count == 0


def test_views_on_another_thread_are_counted(backend):
    gpu = backend
    arena = new(gpu, m=16)
    views = []
    ts = [threading.Thread(target=lambda: views.extend(arena.view("ssm_ba", "uint8")
                                                       for _ in range(200)))
          for _ in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    _refused(arena, gpu, "ssm_ba: 800 views")
    views.clear()
    arena.release(gpu)


def test_views_and_release_race():
    """Threads make and drop views while this one tries to release: release
    succeeds only with no view alive, a view is never made after it, and once
    the threads are done it succeeds."""
    from metrale import HostBackend
    gpu = HostBackend()
    arena = new(gpu, m=16)
    errors = []
    made = []

    def churn():
        for _ in range(2000):
            try:
                v = arena.view("hidden_states", "uint8", (16,))
            except MetraleError as e:
                if "released" not in str(e) and "release of the buffer arena is pending" not in str(e):
                    errors.append(e)
                return
            if v.ptr == 0 or arena.is_released():
                errors.append("a view of a released arena")
            made.append(1)
            del v

    ts = [threading.Thread(target=churn) for _ in range(3)]
    [t.start() for t in ts]
    while any(t.is_alive() for t in ts) and not arena.is_released():
        try:
            arena.release(gpu)
        except BufferError:
            pass
    [t.join() for t in ts]
    arena.release(gpu)
    assert not errors and made and gpu.live_alloc_count == 0


def test_a_refused_release_stops_new_views_so_the_next_one_succeeds():
    """What a release is guaranteed: once refused for live views, no new view
    is made, so it succeeds as soon as the views alive then are gone, however
    busy other threads are making views."""
    from metrale import HostBackend
    gpu = HostBackend()
    arena = new(gpu, m=16)
    held = arena.view("residual", "uint8")
    with pytest.raises(BufferError, match="residual: 1 view"):
        arena.release(gpu)
    refusals = []

    def churn():
        for _ in range(200):
            try:
                arena.view("hidden_states", "uint8", (16,))
            except MetraleError as e:
                refusals.append(str(e))

    ts = [threading.Thread(target=churn) for _ in range(3)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert len(refusals) == 600 and all("pending" in r for r in refusals)
    arena.zero_all(gpu, 0)                       # operations still run meanwhile
    del held
    arena.release(gpu)
    assert arena.is_released() and gpu.live_alloc_count == 0


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
# a hang fails the test instead of blocking the run.

RESERVE = (512, 1024, 16, 16)


def _reserved(gpu):
    from metrale import BufferArena
    from helpers import COMPACT
    return BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, reserve=RESERVE)


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
        with pytest.raises(MetraleError, match="inside a resize, sleep or wake"):
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

def _fork_while_held(during):
    """fork() while another thread is inside an operation or a reshape: the
    child's release returns at once (those threads do not exist there) and
    everything else refuses; the parent goes on as if nothing happened."""
    import os
    import time
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
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung")
        time.sleep(0.01)
    go.set()
    t.join(30)
    arena.zero_all()                         # the parent's arena is untouched
    arena.release()
    return os.waitstatus_to_exitcode(status), vm_counts(gpu)


@pytest.mark.parametrize("during", ["operation", "reshape"])
def test_a_forked_child_can_release_an_inherited_arena(during):
    assert run_watched(_fork_while_held, during) == (0, (0, 0, 0))


# -- the cyclic collector ------------------------------------------------------------------
#
# Every extension class is put in a reference cycle (helpers.Cycle) and
# collected; what it owned must be given back.  Classes that own nothing the
# collector could clear first are listed with the reason.

def _walk_extension_classes():
    import importlib
    import pkgutil
    import metrale
    found = {}
    for m in pkgutil.iter_modules(metrale.__path__):
        if m.name == "__main__":
            continue
        try:
            mod = importlib.import_module(f"metrale.{m.name}")
        except ImportError:
            continue
        if not (getattr(mod, "__file__", "") or "").endswith(".so"):
            continue
        for obj in vars(mod).values():
            # cdef classes are static types; Python classes in a .pyx are heap types
            if isinstance(obj, type) and obj.__module__ == mod.__name__ \
                    and not obj.__flags__ & (1 << 9):
                found[obj.__name__] = obj
    return found


def _collect(**held):
    import gc
    Cycle(**held)
    del held
    gc.collect()


# Every kind of arena, each holding something else a collector could clear
# first: reserved chunks, kept host copies, host memory of an offload (asleep:
# mapped at the buffers' addresses too), a peer's memfds, guard bands, step
# inputs' staging.
GC_KINDS = ("plain", "reserved", "keep", "offload", "offload_awake", "shared", "debug", "step")


def _gc_arena(kind):
    """Build an arena of `kind`, leave it unreleased in a reference cycle, and
    collect it: what the backend and the process still hold afterwards."""
    import gc
    import warnings
    from metrale import BufferArena, HostBackend
    from helpers import COMPACT, OneRank, process_resources, vm_counts
    gpu = HostBackend()
    gc.collect()            # what earlier tests left in cycles goes first, not in the count
    before = process_resources()[0], process_resources()[2]
    if kind == "plain":
        arena = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu)
    elif kind == "shared":
        arena = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, group=OneRank())
    elif kind == "debug":
        arena = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, debug=True)
    else:
        arena = _reserved(gpu)
    if kind == "keep":
        arena.sleep(keep=("hidden_states", "logits"))
    elif kind.startswith("offload"):
        arena.sleep(offload=("hidden_states", "logits"), keep=("residual",))
        if kind == "offload_awake":
            arena.wake()
    step = arena.step_inputs(16) if kind == "step" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)      # unreleased, on purpose
        Cycle(arena=arena, gpu=gpu, step=step)
        del arena, step             # the cycle holds the only references now
        gc.collect()
    after = process_resources()[0], process_resources()[2]
    return (gpu.live_alloc_count, vm_counts(gpu), gpu.live_host_alloc_count,
            gpu.host_handle_count, gpu.host_mapped_bytes, after == before)


GIVEN_BACK = (0, (0, 0, 0), 0, 0, 0, True)


def test_every_kind_of_arena_collected_in_cycles_gives_everything_back():
    """Six rounds of every kind in one process: the collector clears what
    it finds in a different order from one collection to the next (the
    first of a fresh process happened to be clean while later ones leaked)."""
    got = {(r, kind): _gc_arena(kind) for r in range(6) for kind in GC_KINDS}
    assert {k: v for k, v in got.items() if v != GIVEN_BACK} == {}


def test_step_inputs_collected_in_a_cycle():
    import gc
    import warnings
    import weakref
    from metrale import HostBackend
    gpu = HostBackend()
    arena = new(gpu, m=16)
    ref = weakref.ref(arena)
    st = arena.step_inputs(257)
    ids = st.token_ids                     # a view: the staging lives while it does
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        _collect(st=st, arena=arena, gpu=gpu)
        del st, arena
        gc.collect()
    ids[:] = 3                             # still valid memory
    assert gpu.live_host_alloc_count == 1
    del ids
    gc.collect()
    assert ref() is None and gpu.live_host_alloc_count == 0 and gpu.live_alloc_count == 0


def test_step_inputs_dropped_unreleased_free_everything():
    """Views read, then dropped without release: freed by reference counting
    alone (no cycle runs through the views), and the arena with them."""
    import weakref
    from metrale import HostBackend
    gpu = HostBackend()
    arena = new(gpu, m=16)
    ref = weakref.ref(arena)
    for _ in range(200):
        st = arena.step_inputs(257)
        st.fill([1, 2, 3], positions=[4, 5, 6])
        del st
    assert gpu.live_host_alloc_count == 0 and gpu.host_alloc_count == 200
    arena.release()
    del arena
    assert ref() is None


def _cycle_cases():
    """Class name -> a function that builds instances in a cycle, collects
    them and returns what must hold afterwards (a bool), or the reason the
    class owns nothing the collector could clear before its finalizer."""
    from metrale import HostBackend, ScratchSpaceManager
    from metrale.testing import FaultyBackend as Faulty

    def arena_case():
        return all(_gc_arena(kind) == GIVEN_BACK for kind in GC_KINDS)

    def view_case():
        gpu = HostBackend()
        arena = new(gpu, m=16)
        _collect(v=arena.view("logits", "uint8"), arena=arena)
        arena.release()                    # the view is gone: release succeeds
        return gpu.live_alloc_count == 0

    def step_case():
        gpu = HostBackend()
        arena = new(gpu, m=16)
        st = arena.step_inputs(257)
        _collect(st=st, ids=st.token_ids, gpu=gpu)
        del st
        import gc
        gc.collect()
        arena.release()
        return gpu.live_host_alloc_count == 0

    def backend_case(cls):
        def case():
            gpu = cls()
            arena = _reserved(gpu)
            _collect(gpu=gpu, arena=arena)
            return True                    # no crash; the arena case checks the counts
        return case

    def peer_case():
        return _gc_arena("shared") == GIVEN_BACK

    def scratch_case():
        m = ScratchSpaceManager(4096, 2)
        s = m.get_scratch()
        a = s.get(16, "uint8")
        _collect(m=m, s=s, a=a)
        return True

    return {
        "BufferArena": arena_case, "ArenaView": view_case, "StepInputs": step_case,
        "_Staging": step_case, "PeerSlabs": peer_case,
        "HostBackend": backend_case(HostBackend), "FaultyBackend": backend_case(Faulty),
        "Backend": "abstract: no instance can hold memory",
        "CudaBackend": "frees through C fields only (no Python field in its finalizer); "
                       "the GPU run of this test covers it through the arena case",
        "FaultyCudaBackend": "a CudaBackend with a Faults: test_offload_cuda.py collects "
                             "arenas on it in cycles",
        "Faults": "owns nothing: the armed failures and calls of a testing backend",
        "SlabPlan": "owns nothing but C fields",
        "Held": "holds no Python object and is not tracked by the collector: nothing can clear it",
        "ArenaState": "BufferArena's base (no instance of its own): the arena case",
        "Reservation": "not tracked by the collector (its backend and Held rows); the arena's "
                       "finalizer frees it: the arena case collects reserved arenas",
        "SleepState": "not tracked by the collector (its backend, C records and Held rows); the "
                      "arena's finalizer frees it: the arena case collects sleeping arenas",
        "_Plan": "owns nothing: a parameter block of addresses and a list of tuples",
        "ArenaBuffers": "owns nothing; holds its arena, which holds nothing of it back",
        "ScratchSpaceManager": scratch_case, "ScratchSpace": scratch_case,
        "_TableRef": scratch_case, "_Region": scratch_case, "_Lease": scratch_case,
    }


def test_every_extension_class_survives_the_cyclic_collector():
    cases = _cycle_cases()
    found = _walk_extension_classes()
    assert set(found) == set(cases), f"classes without a case: {set(found) - set(cases)}"
    for name, case in cases.items():
        if callable(case):
            assert case(), name
