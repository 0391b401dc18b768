"""metrale.torch on a GPU (docs/torch.md): tensors over buffers, torch's
allocations and CUDA graphs in an arena's pool, through sleep and wake; the
pool's refusals as torch sees them."""

import gc

import pytest

from helpers import COMPACT
from metrale import BufferArena, MetraleError

torch = pytest.importorskip("torch", reason="metrale.torch needs torch (the extra metrale[torch])")
mt = pytest.importorskip("metrale.torch")

MIB = 1 << 20
RESERVE = (512, 1024, 16, 16)


@pytest.fixture
def arena(gpu):
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    a = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, reserve=RESERVE)
    yield a
    gc.collect()
    torch.cuda.synchronize()
    if a.pool is not None:
        mt.close_pool(a)
    a.release()


def _inside(arena, t):
    p = arena.pool
    return p.base <= t.data_ptr() < p.base + p.nbytes


def test_tensors_of_every_type_share_the_buffers(arena):
    for dtype, tdt in (("bfloat16", torch.bfloat16), ("float16", torch.float16),
                       ("float32", torch.float32), ("float8_e4m3fn", torch.float8_e4m3fn),
                       ("float8_e5m2", torch.float8_e5m2), ("int32", torch.int32),
                       ("uint8", torch.uint8), ("int64", torch.int64)):
        t = mt.tensor(arena, "logits", dtype)
        assert t.dtype == tdt and t.is_cuda and t.data_ptr() == arena.ptr("logits")
        raw = mt.tensor(arena, "logits", "uint8")
        raw.fill_(0x3C)
        assert int(t.view(torch.uint8)[:64].sum()) == 64 * 0x3C
        del t, raw
    h = mt.tensor(arena, "hidden_states")
    assert h.dtype == torch.bfloat16 and tuple(h.shape) == (64, COMPACT.hidden_size)
    del h


def test_allocations_in_the_pool_land_in_its_range(arena):
    mp = mt.pool(arena, 256 * MIB)
    assert mt.pool(arena) is mp
    outside = torch.empty(MIB, device="cuda")
    with mt.use_pool(arena):
        small = torch.ones(1000, device="cuda")
        big = torch.full((30 * MIB // 4,), 2.0, device="cuda")
    assert not _inside(arena, outside) and _inside(arena, small) and _inside(arena, big)
    s = arena.pool.stats()
    assert s["segments"] >= 2 and s["in_use"] >= 30 * MIB
    assert arena.memory_stats()["pool_in_use_bytes"] == s["in_use"]
    assert float(big.sum()) == 2.0 * big.numel()
    with pytest.raises(MetraleError, match="torch still holds"):
        arena.release()
    del small, big, outside


def test_a_graph_in_the_pool_replays_after_sleep_and_wake(arena, gpu):
    mt.pool(arena, 512 * MIB)
    w = torch.randn(1024, 1024, device="cuda")
    x = torch.randn(256, 1024, device="cuda")
    torch.relu(x @ w)                       # cuBLAS set up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=mt.pool(arena).id):
        y = torch.relu(x @ w) * 3.0 + 1.0
    assert _inside(arena, y)
    g.replay()
    want = torch.relu(x @ w) * 3.0 + 1.0
    torch.cuda.synchronize()
    assert torch.equal(y, want)
    ptr = y.data_ptr()
    for _ in range(3):
        arena.sleep()
        assert arena.pool.stats()["committed"] == 0 and arena.pool.stats()["asleep"]
        arena.wake()
        y.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert y.data_ptr() == ptr and torch.equal(y, want)
    # Once the pool has grown, capturing the same shapes again maps nothing new.
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=mt.pool(arena).id):
        y2 = torch.relu(x @ w) * 3.0 + 1.0
    del g2, y2
    before = arena.pool.stats()["creates"]
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=mt.pool(arena).id):
        y2 = torch.relu(x @ w) * 3.0 + 1.0
    g2.replay()
    torch.cuda.synchronize()
    assert torch.equal(y2, want) and arena.pool.stats()["creates"] == before
    del g, g2, y, y2


def test_a_pool_too_small_raises_torchs_error_with_the_pools_figures(arena):
    mt.pool(arena, 8 * MIB)
    with pytest.raises(torch.OutOfMemoryError, match="metrale: the arena's pool has"):
        with mt.use_pool(arena):
            torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    assert arena.pool.stats()["refused"] >= 1
    with mt.use_pool(arena):
        ok = torch.empty(MIB, dtype=torch.uint8, device="cuda")
    assert _inside(arena, ok)
    del ok


def test_close_pool_gives_everything_back(gpu, arena):
    mt.pool(arena, 64 * MIB)
    with mt.use_pool(arena):
        t = torch.ones(4 * MIB, device="cuda")
    with pytest.raises(MetraleError, match="torch still holds"):
        mt.close_pool(arena)
    del t
    mt.close_pool(arena)
    assert arena.pool is None and arena.memory_stats()["pool_reserved_bytes"] == 0


def test_two_arenas_each_serve_their_own_pool(gpu, arena):
    other = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, reserve=RESERVE)
    mt.pool(arena, 64 * MIB)
    mt.pool(other, 64 * MIB)
    assert arena.pool.slot != other.pool.slot
    with mt.use_pool(arena):
        a = torch.ones(MIB, device="cuda")
    with mt.use_pool(other):
        b = torch.ones(MIB, device="cuda")
    assert _inside(arena, a) and _inside(other, b) and not _inside(arena, b)
    del a, b
    gc.collect()
    mt.close_pool(other)
    other.release()
