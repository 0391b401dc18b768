"""GPU-only behaviour: target, graph capture of the zeroing helpers, views for
torch / CuPy, driver errors.  Skipped with the reason where no GPU is usable."""

import pytest

import metrale
from metrale import BufferArena, BufferSizes, ModelConfig, MetraleError, OutOfMemoryError

from conftest import Mem, _cuda, _cuda_reason
from test_arena import PREFILL, ROWS, ZERO_ALL, _check_zeroed, _fill_all, expected_rows_length

PRESET = ModelConfig.preset("qwen3-next-80b")


@pytest.fixture
def gpu():
    g = _cuda()
    if g is None:
        from conftest import _cuda_reason as why
        pytest.skip(why)
    return g


def test_unavailable_is_a_clear_error():
    g = _cuda()
    if g is not None:
        pytest.skip("a GPU is present")
    with pytest.raises(MetraleError, match="CUDA|cuda"):
        metrale.CudaBackend(0)


def test_target(gpu):
    major, _ = gpu.compute_capability()
    t = gpu.target()
    assert t.sm_count == gpu.sm_count() > 0
    assert t.splitk == ("auto" if major == 9 else "legacy")
    with BufferArena.new(PRESET, 16, 4096, 16, 32, gpu) as a:
        assert a.sizes() == BufferSizes.from_config(PRESET, 16, 4096, 16, 32, target=t)


def test_oom_is_clean(gpu):
    before = (gpu.live_alloc_count, gpu.live_bytes)
    zero = BufferSizes(**dict.fromkeys(metrale.sizes.BUFFER_NAMES, 0))
    with pytest.raises(OutOfMemoryError, match="CUDA_ERROR_OUT_OF_MEMORY"):
        BufferArena.from_sizes(PRESET, zero.replace(o_latent=2 ** 50), 1, 0, gpu)
    assert (gpu.live_alloc_count, gpu.live_bytes) == before


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


@pytest.mark.parametrize("helper", ["zero_all", "zero_prefill_essentials", "rows1", "rows17"])
def test_graph_replay(gpu, helper):
    torch = _torch()
    m_tokens = 100
    with BufferArena.new(PRESET, m_tokens, 4096, 16, 32, gpu) as arena:
        stream = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=stream):
            s = torch.cuda.current_stream()
            if helper == "zero_all":
                arena.zero_all(gpu, s)
            elif helper == "zero_prefill_essentials":
                arena.zero_prefill_essentials(gpu, s)
            else:
                arena.zero_all_rows(gpu, s, int(helper[4:]))
        m = _fill_all(arena, gpu)
        g.replay()
        torch.cuda.synchronize()
        sizes = arena.sizes()
        if helper == "zero_all":
            expect = {n: getattr(sizes, n) for n in ZERO_ALL}
        elif helper == "zero_prefill_essentials":
            expect = {n: getattr(sizes, n) for n in PREFILL}
        else:
            expect = {n: getattr(sizes, n) for n in ZERO_ALL}
            for n in ROWS:
                expect[n] = expected_rows_length(getattr(sizes, n), m_tokens, int(helper[4:]))
        _check_zeroed(arena, m, expect)
        del g


def test_torch_and_cupy_views(gpu):
    torch = _torch()
    with BufferArena.new(PRESET, 16, 4096, 16, 32, gpu) as arena:
        t = torch.from_dlpack(arena.view("hidden_states", "bfloat16", (16, 2048)))
        assert t.data_ptr() == arena.hidden_states() and t.dtype == torch.bfloat16
        assert t.device.type == "cuda" and t.shape == (16, 2048)
        t.fill_(1.0)
        torch.cuda.synchronize()
        raw = Mem(arena, gpu).read("hidden_states")
        assert raw[:2].tobytes() == b"\x80\x3f"      # bf16 1.0
        arena.zero_prefill_essentials(gpu, torch.cuda.current_stream())
        torch.cuda.synchronize()
        assert not t.any().item()
        cai = arena.view("logits", "float32").__cuda_array_interface__
        assert cai["data"][0] == arena.logits()
        cupy = pytest.importorskip("cupy")
        c = cupy.from_dlpack(arena.view("residual", "float32", (16, 1024)))
        assert c.data.ptr == arena.residual()
        c2 = cupy.asarray(arena.view("residual", "uint8"))
        assert c2.data.ptr == arena.residual()


def test_checksum_on_gpu(gpu, caplog):
    import logging
    torch = _torch()
    with BufferArena.new(PRESET, 16, 4096, 16, 32, gpu) as arena:
        arena.zero_all(gpu, 0)
        t = torch.from_dlpack(arena.view("residual", "float32"))
        t[:3] = torch.tensor([1.0, -2.0, 0.5], device="cuda")
        torch.cuda.synchronize()
        with caplog.at_level(logging.WARNING, logger="metrale"):
            arena.debug_buffer_checksum(gpu, torch.cuda.current_stream(), "gpu")
        recs = [r.getMessage() for r in caplog.records if r.name == "metrale"]
        assert len(recs) == 16
        assert recs[1].endswith("sum=-0.500000 ssq=5.250000 sabs=3.500000")


def test_threads_share_the_backend(gpu):
    """Fresh threads (no current context of their own) build, zero, check and
    release arenas on one CudaBackend concurrently, and release arenas another
    thread built; the backend's counters come back to where they were."""
    import threading
    before = (gpu.live_alloc_count, gpu.live_bytes)
    errors, handoff = [], []
    lock = threading.Lock()

    def work(i):
        try:
            for round_ in range(3):
                m_tokens, tokens = 16 + 8 * i, 1 + (i + round_) % 5
                arena = BufferArena.new(PRESET, m_tokens, 4096, 16, 32, gpu)
                m = _fill_all(arena, gpu)
                arena.zero_all_rows(gpu, 0, tokens)
                sizes = arena.sizes()
                expect = {n: getattr(sizes, n) for n in ZERO_ALL}
                for n in ROWS:
                    expect[n] = expected_rows_length(getattr(sizes, n), m_tokens, tokens)
                _check_zeroed(arena, m, expect)
                if round_ == 2:
                    with lock:
                        handoff.append(arena)   # released by the main thread
                else:
                    arena.release(gpu)
        except BaseException as e:              # reported below, with the thread
            errors.append((i, e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(handoff) == 4
    for arena in handoff:
        arena.release(gpu)
    assert (gpu.live_alloc_count, gpu.live_bytes) == before
