"""Backends: HostBackend's counters and clear_ranges (the fused zeroing as a
public call) against a numpy model, the memory check of clear_ranges, and the
failure adaptor metrale.testing.FaultyBackend."""

import pytest

from metrale import HostBackend, MetraleError, OutOfMemoryError
from metrale.testing import FaultyBackend

from helpers import Mem, live_counts, new, ptr_of, slab_base


def _random_ranges(rnd, n):
    """2..18 disjoint ranges inside [0, n): 16-byte aligned starts, lengths that
    include 1..15, odd and multi-block sizes."""
    k = rnd.randint(2, 18)
    starts = sorted(rnd.sample(range(0, n // 16), k))
    out = []
    for i, a in enumerate(starts):
        gap = (starts[i + 1] if i + 1 < k else n // 16) * 16 - a * 16
        length = min(gap, rnd.choice([1, 7, 15, 16, 17, 4095, 8192, 8193, rnd.randint(1, 300_000)]))
        out.append((a * 16, length))
    rnd.shuffle(out)          # the call takes them in any order
    return out


@pytest.mark.parametrize("seed", range(6))
def test_clear_ranges_random(backend, seed):
    """Backend.clear_ranges, the operation behind zero_all_rows, against a numpy
    model: exactly the listed bytes become zero, in one launch on CUDA."""
    import random

    import numpy as np
    gpu = backend
    rnd = random.Random(seed)
    with new(gpu, m=128) as arena:
        mem = Mem(arena, gpu)
        mem.fill("logits", 0xA5)
        n = arena.sizes().logits
        base = ptr_of(arena, "logits")
        ranges = _random_ranges(rnd, n)
        expect = np.full(n, 0xA5, dtype=np.uint8)
        for off, length in ranges:
            expect[off:off + length] = 0
        launches = getattr(gpu, "launch_count", None)
        gpu.clear_ranges([(base + off, length) for off, length in ranges], 0)
        got = mem.read("logits")
        bad = np.flatnonzero(got != expect)
        assert bad.size == 0, f"{bad.size} bytes differ, first at {bad[:5]}"
        if launches is not None:
            assert gpu.launch_count - launches == 1


def test_clear_ranges_errors():
    gpu = HostBackend()
    with new(gpu, m=16) as arena:
        p = arena.hidden_states()
        with pytest.raises(TypeError, match="ranges"):
            gpu.clear_ranges(p)
        with pytest.raises(TypeError, match="address"):
            gpu.clear_ranges([(float(p), 16)])
        with pytest.raises(TypeError, match="tuple"):
            gpu.clear_ranges([[p, 16]])
        with pytest.raises(ValueError, match="aligned"):
            gpu.clear_ranges([(p + 8, 16)])
        with pytest.raises(ValueError, match="nbytes"):
            gpu.clear_ranges([(p, -1)])
        with pytest.raises(ValueError, match="at most 32"):
            gpu.clear_ranges([(p + 16 * i, 16) for i in range(33)])
        before = gpu.memset_count
        gpu.clear_ranges([(p, 0), (0, 0)])        # empty ranges: nothing to do
        assert gpu.memset_count == before


def test_clear_ranges_only_in_backend_memory():
    import numpy as np
    gpu = HostBackend()
    other = np.zeros(4096, dtype=np.uint8)
    with new(gpu, m=16) as arena:
        base = slab_base(arena)
        slab_end = base + arena.slab_bytes()
        for bad in [(other.ctypes.data // 16 * 16 + 16, 16), (16, 16), (2**64 - 16, 16),
                    (slab_end - 16, 32), (base, arena.slab_bytes() + 16)]:
            with pytest.raises(ValueError, match="not inside memory this HostBackend allocated"):
                gpu.clear_ranges([bad])
        gpu.clear_ranges([(slab_end - 16, 16)])
        p = arena.hidden_states()
    with pytest.raises(ValueError, match="not inside"):
        gpu.clear_ranges([(p, 16)])                      # released: no longer the backend's


@pytest.mark.parametrize("op, exc", [("alloc", OutOfMemoryError), ("free", MetraleError),
                                     ("memset", MetraleError), ("d2h", MetraleError),
                                     ("sync", MetraleError)])
def test_faulty_backend_fails_the_nth_operation(op, exc):
    gpu = FaultyBackend()
    gpu.inject_fault(op, 2)
    arenas, failures = [], 0
    for _ in range(3):
        try:
            a = new(gpu, m=4)
            a.zero_all(gpu, 0)
            a.debug_buffer_checksum(gpu, 0, "t")
            arenas.append(a)
        except exc as e:
            failures += 1
            assert "injected" in str(e) or "INJECTED" in str(e)
    for a in arenas:
        try:
            a.release(gpu)
        except MetraleError:
            failures += 1
    # the checksum swallows its copy and sync failures (ARENA.md §7)
    assert failures == (0 if op in ("d2h", "sync") else 1)


def test_faulty_backend_arms_and_disarms():
    gpu = FaultyBackend()
    gpu.inject_fault("alloc")
    gpu.clear_faults()
    with new(gpu, m=4):
        pass
    assert live_counts(gpu) == (0, 0) and isinstance(gpu, HostBackend)
    with pytest.raises(ValueError, match="op must be one of"):
        gpu.inject_fault("launch")
    with pytest.raises(TypeError, match="op"):
        gpu.inject_fault(1)
    with pytest.raises(ValueError, match="nth"):
        gpu.inject_fault("alloc", 0)
    assert not hasattr(HostBackend(), "inject_fault")          # the shipped backend never fails on purpose
