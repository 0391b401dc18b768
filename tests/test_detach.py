"""detach_peers / attach_peers on the host backend (docs/checkpoint.md): two
ranks (spawned processes) share their memfd slabs, detach (the peer's pages
unmapped and its descriptor closed, the address range still reserved),
write while detached, attach again (new descriptors over the sockets kept
from construction) and find the peer's memory at the same addresses with
what the peer wrote meanwhile.  Counted against /proc (mappings of memfds,
descriptors) and the backend's handle counts; the CUDA half is
tests/test_detach_cuda.py."""

import ctypes
import time

import numpy as np
import pytest

import metrale
from metrale import BufferArena, MetraleError
from metrale.tp import PeerGroup, shared_arenas

from helpers import COMPACT, FileGroup, OneRank, process_resources, run_ranks

CFG = COMPACT
LIMITS = (64, 512, 16, 8)


def _bytes_at(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))


def _group(path, rank, size, timeout=20.0):
    return PeerGroup(FileGroup(path, rank, size), timeout=timeout)


def _memfd_maps():
    with open("/proc/self/maps") as f:
        return sum("memfd:metrale" in line for line in f)


def rank_cycle(rank, size, path, cycles):
    gpu = metrale.HostBackend()
    grp = _group(path, rank, size)
    other = 1 - rank
    out = {"reads": [], "same_addresses": True}
    with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
        n = a.nbytes("hidden_states")
        theirs = a.peer(other).hidden_states()
        peer_buffers = a.peer(other)
        out["listed"] = shared_arenas() == [a]
        attached = (_memfd_maps(), gpu.handle_count, gpu.import_count)
        fds0 = process_resources()[0]
        for k in range(cycles):
            _bytes_at(a.hidden_states(), n)[:] = 2 * k + rank
            grp.all_gather(("written", k))
            seen = int(_bytes_at(theirs, n).min()), int(_bytes_at(theirs, n).max())
            grp.all_gather(("read", k))
            a.detach_peers()
            a.detach_peers()                            # again: nothing more to do
            detached = (_memfd_maps(), gpu.handle_count, a.peers_detached())
            with pytest.raises(MetraleError, match="detached"):
                a.peer(other)
            with pytest.raises(MetraleError, match="detached"):
                a.peer_all_reduce("hidden_states", tokens=1)
            a.check_peer_reduce()                       # its own status: readable detached
            # this rank's own memory is untouched: write the next pattern now
            _bytes_at(a.hidden_states(), n)[:] = 100 + 2 * k + rank
            grp.all_gather(("detached", k))
            t0 = time.perf_counter()
            a.attach_peers(timeout=20)
            attach_s = time.perf_counter() - t0
            out["same_addresses"] &= (a.peer(other).hidden_states() == theirs and
                                      peer_buffers.hidden_states() == theirs)
            seen_after = int(_bytes_at(theirs, n).min()), int(_bytes_at(theirs, n).max())
            out["reads"].append((seen, detached, seen_after, a.peers_detached(), attach_s))
            grp.all_gather(("attached", k))
        out["attached"] = attached
        out["after"] = (_memfd_maps(), gpu.handle_count, process_resources()[0] - fds0)
        out["imports"] = gpu.import_count - attached[2]
        # sums through the mappings made again
        a.peer_all_reduce("hidden_states", tokens=1)
        grp.all_gather("reduced")
        with pytest.raises(MetraleError, match="attached"):
            a.attach_peers()
        grp.all_gather("done")
    out["released"] = (_memfd_maps(), gpu.handle_count, shared_arenas())
    return out


def rank_no_attach(rank, size, path):
    """Rank 1 detaches but never attaches: rank 0's attach gives up after its
    timeout, naming rank 1, and stays detached."""
    gpu = metrale.HostBackend()
    grp = _group(path, rank, size)
    out = {}
    with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
        a.detach_peers()
        if rank == 0:
            t0 = time.perf_counter()
            with pytest.raises(MetraleError, match=r"no slab from rank\(s\) \[1\]"):
                a.attach_peers(timeout=1.0)
            out["waited"] = time.perf_counter() - t0
            out["detached"] = a.peers_detached()
        grp.all_gather("done")
    out["left"] = (_memfd_maps(), gpu.handle_count, gpu.reserved_bytes)
    return out


def rank_dies_detached(rank, size, path):
    """Rank 1 detaches and exits; rank 0 attaches with a timeout of an hour:
    the wait ends at once (its socket refuses, or its process is gone),
    naming rank 1, and the arena stays detached."""
    import os
    gpu = metrale.HostBackend()
    grp = _group(path, rank, size)
    a = BufferArena.new(CFG, *LIMITS, gpu, group=grp)
    a.detach_peers()
    pids = grp.all_gather(os.getpid())
    if rank == 1:
        os._exit(0)
    deadline = time.monotonic() + 30        # rank 1's process gone
    while time.monotonic() < deadline and not metrale._sharing._tp_exchange._gone(pids[1]):
        time.sleep(0.01)
    t0 = time.perf_counter()
    with pytest.raises(MetraleError, match="rank 1") as e:
        a.attach_peers(timeout=3600)
    out = {"waited": time.perf_counter() - t0, "detached": a.peers_detached(),
           "message": str(e.value)}
    a.release()
    out["left"] = (_memfd_maps(), gpu.handle_count, gpu.reserved_bytes)
    return out


def test_a_dead_peer_ends_the_attach_at_once(tmp_path):
    out = run_ranks(rank_dies_detached, 2, args=(str(tmp_path),), timeout=120, dead=(1,))[0]
    assert out["waited"] < 5 and out["detached"], out
    assert "gone" in out["message"] and "not waited for" in out["message"], out["message"]
    assert out["left"] == (0, 0, 0)


def test_detach_and_attach_keep_the_addresses(tmp_path):
    cycles = 20
    outs = run_ranks(rank_cycle, 2, args=(str(tmp_path), cycles), timeout=200)
    for rank, out in enumerate(outs):
        other = 1 - rank
        assert out["listed"] and out["same_addresses"]
        maps, handles, _ = out["attached"]
        for k, (seen, detached, seen_after, still, _secs) in enumerate(out["reads"]):
            assert seen == (2 * k + other,) * 2
            # the peer's slab and signal area unmapped and released; its own kept
            assert detached == (maps - 2, handles - 2, True)
            assert seen_after == (100 + 2 * k + other,) * 2       # written while detached
            assert still is False
        assert out["after"] == (maps, handles, 0)
        assert out["imports"] == 2 * cycles                   # slab and signal, each cycle
        assert out["released"] == (0, 0, [])


def test_a_peer_that_never_attaches_is_a_timeout(tmp_path):
    outs = run_ranks(rank_no_attach, 2, args=(str(tmp_path),), timeout=120)
    assert 1.0 <= outs[0]["waited"] < 10 and outs[0]["detached"]
    for out in outs:
        assert out["left"] == (0, 0, 0)


def test_unshared_and_single_rank_arenas():
    gpu = metrale.HostBackend()
    with BufferArena.new(CFG, *LIMITS, gpu) as a:
        assert a.detach_peers() is None and not a.peers_detached()
        with pytest.raises(MetraleError, match="not shared"):
            a.attach_peers()
        assert shared_arenas() == []
    with BufferArena.new(CFG, *LIMITS, gpu, group=OneRank()) as a:
        assert shared_arenas() == [a]
        a.detach_peers()
        assert a.peers_detached()
        assert a.peer(0).hidden_states() == a.hidden_states()      # its own: still there
        with pytest.raises(MetraleError, match="detached"):      # as on a group of two
            a.peer_all_reduce("hidden_states", tokens=1)
        a.attach_peers()
        a.peer_all_reduce("hidden_states", tokens=1)
        assert not a.peers_detached()
    assert shared_arenas() == []
    with pytest.raises(MetraleError, match="released"):
        a.detach_peers()


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError),
                                        (float("inf"), ValueError), ("1", TypeError),
                                        (True, TypeError)])
def test_attach_timeout_is_checked(bad, error):
    with BufferArena.new(CFG, *LIMITS, metrale.HostBackend(), group=OneRank()) as a:
        a.detach_peers()
        with pytest.raises(error, match="timeout"):
            a.attach_peers(timeout=bad)
        assert a.peers_detached()


def test_a_failed_unmap_in_detach_still_unmaps_the_other_peers():
    """PeerSlabs.detach and close try every peer whatever failed before (a
    failed unmap of one peer's slab used to skip the peers after it and the
    retry of failed releases)."""
    import os
    from metrale._sharing._peer_slabs import PeerSlabs
    from metrale.testing import FaultyBackend
    gpu = FaultyBackend()
    page = 4096
    fds = []
    for _ in range(3):                  # three peers' slabs of two pages: memfds as theirs
        fd = os.memfd_create("peer")
        os.ftruncate(fd, 2 * page)
        fds.append(fd)
    slabs = PeerSlabs(gpu)
    try:
        for r, fd in enumerate(fds):
            slabs.map_peer(r, 2 * page, [(0, 2 * page)], [fd])
        assert slabs.mapped() == (3, 6 * page)
        gpu.inject_fault("unmap", 1)
        with pytest.raises(MetraleError, match="INJECTED_FAULT"):
            slabs.detach()
        assert slabs.mapped() == (1, 2 * page)      # the two others are unmapped
        slabs.detach()
        assert slabs.mapped() == (0, 0)
        slabs.close()
        assert (gpu.reserved_bytes, gpu.mapped_bytes, gpu.handle_count) == (0, 0, 0)
    finally:
        for fd in fds:
            os.close(fd)
