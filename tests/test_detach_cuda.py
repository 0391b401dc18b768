"""detach_peers / attach_peers on CUDA (docs/checkpoint.md): two ranks
(spawned processes; with one device both run on it) share their slabs,
capture one graph of peer_all_reduce (it reads the peer's memory through the
mapping), detach (the imported handles unmapped and released: the driver's
import count back to zero), attach again at the same addresses and replay
the same graph: sums checked against helpers.expected_sum.  Each cycle's
detach and attach times are returned (docs/checkpoint.md quotes them)."""

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


def _input(a, rank):
    width = a.nbytes("hidden_states") // M // 2
    return rank_input(rank, "hidden_states", M, width, "bfloat16"), width


def _rank_setup(rank, size, path):
    """torch, this rank's backend (with one device, both ranks on it) and
    its group."""
    torch = pytest.importorskip("torch")
    dev = rank % cuda_device_count()
    torch.cuda.set_device(dev)
    return torch, metrale.CudaBackend(dev), PeerGroup(FileGroup(path, rank, size), timeout=60)


def _capture_reduce(torch, a, grp):
    """One graph of peer_all_reduce over every row of hidden_states,
    captured on every rank."""
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    grp.all_gather("capture")
    with torch.cuda.graph(g, stream=s):
        a.peer_all_reduce("hidden_states", stream=s, tokens=M)
    torch.cuda.synchronize()
    return g


def rank_detach(rank, size, path, cycles):
    torch, gpu, grp = _rank_setup(rank, size, path)
    other = 1 - rank
    out = {"ok": [], "times": []}
    with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
        theirs = a.peer(other).hidden_states()
        handles = gpu.handle_count
        g = _capture_reduce(torch, a, grp)
        for k in range(cycles):
            mine, width = _input(a, rank + 2 * k)
            gpu.upload(a.hidden_states(), mine.tobytes())
            gpu.synchronize()
            grp.all_gather(("filled", k))
            t0 = time.perf_counter()
            a.detach_peers()
            t1 = time.perf_counter()
            detached = (gpu.handle_count, a.peers_detached())
            try:
                a.peer_all_reduce("hidden_states", tokens=1)
                refused = False
            except MetraleError:
                refused = True
            grp.all_gather(("detached", k))
            t2 = time.perf_counter()
            a.attach_peers(timeout=60)
            t3 = time.perf_counter()
            grp.all_gather(("attached", k))
            g.replay()
            torch.cuda.synchronize()
            got = np.frombuffer(gpu.download(a.hidden_states(), a.nbytes("hidden_states")),
                                np.uint16).reshape(M, width)
            inputs = [_input(a, r + 2 * k)[0] for r in range(size)]
            out["ok"].append((np.array_equal(got, expected_sum(inputs, "bfloat16")),
                              detached == (handles - 2, True), refused,
                              a.peer(other).hidden_states() == theirs, gpu.handle_count == handles))
            out["times"].append((t1 - t0, t3 - t2))
            grp.all_gather(("checked", k))
        del g
        a.check_peer_reduce()
        grp.all_gather("done")
    return out


@pytest.mark.gpu
def test_detach_attach_and_the_same_graph_replays(tmp_path):
    outs = run_ranks(rank_detach, 2, args=(str(tmp_path), 5), timeout=400)
    for out in outs:
        assert out["ok"] and all(all(c) for c in out["ok"]), out["ok"]
        print("detach, attach seconds:", out["times"])


def rank_checkpoint(rank, size, path):
    """A TP pair with peer-mapped slabs and one captured graph of
    peer_all_reduce (it reads the peer's memory): each rank detaches
    (checkpoint.prepare), checkpoints and restores itself, attaches again
    (checkpoint.finish), then the same graph replays and sums correctly."""
    import os
    import metrale.checkpoint as ckpt
    torch, gpu, grp = _rank_setup(rank, size, path)
    out = {}
    with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
        ptrs = dict(a.ptrs)
        theirs = a.peer(1 - rank).hidden_states()
        g = _capture_reduce(torch, a, grp)
        grp.all_gather("captured")
        t0 = time.perf_counter()
        ckpt.prepare()
        t1 = time.perf_counter()
        times = ckpt.suspend(os.getpid())
        out["state"] = ckpt.state(os.getpid())
        times.update(ckpt.resume(os.getpid()))
        grp.all_gather("restored")
        t2 = time.perf_counter()
        ckpt.finish()
        out["prepare_finish_s"] = (t1 - t0, time.perf_counter() - t2)
        out["times"] = times
        mine, width = _input(a, rank + 7)
        gpu.upload(a.hidden_states(), mine.tobytes())
        gpu.synchronize()
        grp.all_gather("filled")
        g.replay()
        torch.cuda.synchronize()
        got = np.frombuffer(gpu.download(a.hidden_states(), a.nbytes("hidden_states")),
                            np.uint16).reshape(M, width)
        want = expected_sum([_input(a, r + 7)[0] for r in range(size)], "bfloat16")
        out["ok"] = (np.array_equal(got, want), dict(a.ptrs) == ptrs,
                     a.peer(1 - rank).hidden_states() == theirs)
        a.check_peer_reduce()
        del g
        grp.all_gather("done")
    return out


# Measured on the one lent H200 (both ranks on it, time-sliced), 2026-12-01: after
# prepare, a self-checkpoint, resume and finish, copies through the peer mappings
# and small kernels reading and writing every region the reduction touches (both
# slabs, both signal areas; acquire / release loads and stores, ld.global.cg,
# %globaltimer) work in the restored process, and so does the zeroing kernel; the
# peer_all_reduce launch there ends in CUDA_ERROR_LAUNCH_FAILED, while the peer
# that was not checkpointed completes its own.  Unexplained: one guess, not
# tested, is that a restored context's spinning kernel cannot be time-sliced
# against the other process's (the reduction is the only kernel here that waits
# for another process).  Strict: it fails the run once it passes.
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="peer_all_reduce faults in a restored process on one shared GPU "
                          "(docs/checkpoint.md)")
@pytest.mark.gpu
def test_a_tp_pair_checkpoints_itself_and_replays_its_graph(tmp_path):
    outs = run_ranks(rank_checkpoint, 2, args=(str(tmp_path),), timeout=300)
    for out in outs:
        assert out["state"] == "checkpointed" and out["ok"] == (True, True, True), out
        print("prepare, finish s:", out["prepare_finish_s"], "steps s:", out["times"])
