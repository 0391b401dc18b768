"""sleep(offload=...) on a GPU (docs/stable-addresses.md): the offloaded
buffers' host memory is mapped at their own device addresses, so tensors made
from their views, and a CUDA graph captured before the sleep that touches only
them, read and write it while the arena sleeps; wake brings it back to device
memory; the device memory is given back.  Checked with sentinel values against
numpy, and against cuMemGetInfo."""

import numpy as np
import pytest

from metrale import BufferArena
from metrale.sizes import BUFFER_NAMES

from helpers import COMPACT, Mem
from reference_oracle import ZERO_ALL

pytestmark = pytest.mark.gpu

LIMITS = (256, 1024, 16, 16)
MIB2 = 2 << 20


def test_offload_keep_and_discard_on_the_device(gpu):
    offload, keep = ("hidden_states", "logits"), ("residual", "norm_unit_w")
    with BufferArena.new(COMPACT, *LIMITS, gpu, reserve=LIMITS) as a:
        m = Mem(a, gpu)
        for i, name in enumerate(BUFFER_NAMES):
            m.fill(name, i + 1)
        before = {n: m.read(n) for n in BUFFER_NAMES}
        ptrs = dict(a.ptrs)
        for _ in range(3):          # the second and third reuse the host memory
            gpu.synchronize()
            free0 = gpu.mem_info()[0]
            committed = a.committed_bytes()
            a.sleep(offload=offload, keep=keep)
            assert gpu.mem_info()[0] - free0 >= committed - MIB2     # device memory given back
            a.wake()
            assert dict(a.ptrs) == ptrs
            for name in offload + keep:
                assert (m.read(name) == before[name]).all(), name
            for name in BUFFER_NAMES:       # every other one: its contract, "zero"
                if name not in offload + keep:
                    assert not m.read(name).any(), name
        handles = gpu.host_handle_count
        assert handles >= 1
    assert gpu.host_handle_count == 0 and gpu.host_mapped_bytes == 0


def test_the_wake_contracts_on_the_device(gpu):
    from metrale import BufferSet, BufferSpec
    own = BufferSet([
        BufferSpec("weights", "bfloat16", ["hidden_size", "hidden_size"], wake="keep",
                   tag="weights"),
        BufferSpec("kv", "bfloat16", ["max_seq_len", "hidden_size"], wake="offload", tag="kv"),
        BufferSpec("acts", "bfloat16", ["max_batch_tokens", "hidden_size"]),
        BufferSpec("half", "bfloat16", ["max_batch_tokens", 3], wake="fill:-0.5"),
        BufferSpec("scratch", "uint8", ["max_batch_tokens", 100], wake="undefined"),
    ])
    with BufferArena.new(COMPACT, *LIMITS, gpu, reserve=LIMITS, buffers=own) as a:
        m = Mem(a, gpu)
        half = np.frombuffer(b"\x00\xbf" * (a.nbytes("half") // 2), np.uint8)   # -0.5: 0xBF00
        assert (m.read("half") == half).all()           # filled when built
        for i, name in enumerate(own.names):
            m.fill(name, i + 1)
        before = {n: m.read(n) for n in own.names}
        g = a.guard("kv")
        for n in range(1, 3):
            a.sleep()
            with pytest.raises(Exception, match="kv, asleep"):
                g.check()
            a.wake()
            g.check()
            assert g.epochs == {"kv": n}
            for name in ("weights", "kv"):
                assert (m.read(name) == before[name]).all(), name
            assert not m.read("acts").any() and (m.read("half") == half).all()


def test_classes_sleep_and_wake_apart_on_the_device(gpu):
    from metrale import BufferSet, BufferSpec, MetraleError
    own = BufferSet([
        BufferSpec("weights", "bfloat16", ["hidden_size", "hidden_size"], wake="keep",
                   tag="weights"),
        BufferSpec("kv", "bfloat16", ["max_seq_len", "hidden_size"], tag="kv"),
        BufferSpec("scale", "float32", ["max_seq_len", 4], wake="fill:1.0", tag="kv"),
        BufferSpec("acts", "bfloat16", ["max_batch_tokens", "hidden_size"], wake="offload",
                   tag="activations"),
        BufferSpec("head", "bfloat16", ["hidden_size", 64], wake="keep", tag="weights"),
    ])
    one = np.frombuffer(b"\x00\x00\x80\x3f" * 4, np.uint8)     # float32 1.0
    with BufferArena.new(COMPACT, *LIMITS, gpu, reserve=LIMITS, buffers=own) as a:
        m = Mem(a, gpu)
        for i, name in enumerate(own.names):
            m.fill(name, i + 1)
        before = {n: m.read(n) for n in own.names}
        full = a.committed_bytes()
        a.sleep(tags="kv")                  # the others stay mapped, their bytes in place
        assert 0 < a.committed_bytes() < full
        for name in ("weights", "acts", "head"):
            assert (m.read(name) == before[name]).all(), name
        a.wake(tags="kv")
        assert not m.read("kv").any()
        assert (m.read("scale").reshape(-1, 16) == one).all()
        a.sleep()
        a.wake(tags="weights")              # weights first, as a refit wants them
        with pytest.raises(MetraleError, match="kv, activations"):
            a.guard().check()
        for name in ("weights", "head"):
            assert (m.read(name) == before[name]).all(), name
        m.fill("weights", 0x44)             # the new weights
        a.sleep(tags="weights")             # a partial sleep after a partial wake
        a.wake()
        assert (m.read("weights") == 0x44).all()
        assert (m.read("acts") == before["acts"]).all()
        assert a.committed_bytes() == full
        assert a.guard().epochs == {"weights": 2, "kv": 2, "activations": 1}


def test_tensors_and_a_graph_live_through_sleep_and_wake(gpu):
    torch = pytest.importorskip("torch")
    with BufferArena.new(COMPACT, *LIMITS, gpu, reserve=LIMITS) as a:
        x = torch.from_dlpack(a.view("hidden_states", "float32"))
        y = torch.from_dlpack(a.view("residual", "float32"))
        n = min(x.numel(), y.numel())
        x, y = x[:n], y[:n]
        seq = np.arange(n, dtype=np.float32) % 4096      # exact in float32 through x * 2 + 1

        def put(values):
            x.copy_(torch.from_numpy(values).cuda())
            torch.cuda.synchronize()

        def got():
            torch.cuda.synchronize()
            return y.cpu().numpy()

        side = torch.cuda.Stream()
        put(seq)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            y.copy_(x * 2 + 1)
        g.replay()
        assert (got() == seq * 2 + 1).all()
        a.sleep(offload=("hidden_states", "residual"))
        # asleep: the same tensors reach host memory at the same addresses
        assert (x.cpu().numpy() == seq).all() and (got() == seq * 2 + 1).all()
        put(seq + 5)
        g.replay()                                      # the graph runs over the host link
        assert (got() == (seq + 5) * 2 + 1).all()
        a.wake()
        assert (got() == (seq + 5) * 2 + 1).all() and (x.cpu().numpy() == seq + 5).all()
        put(seq + 9)
        g.replay()
        assert (got() == (seq + 9) * 2 + 1).all()
        torch.cuda.synchronize()
        g = x = y = None                                # before the arena's release


def test_a_kernel_launched_before_the_sleep_on_another_stream_completes_with_its_bytes(gpu):
    """Issue 49: CUDA maps only where nothing is mapped, so the sleep and the
    wake wait for the device's work queued before them.  A long kernel and a
    read of the offloaded buffer queued on another stream just before
    `sleep(offload=...)`, and again before `wake`, finish with the right
    bytes and no device fault (the arena and the device still work after)."""
    torch = pytest.importorskip("torch")
    with BufferArena.new(COMPACT, *LIMITS, gpu, reserve=LIMITS) as a:
        x = torch.from_dlpack(a.view("hidden_states", "int32"))
        n = x.numel()
        seq = torch.arange(n, dtype=torch.int32, device="cuda")
        x.copy_(seq)
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        outs = []
        for step in (a.sleep, a.wake):
            out = torch.empty_like(x)
            with torch.cuda.stream(side):
                torch.cuda._sleep(50_000_000)       # tens of ms: still queued at the call
                out.copy_(x)                        # reads the offloaded buffer
                out.add_(1)
            if step == a.sleep:
                step(offload=("hidden_states",))
            else:
                step()
            side.synchronize()
            outs.append(out)
        torch.cuda.synchronize()
        for out in outs:
            assert torch.equal(out, seq + 1)
        assert torch.equal(x, seq)
        a.zero_all()
        gpu.synchronize()
        x = None


OFFLOAD, KEEP = ("hidden_states", "residual", "logits"), ("gate_logits_f32", "norm_unit_w")


def _held(gpu):
    """What a backend holds for arenas: device and host memory."""
    return (gpu.reserved_bytes, gpu.mapped_bytes, gpu.handle_count, gpu.host_handle_count,
            gpu.host_mapped_bytes, gpu.live_host_alloc_count)


def test_a_failed_handle_release_in_an_offload_sleep_leaves_its_buffers_mapped():
    """Every release of a physical handle in a pipelined sleep(offload=...)
    fails in turn (metrale._backends._faulty_cuda): the offloaded buffers stay
    readable at their addresses (a failed release used to leave them
    unmapped: a device fault), wake brings everything back, and the
    handle is released by the arena's release."""
    from metrale import MetraleError
    from metrale._backends._faulty_cuda import FaultyCudaBackend
    gpu = FaultyCudaBackend()
    nothing = _held(gpu)
    fired = True
    nth = 0
    while fired:
        nth += 1
        assert nth < 100
        with BufferArena.new(COMPACT, *LIMITS, gpu, reserve=LIMITS) as a:
            m = Mem(a, gpu)
            for i, name in enumerate(OFFLOAD + KEEP):
                m.fill(name, 0x20 + i)
            before = {n: m.read(n) for n in OFFLOAD + KEEP}
            a.sleep(offload=OFFLOAD, keep=KEEP)         # host memory made, chunks in pieces
            a.wake()
            gpu.inject_fault("release_handle", nth)
            try:
                a.sleep(offload=OFFLOAD, keep=KEEP)
            except MetraleError as e:
                assert "INJECTED_FAULT" in str(e)
                assert a.is_sleeping()                  # a release failing leaves it asleep
            fired = "'release_handle'" not in repr(gpu)
            gpu.clear_faults()
            gpu.synchronize()
            for n in OFFLOAD:                           # read through their own addresses
                assert (m.read(n) == before[n]).all(), (nth, n)
            a.wake()
            for n in OFFLOAD + KEEP:
                assert (m.read(n) == before[n]).all(), (nth, n)
        assert _held(gpu) == nothing, nth
    assert nth > 5                                      # the sleep releases many handles


@pytest.mark.parametrize("kind", ["reserved", "keep", "offload", "offload_awake"])
def test_arenas_collected_in_cycles_give_the_device_everything_back(gpu, kind):
    """Reserved arenas left unreleased in a reference cycle, six rounds in one
    process: the collector's order differs from one collection to the next."""
    import gc
    import warnings
    from helpers import Cycle
    nothing = _held(gpu)
    gpu.synchronize()
    free0 = gpu.mem_info()[0]
    for r in range(6):
        a = BufferArena.new(COMPACT, *LIMITS, gpu, reserve=LIMITS)
        if kind == "keep":
            a.sleep(keep=KEEP)
        elif kind.startswith("offload"):
            a.sleep(offload=OFFLOAD, keep=KEEP)
            if kind == "offload_awake":
                a.wake()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            Cycle(arena=a, gpu=gpu)
            del a
            gc.collect()
        assert _held(gpu) == nothing, r
        assert gpu.mem_info()[0] >= free0 - MIB2, r
