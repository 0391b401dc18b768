"""metrale.torch on a GPU (docs/torch.md): tensors over buffers, torch's
allocations and CUDA graphs in an arena's pool, through sleep and wake; the
pool's refusals as torch sees them; declared buffers as torch's cuBLAS
workspace and Triton's scratch (install_workspaces)."""

import gc

import pytest

from helpers import COMPACT
from metrale import REFERENCE, BufferArena, BufferSpec, MetraleError

torch = pytest.importorskip("torch", reason="metrale.torch needs torch (the extra metrale[torch])")
mt = pytest.importorskip("metrale.torch")
from metrale._integrations import _torch_workspaces as ws_mod  # noqa: E402  (after torch)

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
        assert int(t.flatten().view(torch.uint8)[:64].sum()) == 64 * 0x3C
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


# The reference set with three workspaces of the engine's own.
WORKSPACES = REFERENCE.with_([BufferSpec("cublas_workspace", size=64 * MIB),
                              BufferSpec("triton_scratch", size=MIB),
                              BufferSpec("tiny_scratch", size=256)])


@pytest.fixture
def ws_arena(gpu):
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    a = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, reserve=RESERVE, buffers=WORKSPACES)
    yield a
    for ws in {w for w in ws_mod._INSTALLED.values() if w is not None}:
        ws.remove()
    gc.collect()
    torch.cuda.synchronize()
    if a.pool is not None:
        mt.close_pool(a)
    a.release()


def _install_cublas(arena, **kw):
    try:
        return mt.install_workspaces(arena, cublas="cublas_workspace", **kw)
    except MetraleError as e:
        if "caches none" in str(e):         # a torch that keeps no workspace: nothing to test
            pytest.skip(str(e))
        raise


def _segment_at(ptr):
    return [s for s in torch.cuda.memory_snapshot() if s["address"] == ptr]


def test_cublas_workspace_is_the_buffer_and_a_graph_captures_it(ws_arena):
    arena = ws_arena
    a, b = torch.randn(512, 512, device="cuda"), torch.randn(512, 512, device="cuda")
    c = torch.empty(512, 512, device="cuda")
    want = a @ b
    s = torch.cuda.Stream()
    ws = _install_cublas(arena, stream=s)
    assert ws.cublas == "cublas_workspace" and ws.triton is None and ws.cublas_active()
    assert ("view", "cublas_workspace") in {(p.kind, p.name) for p in arena.pins()}
    ptr = arena.ptr("cublas_workspace")
    seg, = _segment_at(ptr)                 # torch's workspace block is the buffer's start
    assert seg["total_size"] <= arena.nbytes("cublas_workspace") and seg["allocated_size"] > 0
    # A GEMM on the installed stream makes no workspace of its own ...
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with torch.cuda.stream(s):
        torch.mm(a, b, out=c)
    s.synchronize()
    assert torch.cuda.memory_allocated() == before and torch.allclose(c, want)
    # ... where one on another stream does (torch's own, in its own memory).
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        torch.mm(a, b, out=c)
    other.synchronize()
    assert torch.cuda.memory_allocated() > before
    # A graph captured on the installed stream allocates no workspace either:
    # its GEMM's workspace pointer is the buffer's.
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        torch.mm(a, b, out=c)
    # (the capture itself takes a block of 1 KiB on the H200 with torch 2.11)
    assert torch.cuda.memory_allocated() - before < MIB
    c.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(c, want)
    with pytest.raises(BufferError):
        arena.sleep()                       # pinned: a sleep that discards it refuses
    ws.remove()
    assert not ws.cublas_active() and arena.pins() == () and not _segment_at(ptr)
    g.replay()                              # the buffer is still the arena's memory
    torch.cuda.synchronize()
    assert torch.allclose(c, want)
    del g


def test_a_cublas_buffer_too_small_is_refused_with_the_size(ws_arena):
    arena = ws_arena
    with pytest.raises(ValueError, match="cublas: buffer 'triton_scratch' has 1,048,576 bytes"):
        mt.install_workspaces(arena, cublas="triton_scratch")
    assert arena.pins() == () and ws_mod._INSTALLED["cublas"] is None
    a = torch.randn(256, 256, device="cuda")
    assert torch.allclose(a @ torch.eye(256, device="cuda"), a)    # torch made its own again
    with pytest.raises(ValueError, match="stream"):
        mt.install_workspaces(arena, cublas="cublas_workspace", stream="not a stream")
    assert arena.pins() == ()


def test_close_pool_makes_the_installed_workspace_again(ws_arena):
    arena = ws_arena
    mt.pool(arena, 64 * MIB)
    ws = _install_cublas(arena)
    with pytest.raises(MetraleError, match="cublas: installed already"):
        mt.install_workspaces(arena, cublas="triton_scratch")
    mt.close_pool(arena)                    # drops torch's workspaces, ours made again
    assert ws.cublas_active() and arena.pool is None
    ws.remove()
    assert arena.pins() == ()


def _tma_kernel():
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")
    if not hasattr(tl, "make_tensor_descriptor"):
        pytest.skip(f"Triton {triton.__version__} has no tl.make_tensor_descriptor")

    @triton.jit
    def copy(src, dst, M, N, BM: tl.constexpr, BN: tl.constexpr):
        # A descriptor made on the device: 128 bytes of global scratch a program.
        desc = tl.make_tensor_descriptor(src, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        pid = tl.program_id(0)
        rows = pid * BM + tl.arange(0, BM)
        cols = tl.arange(0, BN)
        tl.store(dst + rows[:, None] * N + cols[None, :], desc.load([pid * BM, 0]))

    return copy


def test_triton_scratch_is_the_buffer(ws_arena):
    arena = ws_arena
    copy = _tma_kernel()
    src = torch.randn(256, 64, device="cuda")
    dst = torch.zeros_like(src)
    with mt.install_workspaces(arena, triton="triton_scratch") as ws:
        assert ws.triton_active() and arena.pins()[0].name == "triton_scratch"
        copy[(4,)](src, dst, 256, 64, BM=64, BN=64)
        torch.cuda.synchronize()
        assert torch.equal(dst, src)
        assert 0 < ws.triton_peak() <= MIB     # the kernel asked scratch of the buffer
    assert not ws.triton_active() and arena.pins() == ()
    # A buffer smaller than a launch asks: refused at the launch, nothing handed out.
    with mt.install_workspaces(arena, triton="tiny_scratch") as ws:
        with pytest.raises(MetraleError, match="bytes of scratch; buffer 'tiny_scratch' has 256"):
            copy[(4,)](src, dst, 256, 64, BM=64, BN=64)
        assert ws.triton_peak() == 0


# -- the pool offloaded, a capture beyond it, a capture it must not disturb ----------------

def test_an_offloaded_pool_keeps_graph_memory_and_tensors(arena, gpu):
    mp = mt.pool(arena, 512 * MIB)
    w = torch.randn(1024, 1024, device="cuda")
    with mt.use_pool(arena):
        x = torch.randn(256, 1024, device="cuda")       # a static input, in the pool
        live = torch.arange(4 * MIB, device="cuda", dtype=torch.int32)
    torch.relu(x @ w)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=mp.id):
        y = torch.relu(x @ w) * 3.0 + 1.0
    g.replay()
    torch.cuda.synchronize()
    want, want_live = y.clone(), live.clone()
    segments = arena.pool.segments()
    for _ in range(2):
        free0 = gpu.mem_info()[0]
        arena.sleep(offload=["torch"])
        s = arena.pool.stats()
        assert s["committed"] == 0 and s["offloaded"] == sum(n for _, n in segments)
        assert gpu.mem_info()[0] - free0 >= s["offloaded"] - 2 * MIB
        # readable where they are, from host memory, while the arena sleeps
        assert torch.equal(live, want_live) and torch.equal(y, want)
        arena.wake()
        assert arena.pool.segments() == segments
        assert torch.equal(live, want_live) and torch.equal(y, want)
        y.zero_()
        g.replay()                          # nothing refilled: x kept its bytes
        torch.cuda.synchronize()
        assert torch.equal(y, want)
    del g, y, x, live, mp


def test_a_capture_beyond_the_pool_raises_and_the_pool_works_on(arena):
    mp = mt.pool(arena, 16 * MIB)
    x = torch.randn(64, 64, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(torch.OutOfMemoryError):
        with torch.cuda.graph(g, pool=mp.id):
            torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    del g
    assert arena.pool.stats()["refused"] >= 1
    g = torch.cuda.CUDAGraph()                  # a later capture into the pool works
    with torch.cuda.graph(g, pool=mp.id):
        y = x * 2.0
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, x * 2.0)
    del g, y, mp


def test_the_pool_growing_never_invalidates_another_threads_capture(arena):
    # Torch calls the pool during a capture (and from any thread); the pool
    # maps with the driver's virtual-memory calls, which a capture in global
    # mode allows, so a capture running meanwhile elsewhere survives.
    import threading
    mt.pool(arena, 256 * MIB)
    x = torch.randn(256, 256, device="cuda")
    torch.relu(x)
    torch.cuda.synchronize()
    creates = arena.pool.stats()["creates"]
    started, grown = threading.Event(), threading.Event()
    out = {}

    def grow():
        started.wait(10)
        with torch.cuda.stream(torch.cuda.Stream()), mt.use_pool(arena):
            out["t"] = torch.empty(96 * MIB, dtype=torch.uint8, device="cuda")
        grown.set()

    t = threading.Thread(target=grow)
    t.start()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="global"):
        started.set()
        assert grown.wait(10)
        y = torch.relu(x) + 1.0
    t.join()
    assert arena.pool.stats()["creates"] > creates and _inside(arena, out["t"])
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.relu(x) + 1.0)
    out.clear()
    del g, y


# -- a staged wake under a guarded graph (issue 51) ------------------------------------------

def test_a_guarded_graph_refuses_a_replay_until_every_class_it_uses_is_awake(gpu):
    from metrale import BufferSet
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    engine = BufferSet([
        BufferSpec("w", "bfloat16", ["H", "H"], wake="keep", tag="weights"),
        BufferSpec("kv", "bfloat16", [64, "H"], tag="kv"),
        BufferSpec("x", "bfloat16", [64, "H"], tag="activations"),
        BufferSpec("y", "bfloat16", [64, "H"], tag="activations"),
    ])
    a = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, reserve=RESERVE, buffers=engine)
    try:
        mt.pool(a, 64 * MIB)
        w, kv, x, y = mt.tensors(a, "w", "kv", "x", "y")
        for t in (w, kv, x):
            t.copy_(torch.randn(t.shape, device="cuda", dtype=torch.bfloat16))
        del t
        torch.cuda.synchronize()
        g = mt.graph(a, uses=["weights", "kv", "activations", "torch"])
        assert g.guard.classes == ("weights", "kv", "activations", "torch")
        # elementwise kernels: the same under capture as eagerly (cuBLAS may
        # pick another GEMM kernel under capture: ENGINEERING.md)
        with torch.cuda.graph(g, pool=mt.pool(a).id):
            torch.addcmul(kv, x, w[:64], out=y)
            y.mul_(torch.sigmoid(x))
        w_bytes = w.clone()
        del w, kv, x, y                         # the graph holds the addresses, not tensors
        a.sleep()
        a.wake(tags="weights")                  # the refit's stage: weights only
        with pytest.raises(MetraleError, match="kv, activations, torch, asleep"):
            g.replay()
        torch.cuda.synchronize()                # nothing launched: the device is sound
        a.wake(tags=["activations", "torch"])
        with pytest.raises(MetraleError, match="touches kv, asleep"):
            g.replay()
        torch.cuda.synchronize()
        a.wake(tags="kv")
        w, kv, x, y = mt.tensors(a, "w", "kv", "x", "y")
        assert torch.equal(w, w_bytes)          # "keep": the weights' bytes
        assert not kv.any() and not x.any()     # "zero": the cache and activations
        kv.copy_(torch.randn(kv.shape, device="cuda", dtype=torch.bfloat16))   # a prefill
        x.copy_(torch.randn(x.shape, device="cuda", dtype=torch.bfloat16))
        g.replay()
        want = torch.addcmul(kv, x, w[:64])
        want.mul_(torch.sigmoid(x))
        torch.cuda.synchronize()
        assert torch.equal(y, want)
        assert g.guard.epochs == {"weights": 1, "kv": 1, "activations": 1, "torch": 1}
    finally:
        w = kv = x = y = want = w_bytes = g = None      # the graph holds a pool segment
        gc.collect()
        torch.cuda.synchronize()
        mt.close_pool(a)
        a.release()
