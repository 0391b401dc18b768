"""metrale.refit on the lent GPU: a trainer process (torch and metrale's client,
no arena) writes a CUDA weight arena in place, across sleeps and wakes that
replace its chunks; the device's bytes read back against the trainer's
tensors, regenerated here from their seeds; the copies on the legacy stream
and on another."""

import multiprocessing

import pytest

from metrale.refit import WeightExport, WeightImport
from metrale.weights import weight_arena, weight_set

pytestmark = pytest.mark.gpu

SHAPES = {"embed": ("bfloat16", (1000, 64)), "norm": ("float32", (64,)),
          "proj": ("bfloat16", (192, 64)), "head": ("bfloat16", (64, 33))}


def _state(torch, seed):
    """The cycle's tensors on the device, from a seed: bytes both processes agree on."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    return {n: torch.randn(s, generator=g, device="cuda", dtype=torch.float32).to(dt[d])
            for n, (d, s) in SHAPES.items()}


def _trainer(path, seeds, conn):
    try:
        import torch
        from metrale import CudaBackend
        imp = WeightImport(path, CudaBackend(0))
        side = torch.cuda.Stream()
        for i, seed in enumerate(seeds):
            state = _state(torch, seed)
            stream = torch.cuda.current_stream() if i == 0 else side
            stream.wait_stream(torch.cuda.current_stream())
            stats = imp.sync(state, stream=stream.cuda_stream)
        imp.close()
        conn.send(("done", stats.copies))
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))


def test_a_trainer_process_writes_the_weights_on_the_device(gpu, tmp_path):
    torch = pytest.importorskip("torch")
    ws = weight_set(SHAPES)
    seeds = [11, 12, 13]
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    with weight_arena(ws, gpu) as arena, WeightExport(arena, ws, tmp_path / "s") as ex:
        p = ctx.Process(target=_trainer, args=(ex.path, seeds, there))
        p.start()
        try:
            for i, seed in enumerate(seeds):
                epoch = ex.sync(timeout=120)
                got = gpu.download(arena.ptr("weights"), ws.nbytes)
                for name, t in _state(torch, seed).items():
                    q = ws[name]
                    want = t.contiguous().view(torch.uint8).cpu().numpy().tobytes()
                    assert got[q.offset:q.offset + q.nbytes] == want, (seed, name)
                assert epoch == arena.guard("weights").epochs["weights"]
                arena.sleep()
                assert arena.committed_bytes() == 0
                arena.wake()
                assert gpu.download(arena.ptr("weights"), ws.nbytes) == got
            assert here.recv() == ("done", 4)
        finally:
            p.join(60)
            if p.is_alive():
                p.kill()
        assert p.exitcode == 0
        assert arena.memory_stats()["imported_handles"] == 0
