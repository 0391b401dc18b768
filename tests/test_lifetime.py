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

from helpers import PRESET, HookStream, live_counts, new

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
                if "released" not in str(e):
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


# -- interpreter exit -----------------------------------------------------------------------

EXIT_SCRIPT = """
import sys
import metrale
gpu = metrale.HostBackend()
arena = metrale.BufferArena.new(metrale.ModelConfig.preset("qwen3-next-80b"), 4, 4096, 16, 32, gpu)
view = arena.view("hidden_states", "uint8")
class Holder:
    pass
h = Holder()
h.self = h              # a cycle: collected late in shutdown, after sys.meta_path is None
h.arena, h.view = arena, view
sys.modules.pop("warnings", None)
del arena, view
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
