"""Every step of sleep, wake, resize and release under an injected fault at
that step (docs/stable-addresses.md, docs/lifetime.md): each kind of backend
operation fails at each of its occurrences in turn, over offload and keep,
fresh and in pieces, after a resize and while asleep, whole or one class at
a time (a partial sleep, a partial wake, a partial sleep after one).  Whatever fails, a
live view of an offloaded buffer stays readable with its bytes, the arena is
left in a state its documentation names, the kept and offloaded buffers come
back with their bytes once it is awake, it keeps working, and its release
gives everything back (host backend; the CUDA half is in test_offload_cuda.py).
"""

import ctypes

import numpy as np
import pytest

from metrale import BufferArena, MetraleError, OutOfMemoryError
from metrale.reference import REFERENCE
from metrale.testing import OPERATIONS, FaultyBackend

from helpers import COMPACT, Mem, process_resources, vm_counts

LIMITS = (16, 512, 16, 8)
TOP = (128, 1024, 16, 16)
OFFLOAD = ("hidden_states", "residual", "qkv_output")
KEEP = ("gate_logits_f32", "norm_unit_w")
WATCHED = OFFLOAD + KEEP
NOTHING = ((0, 0, 0), 0, 0, 0, 0)
# The scenarios naming "class": the watched buffers in two classes, "a" (two
# offloaded, one kept) and "b" (one each); the others in "default".
A_OFF, A_KEEP = ("hidden_states", "residual"), ("gate_logits_f32",)
TAGGED = REFERENCE
for _n in A_OFF + A_KEEP:
    TAGGED = TAGGED.replace(_n, tag="a")
for _n in ("qkv_output", "norm_unit_w"):
    TAGGED = TAGGED.replace(_n, tag="b")
# The most occurrences of one kind any scenario below makes (a bound, so
# that a regression that loops shows as a failure, not a hang).
MOST = 80


def held(gpu):
    """Everything a backend holds for an arena: device and host memory."""
    return (vm_counts(gpu), gpu.host_handle_count, gpu.host_handle_bytes, gpu.host_mapped_bytes,
            gpu.live_host_alloc_count)


def stamp(arena, gpu):
    """Each watched buffer filled with its own byte: name -> bytes."""
    m = Mem(arena, gpu)
    for i, name in enumerate(WATCHED):
        m.fill(name, 0x10 + i)
    return m, {n: m.read(n) for n in WATCHED}


# -- the scenarios: a set-up run without faults, then the step the fault is injected into -----

def _plain(a):
    pass


def _pieces(a):
    a.sleep(offload=OFFLOAD, keep=KEEP)         # the host memory made, chunks in pieces
    a.wake()


def _grown(a):
    a.resize(64)


def _asleep(a):
    a.sleep(offload=OFFLOAD, keep=KEEP)


def _asleep_pieces(a):
    _pieces(a)
    _asleep(a)


# The arena's pool, its segments offloaded by name (docs/torch.md).
POOLED = OFFLOAD + ("torch",)


def _pieces_pooled(a):
    a.sleep(offload=POOLED, keep=KEEP)          # the pool's host memory made too
    a.wake()


def _asleep_pooled(a):
    a.sleep(offload=POOLED, keep=KEEP)


def _asleep_pooled_pieces(a):
    _pieces_pooled(a)
    _asleep_pooled(a)


def _pieces_pooled_grown(a):
    _pieces_pooled(a)
    a.resize(64)


def _asleep_pooled_resized(a):
    _asleep_pooled(a)
    a.resize(64)


def _asleep_a(a):
    a.sleep(offload=A_OFF, keep=A_KEEP, tags="a")


def _a_woke(a):
    _asleep(a)
    a.wake(tags="a")


def _sleep_a(a):
    a.sleep(offload=A_OFF, keep=A_KEEP, tags="a")


SCENARIOS = {
    # name: (set-up, the step, whether views of the offloaded buffers live through it)
    "sleep offload+keep, fresh": (_plain, lambda a: a.sleep(offload=OFFLOAD, keep=KEEP), True),
    "sleep offload+keep, in pieces": (_pieces, lambda a: a.sleep(offload=OFFLOAD, keep=KEEP),
                                      True),
    "sleep offload, fresh": (_plain, lambda a: a.sleep(offload=OFFLOAD), True),
    "sleep keep, fresh": (_plain, lambda a: a.sleep(keep=KEEP), False),
    "sleep keep, in pieces": (_pieces, lambda a: a.sleep(keep=KEEP), False),
    "sleep after a resize": (_grown, lambda a: a.sleep(offload=OFFLOAD, keep=KEEP), True),
    "wake": (_asleep, lambda a: a.wake(), True),
    "wake, in pieces": (_asleep_pieces, lambda a: a.wake(), True),
    "resize while asleep": (_asleep, lambda a: a.resize(64), True),
    "resize up": (_plain, lambda a: a.resize(64), True),
    "resize down": (_grown, lambda a: a.resize(8), False),
    "release": (_plain, lambda a: a.release(), False),
    "release asleep": (_asleep, lambda a: a.release(), False),
    "release asleep, in pieces": (_asleep_pieces, lambda a: a.release(), False),
    # with a pool whose segments hold bytes (the scenarios naming "torch")
    "sleep offload torch, fresh": (_plain, lambda a: a.sleep(offload=POOLED, keep=KEEP), True),
    "sleep offload torch, again": (_pieces_pooled,
                                   lambda a: a.sleep(offload=POOLED, keep=KEEP), True),
    "sleep discarding torch": (_plain, lambda a: a.sleep(offload=OFFLOAD, keep=KEEP), True),
    "wake offload torch": (_asleep_pooled, lambda a: a.wake(), True),
    "wake offload torch, again": (_asleep_pooled_pieces, lambda a: a.wake(), True),
    # the buffers and the pool in one pipeline: kept with the pool offloaded,
    # in pieces after a resize, woken after a resize while asleep
    "sleep keep, offload torch": (_plain, lambda a: a.sleep(offload=("torch",), keep=KEEP),
                                  False),
    "sleep offload torch, in pieces after a resize": (
        _pieces_pooled_grown, lambda a: a.sleep(offload=POOLED, keep=KEEP), True),
    "wake offload torch, resized while asleep": (_asleep_pooled_resized, lambda a: a.wake(),
                                                 True),
    # one class at a time (TAGGED): "a" alone, "a" after it woke alone, the rest
    "sleep a class": (_plain, _sleep_a, True),
    "sleep a class, in pieces": (_pieces, _sleep_a, True),
    "sleep a class after a class woke": (_a_woke, _sleep_a, True),
    "wake a class": (_asleep, lambda a: a.wake(tags="a"), True),
    "wake a class, in pieces": (_asleep_pieces, lambda a: a.wake(tags="a"), True),
    "wake the rest after a class woke": (_a_woke, lambda a: a.wake(), True),
    "release with a class asleep": (_asleep_a, lambda a: a.release(), False),
}


def _same(got, want):
    """Whether a buffer's bytes are what was written, over the bytes both
    sizes hold (a resize changes the size, not the contents)."""
    k = min(len(got), len(want))
    return bool((got[:k] == want[:k]).all())


def _armed(gpu, op):
    """Whether the fault injected for `op` has not fired yet."""
    return f"'{op}'" in repr(gpu).split("armed=")[1].split("}")[0]


def _run(scenario, op, nth, over):
    """One scenario with the `nth` next `op` failing, on a backend that maps
    over memory (the host's way) or only where none is (CUDA's).  Returns
    whether the fault fired; every check of the module doc is asserted on
    the way."""
    setup, step, with_views = SCENARIOS[scenario]
    where = (scenario, op, nth, over)
    gpu = FaultyBackend(maps_over=over)
    before_process = process_resources()
    a = BufferArena.new(COMPACT, *LIMITS, gpu, reserve=TOP,
                        **(dict(buffers=TAGGED) if "class" in scenario else {}))
    m, before = stamp(a, gpu)
    segments = _pooled(a) if "torch" in scenario else {}
    views = {n: np.asarray(a.view(n, "uint8")) for n in OFFLOAD} if with_views else {}
    setup(a)
    was_sleeping = a.is_sleeping()
    others = set(a.memory_stats()["classes_asleep"]) - {"a"}
    gpu.inject_fault(op, nth)
    failed = None
    try:
        step(a)
    except (MetraleError, OutOfMemoryError) as e:
        failed = e
    fired = not _armed(gpu, op)
    gpu.clear_faults()
    assert fired or failed is None, where
    # 1. a live view of an offloaded buffer is readable, its bytes intact (and
    # the pool's segments, where they are offloaded or awake)
    assert [n for n, v in views.items() if not _same(v, before[n])] == [], where
    offloaded = "offload torch" in scenario
    # awake again after a failed sleep, the discarded segments are intact where
    # host memory went over the device memory before any chunk was unmapped;
    # in CUDA's order their chunks go first: their contents are undefined, as
    # a discarded buffer's
    if offloaded or (not a.is_sleeping() and over):
        assert _changed(segments) == [], where
    # 2. the state is one the documentation names, and a step over class "a"
    # left every other class as it was
    if failed is not None and not a.is_released():
        assert a.is_sleeping() in _allowed(scenario, op, was_sleeping, over), \
            where + (a.is_sleeping(), failed)
        if "a class" in scenario:
            assert set(a.memory_stats()["classes_asleep"]) - {"a"} == others, where
    # 3. awake, the kept and offloaded buffers have their bytes, and it works
    if not a.is_released():
        if a.is_sleeping():
            a.wake()
        kept = KEEP if scenario.startswith("sleep keep") else \
            OFFLOAD if scenario.startswith("sleep offload,") else WATCHED
        for n in kept:
            assert _same(m.read(n), before[n]), where + (n,)
        if offloaded:
            assert _changed(segments) == [], where
        _refill(segments)
        a.sleep(offload=POOLED if segments else OFFLOAD, keep=KEEP)
        a.wake()
        for n in kept:
            assert _same(m.read(n), before[n]), where + (n, "after a sleep and wake")
        assert _changed(segments) == [], where + ("after a sleep and wake",)
    views.clear()
    for ptr in segments:
        a.pool.free(ptr)
    # 4. release gives everything back (a release that failed: when asked again)
    try:
        a.release()
    except MetraleError:
        assert failed is not None and scenario.startswith("release"), where
        a.release()
    assert held(gpu) == NOTHING and gpu.live_alloc_count == 0, where + (held(gpu),)
    assert a.memory_stats()["reserved_bytes"] == 0, where
    del a, m, views
    assert process_resources() == before_process, where
    return fired


def _pooled(a):
    """A pool with three segments (two runs), each filled with its own
    byte: ptr -> (bytes, byte)."""
    pool = a.open_pool(16 * 4096)
    segs = [pool.alloc(4096), pool.alloc(2 * 4096), pool.alloc(3 * 4096), pool.alloc(4096)]
    pool.free(segs[1])
    out = {p: (n, 0x60 + i) for i, (p, n) in enumerate(zip(segs, (4096, 0, 3 * 4096, 4096)))
           if n}
    _refill(out)
    return out


def _refill(segments):
    for p, (n, byte) in segments.items():
        ctypes.memset(p, byte, n)


def _changed(segments):
    return [hex(p) for p, (n, byte) in segments.items()
            if ctypes.string_at(p, n) != bytes([byte]) * n]


def _allowed(scenario, op, was_sleeping, over):
    """Whether the arena may be asleep after the step failed at `op`, as the
    documentation says (sleep, wake: docs/stable-addresses.md)."""
    if "after a class woke" in scenario:
        return {True}                   # the other class sleeps throughout
    if scenario.startswith("sleep"):
        # a copy, a reservation, new memory or its mapping at the staging
        # range fail before anything changed; a mapping at the buffers' or
        # the pool's addresses wakes it again; an unmap or a release leaves it
        # asleep (awake again, in CUDA's order, where a chunk stays under
        # offloaded memory)
        # (an unmap of host memory an earlier, smaller offload made, before
        # anything changes, leaves it awake too)
        if op in ("unmap",):
            return {True, False}
        if op in ("release_handle", "unreserve"):
            return {True}
        return {False}
    if scenario.startswith("wake"):
        return {True}                   # a failed wake still sleeps
    return {was_sleeping}               # resize changes no sleep


@pytest.mark.parametrize("over", [True, False], ids=["mapping over", "cuda order"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
# alloc and free are an unreserved arena's, export and import a shared one's
@pytest.mark.parametrize("op", [o for o in OPERATIONS if o not in ("alloc", "free", "export",
                                                                       "import")])
def test_every_occurrence_of_every_operation_fails_cleanly(scenario, op, over):
    import gc
    gc.collect()        # what earlier tests left in cycles must not close descriptors mid-count
    for nth in range(1, MOST + 1):
        if not _run(scenario, op, nth, over):
            return
    pytest.fail(f"{scenario}: more than {MOST} {op} operations")
