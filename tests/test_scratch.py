"""ScratchSpaceManager: per-thread scratch from the C core."""

import threading

import numpy as np
import pytest

from metrale import MetraleError, ScratchSpaceManager, ScratchStats

from helpers import in_thread


def test_lazy_creation_and_sizes():
    m = ScratchSpaceManager(1024, 4)
    assert m.scratch_size() == 1024 and m.active_threads() == 0
    assert m.stats() == ScratchStats(1024, 0, 4, 0, 0, 0)
    s = m.get_scratch()
    assert m.active_threads() == 1 and m.get_scratch() is s
    assert s.capacity() == 1024 and s.used() == 0 and s.remaining() == 1024
    assert ScratchSpaceManager.for_model(64, 2).scratch_size() == 64 * 4 * 4
    assert ScratchSpaceManager.new(8, 1).scratch_size() == 8


def test_get_alignment_bump_and_fit():
    m = ScratchSpaceManager(1024, 1)
    s = m.get_scratch()
    a = s.get(3, "float32")
    assert a.dtype == np.float32 and a.shape == (3,) and not a.any()
    assert a.ctypes.data % 64 == 0 and s.used() == 12
    b = s.get(5, np.int64)
    assert b.ctypes.data % 64 == 0 and b.ctypes.data == a.ctypes.data + 64 and s.used() == 64 + 40
    assert s.remaining() == 1024 - 104 == s.capacity() - s.used()
    a[:] = 7
    assert (a == 7).all() and not b.any()          # disjoint
    c = s.get((1024 - 128) // 8, "float64")        # exactly fills the rest
    assert c is not None and s.used() == 1024 and s.remaining() == 0
    assert s.get(1, "uint8") is None               # does not fit
    assert s.get(0, "uint8") is None or s.used() == 1024
    s.reset()
    assert s.used() == 0
    d = s.get(256, "float32")
    assert d.ctypes.data == a.ctypes.data and not d.any()   # zero-filled again
    assert s.get(1, "float32") is None
    with pytest.raises(TypeError, match="count"):
        s.get(1.5)
    with pytest.raises(ValueError, match="count"):
        s.get(-1)


def test_as_bytes_writable_whole_buffer():
    m = ScratchSpaceManager(256, 1)
    s = m.get_scratch()
    a = s.get(4, "uint8")
    mv = s.as_bytes()
    assert len(mv) == 256 and not mv.readonly
    mv[0] = 9
    assert a[0] == 9


def test_threads_get_their_own_buffers():
    m = ScratchSpaceManager(512, 3)
    main = m.get_scratch().get(4, "uint8")
    other = in_thread(lambda: m.get_scratch().get(4, "uint8"))
    assert main.ctypes.data != other.ctypes.data or m.stats().total_allocated >= 1024


def test_thread_limit():
    m = ScratchSpaceManager(64, 2)
    m.get_scratch()
    ready, release = threading.Event(), threading.Event()

    def hold():
        m.get_scratch()
        ready.set()
        release.wait()

    t = threading.Thread(target=hold)
    t.start()
    try:
        ready.wait()
        with pytest.raises(MetraleError, match="max_threads=2"):
            in_thread(m.get_scratch)
    finally:
        release.set()                               # a failure must not leave it waiting
        t.join()
    in_thread(m.get_scratch)                        # the holder ended: its slot is free again
    assert m.active_threads() == 1


def test_reset_all_visible_from_other_threads():
    m = ScratchSpaceManager(1024, 2)
    step = [threading.Event() for _ in range(3)]
    seen = {}

    def worker():
        s = m.get_scratch()
        s.get(10, "float32")
        seen["before"] = s.used()
        step[0].set()
        step[1].wait()
        seen["after"] = s.used()
        seen["array"] = s.get(1, "float32").ctypes.data % 64
        step[2].set()

    t = threading.Thread(target=worker)
    t.start()
    step[0].wait()
    assert m.stats().total_used == 40
    m.reset_all()
    assert m.stats().total_used == 0                 # pending reset counts as empty
    step[1].set()
    step[2].wait()
    t.join()
    assert seen == {"before": 40, "after": 0, "array": 0}


def test_stats_fields():
    m = ScratchSpaceManager(1000, 4)
    m.get_scratch().get(100, "uint8")
    in_thread(lambda: None)
    st = m.stats()
    assert (st.scratch_size, st.active_threads, st.max_threads) == (1000, 1, 4)
    assert st.total_used == 100 and st.max_thread_usage == 100 and st.total_allocated == 1000


def test_space_refuses_other_threads():
    m = ScratchSpaceManager(64, 2)
    s = m.get_scratch()
    with pytest.raises(MetraleError, match="another thread"):
        in_thread(s.get, 1)
    t_space = in_thread(m.get_scratch)
    with pytest.raises(MetraleError):            # its thread ended
        t_space.used()


def test_churn_sequential_threads():
    m = ScratchSpaceManager(256, 4)
    peak = [0]

    def body():
        m.get_scratch().get(8, "float32")[:] = 1
        peak[0] = max(peak[0], m.active_threads())

    for _ in range(10_000):
        t = threading.Thread(target=body)
        t.start()
        t.join()
    assert peak[0] <= 1 and m.active_threads() == 0
    assert m.stats().total_allocated <= 4 * 256


def test_churn_waves_of_four():
    m = ScratchSpaceManager(256, 4)
    errors, peak = [], [0]

    def body():
        try:
            m.get_scratch().get(8, "float32")
            peak[0] = max(peak[0], m.active_threads())
        except Exception as e:
            errors.append(e)

    for _ in range(2_500):
        ts = [threading.Thread(target=body) for _ in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    assert not errors and peak[0] <= 4 and m.active_threads() == 0


def test_stress_get_vs_reset_all():
    # What the contract promises under a concurrent reset_all: each array comes
    # zero-filled from the calling thread's own buffer, and nothing but that
    # thread writes there.  A reset_all may legitimately hand a thread memory
    # that overlaps its earlier arrays, so overlap is not checked.
    m = ScratchSpaceManager(4096, 8)
    stop = threading.Event()
    errors = []

    def hammer(k):
        try:
            s = m.get_scratch()
            lo = np.frombuffer(s.as_bytes(), np.uint8).ctypes.data
            hi = lo + s.capacity()
            mine = {0, k, -k}
            for i in range(3000):
                a = s.get(16, "int32")
                if a is None:
                    s.reset()
                    continue
                if a.any():
                    errors.append(("not zeroed", k, i))
                if not (lo <= a.ctypes.data and a.ctypes.data + a.nbytes <= hi):
                    errors.append(("outside the thread's buffer", k, i))
                a[:] = k
                b = s.get(16, "int32")
                if b is not None:
                    if b.any():
                        errors.append(("not zeroed", k, i))
                    b[:] = -k
                if not set(np.unique(a).tolist()) <= mine:
                    errors.append(("foreign write", k, i))
        except Exception as e:
            errors.append(e)

    def resetter():
        while not stop.is_set():
            m.reset_all()

    r = threading.Thread(target=resetter)
    r.start()
    ts = [threading.Thread(target=hammer, args=(k + 1,)) for k in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    stop.set()
    r.join()
    assert not errors


def test_arrays_outlive_manager():
    m = ScratchSpaceManager(128, 1)
    a = m.get_scratch().get(4, "float32")
    del m
    a[:] = 2                                        # the buffer stays valid
    assert (a == 2).all()


def test_bad_arguments():
    with pytest.raises(TypeError, match="scratch_size"):
        ScratchSpaceManager("1", 1)
    with pytest.raises(ValueError, match="max_threads"):
        ScratchSpaceManager(1, -1)
    m = ScratchSpaceManager(16, 0)
    with pytest.raises(MetraleError, match="max_threads=0"):
        m.get_scratch()


def test_get_checks_before_it_carves():
    m = ScratchSpaceManager(1024, 1)
    s = m.get_scratch()
    s.get(3, "uint8")
    used = s.used()
    for count, dtype, exc, word in [
        (4, "object", ValueError, "not supported"),      # strings follow the views' rule
        (4, np.dtype("O"), ValueError, "Python objects"),
        (4, np.dtype([("a", "f4"), ("b", "O")]), ValueError, "Python objects"),
        (4, "S0", ValueError, "not supported"),
        (4, np.dtype("S0"), ValueError, "no fixed size"),
        (4, "not-a-dtype", ValueError, "not supported"),
        (4, 3.5, TypeError, "not a numpy dtype"),
        (2**62, "float64", ValueError, "more than 2\\*\\*64 - 1 bytes"),
        (2**64, "uint8", ValueError, "count"),
        (-1, "uint8", ValueError, "count"),
        (True, "uint8", TypeError, "count"),
        (1.0, "uint8", TypeError, "count"),
    ]:
        with pytest.raises(exc, match=word):
            s.get(count, dtype)
        assert s.used() == used                      # nothing carved
    assert s.get(2**60, "float64") is None and s.used() == used    # fits 64 bits, not the buffer
    a = s.get(np.int64(2), np.dtype([("x", "<i4"), ("y", "<f4")]))
    assert a.shape == (2,) and a.dtype.names == ("x", "y") and not a.view(np.uint8).any()
    assert s.remaining() == s.capacity() - s.used()


def test_zero_size_scratch():
    m = ScratchSpaceManager(0, 1)
    s = m.get_scratch()
    assert s.get(1, "uint8") is None and s.get(0, "uint8") is None
    assert len(s.as_bytes()) == 0 and s.remaining() == 0


def test_manager_limits_are_refused_cleanly():
    from metrale import OutOfMemoryError
    with pytest.raises(ValueError, match="max_threads"):
        ScratchSpaceManager(8, 2**63)
    with pytest.raises(OutOfMemoryError, match="scratch slot table"):
        ScratchSpaceManager(8, 2**57)               # fits the rule, not the machine
    m = ScratchSpaceManager(2**57, 1)               # the buffer is allocated on first use
    with pytest.raises(OutOfMemoryError, match="scratch buffer"):
        m.get_scratch()
    assert m.active_threads() == 0


def test_peaks_outlive_threads():
    """total_used / max_thread_usage say what is carved now; the peaks keep
    the high-water marks after the threads that made them have exited."""
    m = ScratchSpaceManager(4096, 4)
    barrier = threading.Barrier(3, timeout=60)      # the two workers and this thread

    def work(n):
        s = m.get_scratch()
        s.get(n, "uint8")
        barrier.wait()           # both carved at once
        barrier.wait()           # released by the main thread once it has looked
    ts = [threading.Thread(target=work, args=(n,)) for n in (100, 1000)]
    for t in ts:
        t.start()
    barrier.wait()               # both have carved, neither has exited
    now = m.stats()
    assert (now.total_used, now.max_thread_usage, now.peak_total_used, now.peak_thread_usage) == \
        (1100, 1000, 1100, 1000)
    barrier.wait()
    for t in ts:
        t.join()
    after = m.stats()
    assert after.active_threads == 0 and after.total_used == 0 and after.max_thread_usage == 0
    assert (after.peak_total_used, after.peak_thread_usage) == (1100, 1000)
    s = m.get_scratch()
    s.get(10, "uint8")                    # 10 bytes: below the peaks
    s.get(1, "uint8")                     # at offset 64 (64-byte alignment): used = 65
    assert m.stats().peak_thread_usage == 1000 and s.used() == 65
    m.reset_peak_stats()
    st = m.stats()
    assert (st.peak_total_used, st.peak_thread_usage) == (65, 65)
    m.reset_all()
    s.get(3, "uint8")
    assert m.stats().total_used == 3 and m.stats().peak_total_used == 65


def test_get_reads_dtypes_as_views_do():
    m = ScratchSpaceManager(4096, 1)
    s = m.get_scratch()
    assert s.get(2, float).dtype == np.float64 and s.get(2, "i8").dtype == np.int64
    assert s.get(2, "<f4").dtype == np.float32 and s.get(2, np.float16).dtype == np.float16
    bf = s.get(3, "bfloat16")
    assert bf.dtype == np.dtype("V2") and bf.nbytes == 6
    assert s.get(5, "float8_e4m3fn").nbytes == 5
    assert ScratchStats(1, 2, 3, 4, 5, 6).peak_total_used == 0       # the reference's six fields
