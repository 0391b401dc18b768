"""arena.peer_all_reduce on CUDA (docs/tensor-parallel.md): two ranks
(spawned processes, the file-backed group double of tests/helpers.py) share
their slabs as POSIX-fd handles and sum their live rows with the kernel,
eagerly, from a device-held count, and through one captured graph replayed
with the count changed on the device.  Results are checked against
helpers.expected_sum (independent of the kernel; see test_allreduce.py).

Marked gpu: with one device both ranks run on it (the driver time-slices
their contexts, so a barrier waits for the other process's turn: correct,
not fast); with two, one device each.  The comparison with NCCL needs two
devices (two_gpus)."""

import time

import numpy as np
import pytest

import metrale
from metrale import BufferArena, MetraleError
from metrale.tp import PeerGroup

from helpers import COMPACT, FileGroup, cuda_device_count, expected_sum, rank_input, run_ranks

CFG = COMPACT
LIMITS = (64, 512, 16, 8)
M = LIMITS[0]
SENTINEL = 0x5A
NAMES = {"hidden_states": "bfloat16", "ssm_gates": "float32"}


def _dtype(d):
    return np.uint16 if d == "bfloat16" else np.float32


def _fill(gpu, a, rank, names=NAMES):
    """Sentinels in every buffer, then each named buffer's input."""
    for n in a.buffers:
        if a.nbytes(n):
            gpu.upload(a.ptr(n), bytes([SENTINEL]) * a.nbytes(n))
    for n, d in names.items():
        width = a.nbytes(n) // M // np.dtype(_dtype(d)).itemsize
        gpu.upload(a.ptr(n), rank_input(rank, n, M, width, d).tobytes())


def _check(gpu, a, size, rank, n, into=None):
    """Rows < n of each buffer (or of into[name]) hold the sum over the
    ranks; rows >= n the rank's own input (in place) or sentinels."""
    ok = True
    for name, d in NAMES.items():
        dst = (into or {}).get(name, name)
        width = a.nbytes(name) // M // np.dtype(_dtype(d)).itemsize
        inputs = [rank_input(r, name, M, width, d) for r in range(size)]
        got = np.frombuffer(gpu.download(a.ptr(dst), a.nbytes(dst)), _dtype(d)).reshape(M, width)
        k = min(n, M) if n >= 0 else M
        ok &= np.array_equal(got[:k].view(np.uint8), expected_sum([x[:k] for x in inputs], d).view(np.uint8))
        if dst == name:
            ok &= np.array_equal(got[k:], inputs[rank][k:])
        else:
            ok &= set(got[k:].view(np.uint8).ravel().tolist()) <= {SENTINEL}
    return bool(ok)


def rank_cuda_reduce(rank, size, path):
    gpu = metrale.CudaBackend(rank % cuda_device_count())
    grp = PeerGroup(FileGroup(path, rank, size), timeout=60)
    out = {}
    with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
        count_at = a.token_ids()
        for n in (1, 32, M, 0):
            _fill(gpu, a, rank)
            grp.all_gather(("eager", n))
            a.peer_all_reduce(list(NAMES), tokens=n)
            gpu.synchronize()
            out[("eager", n)] = _check(gpu, a, size, rank, n)
            grp.all_gather(("checked", n))
        for n in (7, -1):
            _fill(gpu, a, rank)
            gpu.upload(count_at, np.int32(n).tobytes())
            grp.all_gather(("at", n))
            a.peer_all_reduce(list(NAMES), out=["residual", "ssm_gates"], tokens_at=count_at)
            gpu.synchronize()
            out[("at", n)] = _check(gpu, a, size, rank, n, into={"hidden_states": "residual"})
            grp.all_gather(("checked at", n))
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None and torch.cuda.is_available():
            torch.cuda.set_device(rank % cuda_device_count())
            s = torch.cuda.Stream()
            g = torch.cuda.CUDAGraph()
            gpu.upload(count_at, np.int32(0).tobytes())
            grp.all_gather("capture")
            with torch.cuda.graph(g, stream=s):
                a.peer_all_reduce(list(NAMES), stream=s, tokens_at=count_at)
            torch.cuda.synchronize()
            for n in (1, 17, M, 3, -1):
                _fill(gpu, a, rank)
                gpu.upload(count_at, np.int32(n).tobytes())
                grp.all_gather(("graph", n))
                g.replay()
                torch.cuda.synchronize()
                out[("graph", n)] = _check(gpu, a, size, rank, n)
                grp.all_gather(("graph checked", n))
            del g
        a.check_peer_reduce()
        grp.all_gather("done")
    return out


def rank_cuda_late(rank, size, path):
    """Rank 1 never reduces: rank 0's launch gives up after its timeout (it
    ends; nothing hangs) and check_peer_reduce says so."""
    gpu = metrale.CudaBackend(rank % cuda_device_count())
    grp = PeerGroup(FileGroup(path, rank, size), timeout=60)
    out = {}
    with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
        if rank == 0:
            t0 = time.perf_counter()
            a.peer_all_reduce("hidden_states", tokens=4, timeout=0.5)
            gpu.synchronize()
            out["waited"] = time.perf_counter() - t0
            try:
                a.check_peer_reduce()
            except MetraleError as e:
                out["error"] = str(e)
            a.peer_all_reduce("hidden_states", tokens=4, timeout=30)    # refused on the device
            t0 = time.perf_counter()
            gpu.synchronize()
            out["second"] = time.perf_counter() - t0
        grp.all_gather("done")
    return out


@pytest.mark.gpu
def test_ranks_sum_their_live_rows_on_cuda(tmp_path):
    outs = run_ranks(rank_cuda_reduce, 2, args=(str(tmp_path),), timeout=400)
    for out in outs:
        assert out and all(out.values()), out
        assert ("eager", 32) in out and ("at", -1) in out


@pytest.mark.gpu
def test_a_peer_that_never_calls_ends_the_launch_on_cuda(tmp_path):
    outs = run_ranks(rank_cuda_late, 2, args=(str(tmp_path),), timeout=200)
    out = outs[0]
    assert 0.5 <= out["waited"] < 20, out
    assert "rank 0 waited too long for rank 1" in out["error"], out
    assert out["second"] < 5, out


def rank_nccl(rank, size, path):
    """The same live rows through NCCL (torch.distributed) and through
    peer_all_reduce: the same bits, bf16 and fp32, several counts."""
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{path}/nccl", rank=rank,
                            world_size=size, device_id=torch.device("cuda", rank))
    gpu = metrale.CudaBackend(rank)
    out = {}
    try:
        with BufferArena.new(CFG, *LIMITS, gpu, group=dist.group.WORLD) as a:
            for n in (1, 32, M):
                _fill(gpu, a, rank)
                views = {k: torch.from_dlpack(a.view(k)) for k in NAMES}
                ref = {k: v[:n].clone() for k, v in views.items()}
                for v in ref.values():
                    dist.all_reduce(v)
                torch.cuda.synchronize()
                dist.barrier()
                a.peer_all_reduce(list(NAMES), tokens=n)
                torch.cuda.synchronize()
                out[n] = all(torch.equal(views[k][:n].view(torch.uint8), ref[k].view(torch.uint8))
                             for k in NAMES)             # the bits, NaN or not
                del views
                dist.barrier()
    finally:
        dist.destroy_process_group()
    return out


@pytest.mark.two_gpus
def test_the_same_bits_as_nccl(tmp_path):
    pytest.importorskip("torch")
    outs = run_ranks(rank_nccl, 2, args=(str(tmp_path),), timeout=300)
    for out in outs:
        assert out == {1: True, 32: True, M: True}, out
