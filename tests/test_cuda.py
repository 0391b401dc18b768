"""GPU-only behaviour: target, graph capture of the zeroing helpers, views for
torch / CuPy, driver errors, the launch shape of zero_all_rows(tokens_at=...)
(the tests taking the `gpu` fixture, skipped with the reason where no GPU is
usable); and the CUDA backend's host-side errors."""

import pytest

import metrale
from metrale import BufferArena, BufferSizes, MetraleError, OutOfMemoryError

from helpers import (COMPACT, PRESET, Mem, check_zeroed, cuda_backend, expected_rows_length,
                     fill_all, new, ptr_of, rows_expectation, slab_base)
from reference_oracle import PREFILL, ZERO_ALL


def test_unavailable_is_a_clear_error():
    g = cuda_backend()
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
        m = fill_all(arena, gpu)
        g.replay()
        torch.cuda.synchronize()
        sizes = arena.sizes()
        if helper == "zero_all":
            expect = {n: getattr(sizes, n) for n in ZERO_ALL}
        elif helper == "zero_prefill_essentials":
            expect = {n: getattr(sizes, n) for n in PREFILL}
        else:
            expect = rows_expectation(sizes, m_tokens, int(helper[4:]))
        check_zeroed(arena, m, expect)
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
        del t, c, c2              # exports alive at release would make it refuse


def test_exports_into_torch_and_cupy_keep_the_memory(gpu):
    """Every way torch and CuPy take an arena view (DLPack, the CUDA array
    interface) keeps it: release refuses, naming the buffers, the memory stays
    readable, and once the last consumer is gone release frees at once."""
    torch = _torch()
    cupy = pytest.importorskip("cupy")
    before = (gpu.live_alloc_count, gpu.live_bytes)
    arena = BufferArena.new(PRESET, 16, 4096, 16, 32, gpu)
    t = torch.from_dlpack(arena.view("hidden_states", "bfloat16", (16, 2048)))
    u = torch.as_tensor(arena.view("logits", "float32", (4, 8)), device="cuda")   # CAI
    c = cupy.from_dlpack(arena.view("residual", "float32"))
    k = cupy.asarray(arena.view("residual", "uint8"))                             # CAI
    assert u.data_ptr() == arena.logits() and k.data.ptr == arena.residual()
    t.fill_(2.0)
    c.fill(3.0)
    live = {"t": t, "u": u, "k": k, "c": c}
    del t, u, k, c
    for names, drop in ((["hidden_states: 1 view", "logits: 1 view", "residual: 2 views"], "t"),
                        (["logits: 1 view", "residual: 2 views"], "u"),
                        (["residual: 2 views"], "k"),
                        (["residual: 1 view"], "c")):
        with pytest.raises(BufferError) as e:
            arena.release(gpu)
        for n in names:
            assert n in str(e.value)
        # nothing was freed: the consumers still read what was written
        if "t" in live:
            assert live["t"].float().sum().item() == 2.0 * live["t"].numel()
        if "c" in live:
            assert float(live["c"].sum()) == 3.0 * live["c"].size
        del live[drop]
    torch.cuda.synchronize()
    arena.release(gpu)
    assert (gpu.live_alloc_count, gpu.live_bytes) == before


def test_clear_ranges_only_in_device_memory(gpu):
    torch = _torch()
    import numpy as np
    host = np.zeros(4096, dtype=np.uint8)
    other = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    with BufferArena.new(PRESET, 16, 4096, 16, 32, gpu) as arena:
        end = slab_base(arena) + arena.slab_bytes()
        for bad in [(host.ctypes.data // 16 * 16 + 16, 16), (16, 16), (end - 16, 2**31),
                    (2**64 - 16, 16)]:
            with pytest.raises(ValueError, match="not inside one allocation of device memory"):
                gpu.clear_ranges([bad])
        gpu.clear_ranges([(end - 16, 16), (other.data_ptr(), 4096)])   # device memory: yours
        torch.cuda.synchronize()
        p = arena.hidden_states()
    with pytest.raises(ValueError, match="not inside"):
        gpu.clear_ranges([(p, 16)])                                  # freed


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
        del t


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
                m = fill_all(arena, gpu)
                arena.zero_all_rows(gpu, 0, tokens)
                check_zeroed(arena, m, rows_expectation(arena.sizes(), m_tokens, tokens))
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


def test_real_library_streams(gpu):
    """torch, CuPy and cuda.core streams are accepted as they come, and the work
    lands on them (checked after synchronising that stream alone)."""
    torch = _torch()
    streams = [("torch", torch.cuda.Stream(), lambda s: s.synchronize())]
    try:
        import cupy
        streams.append(("cupy", cupy.cuda.Stream(non_blocking=True), lambda s: s.synchronize()))
    except ImportError:
        pass
    try:
        try:
            from cuda.core import Device
        except ImportError:
            from cuda.core.experimental import Device
        dev = Device(0)
        dev.set_current()
        streams.append(("cuda.core", dev.create_stream(), lambda s: s.sync()))
    except ImportError:
        pass
    with BufferArena.new(PRESET, 16, 4096, 16, 32, gpu) as arena:
        mem = Mem(arena, gpu)
        for name, stream, sync in streams:
            mem.fill("hidden_states", 0xAB)
            mem.fill("logits", 0xAB)
            arena.zero_all_rows(gpu, stream, 1)
            sync(stream)
            assert not mem.read("logits").any(), name
            n = expected_rows_length("hidden_states", arena.sizes().hidden_states, 16, 1)
            hs = mem.read("hidden_states")
            assert not hs[:n].any() and (hs[n:] == 0xAB).all(), name


@pytest.mark.parametrize("how", ["global", "cycle", "torch_view"])
def test_arena_alive_at_exit(gpu, how):
    """An arena (and a view of it) still alive when the interpreter exits must
    not crash it: the finalizers skip the driver once Python is finalizing."""
    import subprocess
    import sys
    code = [
        "import metrale",
        "g = metrale.CudaBackend(0)",
        "a = metrale.BufferArena.new(metrale.ModelConfig.preset('qwen3-next-80b'), 16, 4096, 16, 32, g)",
        "a.zero_all(g, 0)",
    ]
    if how == "cycle":
        code += ["class Holder: pass", "h = Holder(); h.me = h; h.arena = a; h.gpu = g", "del a, g"]
    elif how == "torch_view":
        _torch()
        code += ["import torch", "t = torch.from_dlpack(a.view('logits', 'bfloat16'))", "t.fill_(1.0)"]
    r = subprocess.run([sys.executable, "-W", "ignore::ResourceWarning", "-c", "\n".join(code)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "Fatal" not in r.stderr and "Segmentation" not in r.stderr, r.stderr[-2000:]


def test_missing_bindings_is_a_clear_error():
    """Without cuda-bindings (hidden here), CudaBackend() says what to install;
    without the extension, that this build has no CUDA backend. No GPU needed."""
    import importlib.util
    import subprocess
    import sys
    code = ("import sys; sys.modules['cuda.bindings'] = None; sys.modules['cuda.bindings.cydriver'] = None\n"
            "import metrale\n"
            "try:\n    metrale.CudaBackend(0)\n"
            "except metrale.MetraleError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    if importlib.util.find_spec("metrale._backends._cuda") is None:
        assert "built without its CUDA backend" in r.stdout, r.stdout
    else:
        assert "CudaBackend is unavailable" in r.stdout and "metrale[cuda]" in r.stdout, r.stdout


ROWS_AT_DEFAULT = {"blocks_per_sm": 1, "tile_chunks": 512, "spread": 8, "queue": True}   # documented


def test_rows_at_tuning_is_checked_all_or_nothing(gpu):
    """tune_rows_at refuses what the kernel cannot take, naming the argument,
    and changes nothing then; None keeps a value; the getter round-trips."""
    assert gpu.rows_at_tuning() == ROWS_AT_DEFAULT
    try:
        for kw, bad, exc in (("blocks_per_sm", 0, ValueError), ("blocks_per_sm", 33, ValueError),
                             ("blocks_per_sm", True, TypeError), ("tile_chunks", 0, ValueError),
                             ("tile_chunks", 3, ValueError), ("tile_chunks", 768, ValueError),
                             ("tile_chunks", 8192, ValueError), ("tile_chunks", 2.0, TypeError),
                             ("spread", 0, ValueError), ("spread", 2**32, ValueError),
                             ("spread", "8", TypeError), ("queue", 1, TypeError),
                             ("queue", "yes", TypeError)):
            others = {k: (1 if k != "queue" else False) for k in ROWS_AT_DEFAULT if k != kw}
            with pytest.raises(exc, match=kw):
                gpu.tune_rows_at(**others, **{kw: bad})
            assert gpu.rows_at_tuning() == ROWS_AT_DEFAULT, kw
        gpu.tune_rows_at(blocks_per_sm=32, tile_chunks=4096, spread=2**32 - 1, queue=False)
        assert gpu.rows_at_tuning() == {"blocks_per_sm": 32, "tile_chunks": 4096, "spread": 2**32 - 1,
                                        "queue": False}
        gpu.tune_rows_at(tile_chunks=1)
        assert gpu.rows_at_tuning() == {"blocks_per_sm": 32, "tile_chunks": 1, "spread": 2**32 - 1,
                                        "queue": False}
    finally:
        gpu.tune_rows_at(**ROWS_AT_DEFAULT)
    assert gpu.rows_at_tuning() == ROWS_AT_DEFAULT


@pytest.mark.parametrize("queue", [True, False])
@pytest.mark.parametrize("shape", [(1, 1, 1), (32, 4096, 1), (4, 256, 32), (1, 16, 2**32 - 1)])
def test_tuned_rows_at_clears_what_the_host_count_does(gpu, shape, queue):
    """Every launch shape clears exactly the rows zero_all_rows(tokens) does
    (helpers.rows_expectation, written from ARENA §5.2), its blocks taking
    their tiles from the arena's counter or in fixed shares."""
    blocks_per_sm, tile_chunks, spread = shape
    gpu.tune_rows_at(blocks_per_sm=blocks_per_sm, tile_chunks=tile_chunks, spread=spread, queue=queue)
    try:
        for tokens in (0, 1, 17, 100, -1):
            with new(gpu, COMPACT, m=100) as arena:
                fill_all(arena, gpu)
                at = ptr_of(arena, "token_ids")           # never zeroed by zero_all_rows
                gpu.upload(at, tokens.to_bytes(4, "little", signed=True))
                arena.zero_all_rows(tokens_at=at)
                gpu.synchronize()
                expect = rows_expectation(arena.sizes(), 100, tokens if tokens >= 0 else 100)
                check_zeroed(arena, Mem(arena, gpu), expect, spared=[("token_ids", 0, 4)])
    finally:
        gpu.tune_rows_at(**ROWS_AT_DEFAULT)


def test_driver_errors_name_the_call_its_bytes_and_the_error(gpu):
    """The one error path (_driver.pxd): "call(N bytes): CUDA_ERROR_..."."""
    zero = BufferSizes(**dict.fromkeys(metrale.sizes.BUFFER_NAMES, 0))
    with pytest.raises(OutOfMemoryError, match=r"cuMemAlloc\(\d+ bytes\): CUDA_ERROR_OUT_OF_MEMORY$"):
        BufferArena.from_sizes(PRESET, zero.replace(o_latent=2 ** 50), 1, 0, gpu)


def test_a_forked_child_is_refused_before_any_driver_call(gpu):
    """CUDA cannot be used in a child forked after it was initialized: the
    context step (CudaBackend._current, without the GIL) raises before any
    driver call, for a Python method and for the arena's C-level calls."""
    import os
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)     # fork() with threads alive
        pid = os.fork()
    if pid == 0:
        code = 0
        for call in (gpu.mem_info, gpu.synchronize):
            try:
                call()
                code |= 1
            except MetraleError as e:
                code |= 0 if "forked after CUDA was initialized" in str(e) else 2
            except BaseException:
                code |= 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert gpu.mem_info()[1] > 0                               # the parent is untouched


def test_trim_stack_gives_the_grown_stack_back(gpu):
    """A stack grown by the driver (here set through cuda.bindings, as a kernel
    with a deep stack makes it) holds device memory that trim_stack gives back;
    the limit read back independently through the driver."""
    driver = pytest.importorskip("cuda.bindings.driver")
    lim = driver.CUlimit.CU_LIMIT_STACK_SIZE
    gpu.synchronize()
    start = gpu.trim_stack()[1]                 # the stack as the backend was made
    err, = driver.cuCtxSetLimit(lim, 16 << 10)
    assert err == driver.CUresult.CUDA_SUCCESS
    grown_free = gpu.mem_info()[0]
    before, after = gpu.trim_stack()
    assert before >= 16 << 10 and after == start
    err, v = driver.cuCtxGetLimit(lim)
    assert err == driver.CUresult.CUDA_SUCCESS and v == start
    # the grown part of the stack for each of at least 256 resident threads an SM
    assert gpu.mem_info()[0] - grown_free >= gpu.sm_count() * 256 * ((16 << 10) - start)
    assert gpu.trim_stack(start) == (start, start)      # nothing to do: nothing done
    with pytest.raises(TypeError, match="nbytes"):
        gpu.trim_stack("1024")
    with pytest.raises(ValueError, match="nbytes"):
        gpu.trim_stack(-1)
