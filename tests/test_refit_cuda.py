"""metrale.refit on the lent GPU: a trainer process (torch and metrale's client,
no arena) writes a CUDA weight arena in place, across sleeps and wakes that
replace its chunks; the device's bytes read back against the trainer's
tensors, regenerated here from their seeds; the copies on the legacy stream
and on another; and 300 tensors of odd sizes, some from unaligned sources,
through the kernel that copies many runs in one launch (kernels/copy_runs.cu)
and beside it."""

import multiprocessing

import numpy as np
import pytest

from metrale._integrations._refit_check import check_state
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


# Three launches of the kernel (128 runs each at most), sizes of 1 byte to
# about 5 KB: not multiples of 16 (the tail bytes), some under 16.
MANY = {f"t{i}": ("uint8", (1 + (i * 977) % 5003,)) for i in range(300)}


def _many(seed, arange, take):
    """MANY's tensors, views of one pool of bytes ((7 i + seed) mod 251): each
    third at an unaligned offset (copied alone), the others 16-byte aligned
    (the kernel's).  `arange(n)` makes the pool, `take(pool, lo, hi)` a view."""
    total = sum(s[0] + 32 for _d, s in MANY.values())
    pool = arange(total)
    out, at = {}, 0
    for i, (name, (_d, (k,))) in enumerate(MANY.items()):
        at = (at + 15) & ~15
        if i % 3 == 0:
            at += 1 + i % 15
        out[name] = take(pool, at, at + k)
        at += k
    return out


def _many_torch(torch, seed):
    def arange(n):
        return ((torch.arange(n, device="cuda") * 7 + seed) % 251).to(torch.uint8)
    return _many(seed, arange, lambda p, lo, hi: p[lo:hi])


def _many_numpy(seed):
    return _many(seed, lambda n: ((np.arange(n) * 7 + seed) % 251).astype(np.uint8),
                 lambda p, lo, hi: p[lo:hi].tobytes())


def _trainer(path, seeds, conn, many=False):
    try:
        import torch
        from metrale import CudaBackend
        imp = WeightImport(path, CudaBackend(0))
        side = torch.cuda.Stream()
        for i, seed in enumerate(seeds):
            state = _many_torch(torch, seed) if many else _state(torch, seed)
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


def test_many_odd_runs_from_unaligned_sources_land_byte_for_byte(gpu, tmp_path):
    """300 runs: the aligned ones in three launches of the copy kernel, every
    third (an unaligned source) a copy of its own; each tensor's bytes, its
    tail of length % 16 included, and nothing in the padding between them
    (the arena's bytes there stay as the sentinel left them)."""
    pytest.importorskip("torch")
    ws = weight_set(MANY)
    seeds = [5, 6]
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    with weight_arena(ws, gpu) as arena, WeightExport(arena, ws, tmp_path / "s") as ex:
        gpu.upload(arena.ptr("weights"), b"\xa5" * ws.nbytes)
        p = ctx.Process(target=_trainer, args=(ex.path, seeds, there, True))
        p.start()
        try:
            for seed in seeds:
                ex.sync(timeout=120)
                got = gpu.download(arena.ptr("weights"), ws.nbytes)
                want = bytearray(b"\xa5" * ws.nbytes)
                for name, b in _many_numpy(seed).items():
                    q = ws[name]
                    want[q.offset:q.offset + q.nbytes] = b
                assert got == bytes(want), seed
            assert here.recv()[0] == "done"
        finally:
            p.join(60)
            if p.is_alive():
                p.kill()
        assert p.exitcode == 0


def test_the_check_of_cuda_tensors_takes_the_short_way_only_when_all_agree(gpu):
    """WeightImport's check (`check_state`, before anything is mapped):
    tensors and parameters of the set's dtype, shape and device pass, met
    before or not, giving their storages and addresses; a wrong dtype,
    shape, device or layout (a lazy negative view: its bytes are not its
    values) is refused by name, also once a tensor of that name passed."""
    torch = pytest.importorskip("torch")
    ws = weight_set(SHAPES)
    dtypes = {}
    good = _state(torch, 3)
    good["norm"] = torch.nn.Parameter(good["norm"])
    for _ in range(2):          # the first learns the dtypes, the second uses them
        items = check_state(ws, good, 0, "sync", gpu, dtypes)
        assert [i[0] for i in items] == [ws[n].offset for n in SHAPES]
        assert [i[2] for i in items] == [good[n].data_ptr() for n in SHAPES]
        assert [i[1] for i in items] == [good[n].untyped_storage().data_ptr() for n in SHAPES]
        assert set(dtypes.values()) == {"bfloat16", "float32"}
    view = torch.zeros(2000, 64, dtype=torch.bfloat16, device="cuda")[1000:]
    assert check_state(ws, {**good, "embed": view}, 0, "sync", gpu, dtypes)[0][1:3] == \
        (view.untyped_storage().data_ptr(), view.data_ptr())       # a view: its storage's start
    wide = torch.zeros(64, 66, dtype=torch.bfloat16, device="cuda")
    for bad, match in [({"proj": good["proj"].float()}, "'proj' is float32"),
                       ({"head": good["head"].reshape(33, 64)}, "'head' is bfloat16 \\[33, 64\\]"),
                       ({"head": wide[:, :33]}, "'head' is not contiguous"),
                       ({"norm": good["norm"].detach().cpu()}, "'norm' is on cpu"),
                       ({"head": torch._neg_view(good["head"])},
                        "'head' is a lazy negative view")]:
        with pytest.raises(ValueError, match=match):
            check_state(ws, {**good, **bad}, 0, "sync", gpu, dtypes)
