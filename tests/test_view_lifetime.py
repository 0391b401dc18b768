"""Live views and their exports against release: release refuses
(BufferError naming the buffers) and frees nothing while a view, a numpy
array made from one or an unconsumed DLPack capsule is alive, on any
thread, and once nothing is live it frees at once."""

import threading

import pytest

from metrale import MetraleError

from helpers import live_counts, new


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
