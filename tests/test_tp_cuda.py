"""Tensor-parallel arenas on two GPUs (docs/tensor-parallel.md): two ranks
(spawned processes, one device each, the file-backed group double of
tests/helpers.py, no torch) share their slabs as POSIX-fd handles and read and
write each other's buffers through the peer mappings.  Marked two_gpus (skipped
without two CUDA devices); the host half of the protocol is tests/test_tp.py."""

import pytest

import metrale
from metrale import BufferArena
from metrale.tp import PeerGroup

from helpers import COMPACT, FileGroup, process_resources, run_ranks, vm_counts

CFG = COMPACT
LIMITS = (64, 512, 16, 8)

pytestmark = pytest.mark.two_gpus


def cuda_rank_share(rank, size, path, cycles):
    gpu = metrale.CudaBackend(rank)
    grp = PeerGroup(FileGroup(path, rank, size), timeout=60)
    out = {}
    with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
        other = 1 - rank
        n = a.sizes().hidden_states
        out["counts"] = (gpu.export_count, gpu.import_count)
        out["ranks"] = a.peer_ranks()
        p = a.peer(other)
        out["offsets"] = (p.logits() - p.hidden_states() == a.logits() - a.hidden_states())
        gpu.upload(a.hidden_states(), bytes([0x10 + rank]) * n)
        grp.all_gather("written")
        out["peer_read"] = set(gpu.download(p.hidden_states(), n))
        grp.all_gather("read")
        gpu.upload(p.residual(), bytes([0x40 + rank]) * a.sizes().residual)   # into the peer
        grp.all_gather("rewritten")
        out["residual"] = set(gpu.download(a.residual(), a.sizes().residual))
        a.zero_all()
        gpu.synchronize()
        grp.all_gather("zeroed")
        out["peer_zeroed"] = set(gpu.download(p.hidden_states(), n))
        out["counts_after"] = (gpu.export_count, gpu.import_count)
        grp.all_gather("done")
    grp.all_gather("released")
    fds, maps, _ = process_resources()
    free0 = gpu.mem_info()[0]
    for _ in range(cycles):
        with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
            a.zero_all()
    grp.all_gather("cycled")
    fds1, maps1, _ = process_resources()
    out["leak"] = (fds1 - fds, maps1 - maps, free0 - gpu.mem_info()[0], vm_counts(gpu))
    return out


def test_two_gpus_share_their_slabs(tmp_path):
    outs = run_ranks(cuda_rank_share, 2, args=(str(tmp_path), 20), timeout=600)
    for rank, out in enumerate(outs):
        other = 1 - rank
        assert out["counts"] == (1, 1) and out["counts_after"] == (1, 1)
        assert out["ranks"] == (0, 1) and out["offsets"]
        assert out["peer_read"] == {0x10 + other}
        assert out["residual"] == {0x40 + other}
        assert out["peer_zeroed"] == {0}
        assert out["leak"] == (0, 0, 0, (0, 0, 0)), out["leak"]
