"""Tensor-parallel arenas (docs/tensor-parallel.md) on the host backend, with
real processes: two ranks (multiprocessing, spawn) over a file-backed group
double, memfd slabs passed over Unix sockets and mapped by the peer.  What
each rank sees is checked against independent expectations: bytes written by
the other process, offsets from unshared arenas, /proc counts of descriptors
and mappings.  The CUDA half is tests/test_tp_cuda.py."""

import ctypes
import os
import pathlib

import pytest

import metrale
from metrale import BufferArena, MetraleError, OutOfMemoryError
from metrale._arena._summary import Pin
from metrale.sizes import BUFFER_NAMES
from metrale.testing import FaultyBackend
from metrale.tp import PeerBuffers, PeerGroup

from helpers import COMPACT, FileGroup, process_resources, run_ranks, under_asan, vm_counts
from reference_oracle import POINTER

CFG = COMPACT
LIMITS = (64, 512, 16, 8)


def _bytes_at(ptr, n):
    """A writable numpy view of n bytes at address ptr of this process."""
    import numpy as np
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))


def _group(path, rank, size, timeout=20.0, **kw):
    return PeerGroup(FileGroup(path, rank, size, **kw), timeout=timeout)


def _counts(gpu):
    return vm_counts(gpu) + (gpu.live_alloc_count,)


def _warm():
    """Load what a first shared arena loads (extension modules add mappings),
    so that /proc counts taken afterwards compare like with like."""
    import metrale._arena._peer  # noqa: F401
    import metrale.tp  # noqa: F401
    with BufferArena.new(CFG, *LIMITS, metrale.HostBackend(), group=SoloGroup()):
        pass


# -- what each rank runs (module level: spawn imports this module) -----------------

def rank_share(rank, size, path):
    """Share, then talk through the memory: each rank writes its pattern, reads
    every peer's, rewrites, zeroes; report what it saw."""
    gpu = metrale.HostBackend()
    grp = _group(path, rank, size)
    out = {}
    with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
        n = a.sizes().hidden_states
        out["ranks"] = a.peer_ranks()
        out["counts"] = (gpu.export_count, gpu.import_count, gpu.handle_count)
        out["pins"] = a.pins()
        try:
            a.sleep()
        except MetraleError as e:
            out["refusal"] = str(e)
        own = {name: getattr(a, name)() for name in POINTER}
        same = True
        for r in range(size):
            pb = a.peer(r)
            for name, p in own.items():
                q = getattr(pb, name)()
                if p == 0:
                    same &= q == 0
                else:
                    same &= q - pb.hidden_states() == p - own["hidden_states"]
        out["same_offsets"] = same
        out["self_is_own"] = all(getattr(a.peer(rank), k)() == v for k, v in own.items())
        out["distinct"] = len({a.peer(r).hidden_states() for r in range(size)}) == size
        _bytes_at(a.hidden_states(), n)[:] = 0x10 + rank
        grp.all_gather("written")
        out["read"] = [int(_bytes_at(a.peer(r).hidden_states(), n).min()) for r in range(size)] + \
                      [int(_bytes_at(a.peer(r).hidden_states(), n).max()) for r in range(size)]
        grp.all_gather("read")
        # rank r writes into the next rank's buffer through its mapping
        nxt = (rank + 1) % size
        _bytes_at(a.peer(nxt).residual(), a.sizes().residual)[:] = 0x40 + rank
        grp.all_gather("rewritten")
        res = _bytes_at(a.residual(), a.sizes().residual)
        out["residual"] = (int(res.min()), int(res.max()))
        a.zero_all()                 # per-step work: no export, no import
        grp.all_gather("zeroed")
        out["peer_zeroed"] = all(not _bytes_at(a.peer(r).hidden_states(), n).any()
                                 for r in range(size))
        out["counts_after_steps"] = (gpu.export_count, gpu.import_count, gpu.handle_count)
        peer = a.peer(nxt)
        out["same_object"] = a.peer(nxt) is peer
        grp.all_gather("done")
    out["after_release"] = (peer.hidden_states(), peer.ptr("logits"), _counts(gpu))
    return out


def rank_mismatch(rank, size, path):
    """Rank 1 asks for twice the tokens: every rank must refuse, naming the
    same buffer, with nothing left behind."""
    gpu = metrale.HostBackend()
    limits = (128,) + LIMITS[1:] if rank == 1 else LIMITS
    _warm()
    before = process_resources()
    with pytest.raises(MetraleError) as e:
        BufferArena.new(CFG, *limits, gpu, group=_group(path, rank, size))
    return str(e.value), _counts(gpu), process_resources() == before


def rank_build_fails(rank, size, path, op, nth):
    """Rank 1's backend fails `op`: rank 1 raises that error, the others a
    MetraleError naming rank 1; nobody waits, nothing is left."""
    gpu = FaultyBackend()
    if rank == 1:
        gpu.inject_fault(op, nth)
    _warm()
    before = process_resources()
    try:
        BufferArena.new(CFG, *LIMITS, gpu, group=_group(path, rank, size))
    except Exception as e:
        err = (type(e).__name__, str(e))
    else:
        err = None
    return err, _counts(gpu), process_resources() == before


def rank_dies(rank, size, path, when):
    """Rank 1 exits without a word: before its first all-gather ("start") or
    right after it ("setup").  Rank 0 must raise, not hang."""
    import time
    gpu = metrale.HostBackend()
    if rank == 1 and when == "start":
        os._exit(3)
    fg = FileGroup(path, rank, size, timeouts={0: 3.0} if when == "start" else {1: 3.0},
                   die_after=0 if rank == 1 else None)
    _warm()
    before = process_resources()
    t0 = time.monotonic()
    with pytest.raises(MetraleError) as e:
        BufferArena.new(CFG, *LIMITS, gpu, group=PeerGroup(fg, timeout=2.0))
    return str(e.value), time.monotonic() - t0, _counts(gpu), process_resources() == before


# A local process that connects to a rank's socket and says nothing.
STRANGER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(bytes.fromhex(sys.argv[1]).decode())
print("connected", flush=True)
time.sleep(60)
"""


class StrangerGroup(FileGroup):
    """A FileGroup that, once the ranks have gathered their socket names,
    has a stranger process connect to this rank's socket (and stay silent)
    before any rank goes on: the strangers come first in every queue."""

    strangers = []

    def all_gather_object(self, object_list, obj):
        import subprocess
        import sys
        import time
        super().all_gather_object(object_list, obj)
        if isinstance(obj, dict) and "socket" in obj and not self.strangers:
            p = subprocess.Popen([sys.executable, "-c", STRANGER, obj["socket"].encode().hex()],
                                 stdout=subprocess.PIPE, text=True)
            self.strangers.append(p)
            assert p.stdout.readline().strip() == "connected"
            mark = os.path.join(self.path, f"stranger.{self._rank}")
            open(mark, "w").close()
            deadline = time.monotonic() + 30
            while not all(os.path.exists(os.path.join(self.path, f"stranger.{r}"))
                          for r in range(self._size)):
                assert time.monotonic() < deadline, "the other rank's stranger never connected"
                time.sleep(0.005)


def rank_with_stranger(rank, size, path, credentials):
    """A silent stranger on every rank's socket is ignored: setup succeeds,
    promptly.  With credentials "unknown" the peer credentials are taken as
    unreadable (another pid namespace), so the stranger is not closed at
    once and must not hold up the real peer's message."""
    import time
    import metrale._sharing._tp_exchange as exchange
    if credentials == "unknown":
        exchange._peer_rank = lambda conn, pids: None
    gpu = metrale.HostBackend()
    t0 = time.monotonic()
    try:
        with BufferArena.new(CFG, *LIMITS, gpu,
                             group=PeerGroup(StrangerGroup(path, rank, size), timeout=20.0)) as a:
            ok = a.peer(1 - rank).hidden_states() != 0 and gpu.import_count == 2   # slab, signal
    finally:
        for p in StrangerGroup.strangers:
            p.kill()
            p.wait()
    return ok, time.monotonic() - t0


@pytest.mark.parametrize("credentials", ["known", "unknown"])
def test_a_silent_stranger_on_a_rank_socket_is_ignored(tmp_path, credentials):
    outs = run_ranks(rank_with_stranger, 2, args=(str(tmp_path), credentials), timeout=120)
    for ok, seconds in outs:
        assert ok and seconds < 15, outs


def rank_malformed(rank, size, path, header):
    """Rank 1 sends rank 0 a malformed header: every rank raises the same
    MetraleError naming rank 1, promptly (not after the group's timeout),
    with nothing left behind."""
    import time
    import metrale._sharing._tp_exchange as exchange
    if rank == 1:
        exchange._header = lambda me, to, chunks, error: header
    gpu = metrale.HostBackend()
    _warm()
    before = process_resources()
    t0 = time.monotonic()
    with pytest.raises(MetraleError) as e:
        BufferArena.new(CFG, *LIMITS, gpu, group=_group(path, rank, size, timeout=60.0))
    return str(e.value), time.monotonic() - t0, _counts(gpu), process_resources() == before


@pytest.mark.parametrize("header", [b'{"rank": 1, "to": 0, "chunks": 5}',
                                    b'{"rank": 1, "to": 0, "chunks": [[0, "x"]]}',
                                    b'{"rank": 1, "to": 0}', b"[1, 2", b"\xff\x00",
                                    b'{"rank": 1, "to": 0, "chunks": [[0, 4096]]}'])
def test_a_malformed_header_fails_every_rank_promptly(tmp_path, header):
    outs = run_ranks(rank_malformed, 2, args=(str(tmp_path), header), timeout=120)
    (m0, t0, c0, u0), (m1, t1, c1, u1) = outs
    assert m0 == m1 and "rank 0 failed to map rank 1's slab" in m0, outs
    assert t0 < 30 and t1 < 30
    assert c0 == c1 == (0, 0, 0, 0) and u0 and u1


def rank_remote(rank, size, path):
    """Rank 1 claims another host: nothing is mapped between them."""
    import metrale.tp as tp
    if rank == 1:
        tp._host_key = lambda: "another-host/net"
    gpu = metrale.HostBackend()
    with BufferArena.new(CFG, *LIMITS, gpu, group=_group(path, rank, size)) as a:
        other = 1 - rank
        with pytest.raises(MetraleError, match="another host"):
            a.peer(other)
        return a.peer_ranks(), gpu.import_count, a.peer(rank).hidden_states() == a.hidden_states()


def rank_cycles(rank, size, path, cycles):
    """Build and release a shared arena `cycles` times: every descriptor,
    mapping and byte comes back."""
    from helpers import statm_resident
    gpu = metrale.HostBackend()
    grp = _group(path, rank, size)

    def once():
        with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
            _bytes_at(a.peer(1 - rank).hidden_states(), 4096)[:] = 1   # touch the peer's pages

    once()                      # first use: imports, caches
    before, rss = process_resources(), statm_resident()
    for _ in range(cycles):
        once()
    after = process_resources()
    return before, after, statm_resident() - rss, _counts(gpu), gpu.export_count, gpu.import_count


# -- two processes -----------------------------------------------------------------

def test_two_ranks_share_their_slabs(tmp_path):
    outs = run_ranks(rank_share, 2, args=(str(tmp_path),))
    for rank, out in enumerate(outs):
        assert out["ranks"] == (0, 1)
        # one chunk (reserved at its limits: one run of granules) and the
        # signal area of peer_all_reduce, each exported once, the peer's
        # imported once
        exports, imports, handles = out["counts"]
        assert exports == handles - imports and imports == exports     # each handle once, each way
        assert exports == 2, "an arena reserved at its limits is one chunk, plus its signal area"
        # the ledger: what pins the memory, named by the sleep it refuses
        assert out["pins"] == (Pin("peer_export", None, 2), Pin("peer_import", None, 2))
        assert "(peer_export: 2, peer_import: 2)" in out["refusal"]
        assert out["counts_after_steps"] == out["counts"]
        assert out["same_offsets"] and out["self_is_own"] and out["distinct"]
        assert out["read"] == [0x10, 0x11, 0x10, 0x11]          # min per rank, max per rank
        writer = (rank - 1) % 2
        assert out["residual"] == (0x40 + writer, 0x40 + writer)
        assert out["peer_zeroed"] and out["same_object"]
        assert out["after_release"] == (0, 0, (0, 0, 0, 0))


def _first_difference(limits_a, limits_b):
    """The first buffer, in the slab order of an arena at `limits_a`, whose
    offset or size differs at `limits_b`: unshared reserved arenas read through
    the public API."""
    gpu = metrale.HostBackend()
    with BufferArena.new(CFG, *limits_a, gpu, reserve=limits_a) as a, \
            BufferArena.new(CFG, *limits_b, gpu, reserve=limits_b) as b:
        rows = [(a.buffers[n].offset or 0, i, n) for i, n in enumerate(BUFFER_NAMES)]
        for _, _, n in sorted(rows):
            if (a.buffers[n].offset, a.buffers[n].nbytes) != (b.buffers[n].offset, b.buffers[n].nbytes):
                return n
    return None


def test_different_layouts_are_refused_on_every_rank(tmp_path):
    outs = run_ranks(rank_mismatch, 2, args=(str(tmp_path),))
    name = _first_difference(LIMITS, (128,) + LIMITS[1:])
    assert name is not None
    assert outs[0][0] == outs[1][0]                 # the same message on both ranks
    assert f"disagree on buffer {name!r}" in outs[0][0]
    assert "rank 1 and rank 0" in outs[0][0]
    for _, counts, unchanged in outs:
        assert counts == (0, 0, 0, 0) and unchanged


@pytest.mark.parametrize("op,nth,error", [
    ("reserve", 1, "OutOfMemoryError"), ("create", 1, "OutOfMemoryError"),
    ("export", 1, "MetraleError"), ("import", 1, "MetraleError"),
    # the maps and reservations, in order: its own slab's, its own signal
    # area's, the peer's signal area's, the peer's slab's
    ("map", 2, "MetraleError"), ("map", 3, "MetraleError"), ("map", 4, "MetraleError"),
    ("reserve", 2, "MetraleError"), ("reserve", 4, "MetraleError")])
def test_a_failing_rank_fails_every_rank(tmp_path, op, nth, error):
    outs = run_ranks(rank_build_fails, 2, args=(str(tmp_path), op, nth))
    (e0, c0, u0), (e1, c1, u1) = outs
    assert e1 is not None and e1[0] == error, e1
    assert e0 is not None and e0[0] == "MetraleError", e0
    if nth == 1 and op in ("reserve", "create"):      # rank 1 never got to share
        assert "rank 1 failed to build its arena" in e0[1] and "OutOfMemoryError" in e0[1]
    elif op == "export" or nth == 2:        # its own handles: exported with the slab
        assert "rank 1 could not export" in e0[1] and e1[1] == e0[1]
    else:                                   # rank 1 failed mapping rank 0's slab
        assert "rank 1 failed to map" in e0[1] and e1[1] == e0[1]
    assert c0 == c1 == (0, 0, 0, 0)
    assert u0 and u1


@pytest.mark.parametrize("when", ["start", "setup"])
def test_a_dead_rank_gives_an_error_not_a_hang(tmp_path, when):
    outs = run_ranks(rank_dies, 2, args=(str(tmp_path), when), dead=(1,))
    msg, seconds, counts, unchanged = outs[0]
    assert "all_gather_object over the group failed on rank 0" in msg
    assert "did not arrive" in msg and "[1]" in msg
    if when == "setup":                     # the descriptors never came, and nobody waited
        assert "no slab from rank 1: its process" in msg or "rank 1, which is gone" in msg, msg
    assert seconds < 30
    assert counts == (0, 0, 0, 0) and unchanged


def test_a_rank_on_another_host_is_not_mapped(tmp_path):
    outs = run_ranks(rank_remote, 2, args=(str(tmp_path),))
    assert outs[0] == ((0,), 0, True)
    assert outs[1] == ((1,), 0, True)


def test_create_destroy_cycles_leak_nothing(tmp_path):
    outs = run_ranks(rank_cycles, 2, args=(str(tmp_path), 100), timeout=300)
    for before, after, rss_growth, counts, exports, imports in outs:
        assert after == before                  # descriptors, mappings, memfd mappings
        assert after[2] == 0
        assert counts == (0, 0, 0, 0)
        assert (exports, imports) == (202, 202)     # a slab and a signal area each time
        # the slabs are a few MiB each: none kept (ASan's quarantine keeps
        # freed memory resident by design, so not measured under it)
        assert under_asan() or rss_growth < 4 << 20


# -- one process -------------------------------------------------------------------

class SoloGroup:
    def rank(self):
        return 0

    def size(self):
        return 1

    def all_gather_object(self, object_list, obj):
        object_list[0] = obj


def test_reshapes_are_refused_and_change_nothing():
    gpu = metrale.HostBackend()
    with BufferArena.new(CFG, *LIMITS, gpu, group=SoloGroup()) as a:
        hs, committed = a.hidden_states(), a.committed_bytes()
        for call in (lambda: a.sleep(), lambda: a.wake(), lambda: a.resize(max_batch_tokens=32)):
            with pytest.raises(MetraleError, match="shared with its tensor-parallel peers"):
                call()
        assert a.hidden_states() == hs and a.committed_bytes() == committed
        assert not a.is_sleeping() and a.max_batch_tokens() == LIMITS[0]
        a.zero_all()
        assert a.is_reserved()


def test_reserve_with_group_is_the_reserved_layout():
    gpu = metrale.HostBackend()
    top = (128, 1024, 16, 16)
    with BufferArena.new(CFG, *LIMITS, gpu, reserve=top, group=SoloGroup()) as a, \
            BufferArena.new(CFG, *LIMITS, gpu, reserve=top) as b:
        assert a.slab_bytes() == b.slab_bytes()
        assert [a.buffers[n].offset for n in BUFFER_NAMES] == [b.buffers[n].offset for n in BUFFER_NAMES]
        with pytest.raises(MetraleError, match="shared"):
            a.resize(max_batch_tokens=128)
    assert vm_counts(gpu) == (0, 0, 0)


def test_peer_arguments_and_states():
    gpu = metrale.HostBackend()
    with BufferArena.new(CFG, *LIMITS, gpu) as plain:
        with pytest.raises(MetraleError, match="not shared"):
            plain.peer(0)
        assert plain.peer_ranks() == ()
    a = BufferArena.new(CFG, *LIMITS, gpu, group=SoloGroup())
    with pytest.raises(TypeError, match="rank"):
        a.peer("0")
    with pytest.raises(TypeError, match="rank"):
        a.peer(True)
    with pytest.raises(ValueError, match="rank"):
        a.peer(1)
    with pytest.raises(ValueError, match="rank"):
        a.peer(-1)
    p = a.peer(0)
    assert isinstance(p, PeerBuffers) and p.rank == 0
    with pytest.raises(ValueError, match="name"):
        p.ptr("nope")
    with pytest.raises(TypeError, match="name"):
        p.ptr(3)
    assert p.ptr("hidden_states") == a.hidden_states()
    a.release()
    with pytest.raises(MetraleError, match="released"):
        a.peer(0)
    assert p.hidden_states() == 0 and p.ptr("logits") == 0


def test_bad_groups_are_refused_before_anything_is_allocated():
    gpu = metrale.HostBackend()

    class NoRank:
        def all_gather_object(self, out, obj):
            out[0] = obj

    class BadRank(SoloGroup):
        def rank(self):
            return 1

    for group, exc, match in ((object(), TypeError, "group"), (NoRank(), TypeError, "rank"),
                              (BadRank(), ValueError, "rank 1")):
        with pytest.raises(exc, match=match):
            BufferArena.new(CFG, *LIMITS, gpu, group=group)
    with pytest.raises(ValueError, match="timeout"):
        PeerGroup(SoloGroup(), timeout=0)
    with pytest.raises(TypeError, match="timeout"):
        PeerGroup(SoloGroup(), timeout="1")
    assert _counts(gpu) == (0, 0, 0, 0) and gpu.alloc_count == 0


def test_peer_group_forms():
    class Torchish:                     # the torch.distributed module's spelling
        def get_rank(self):
            return 2

        def get_world_size(self):
            return 4

        def all_gather_object(self, out, obj):
            out[:] = [obj] * 4

    g = PeerGroup(Torchish(), timeout=5)
    assert (g.rank(), g.size(), g.timeout) == (2, 4, 5.0)
    assert g.all_gather("x") == ["x"] * 4
    assert PeerGroup(g).group is g.group

    class Failing(SoloGroup):
        def all_gather_object(self, out, obj):
            raise RuntimeError("store timed out")

    with pytest.raises(MetraleError, match="store timed out"):
        PeerGroup(Failing()).all_gather(1)


def test_a_failed_solo_build_leaves_nothing():
    for op in ("reserve", "create", "map", "memset"):
        gpu = FaultyBackend()
        gpu.inject_fault(op)
        with pytest.raises((MetraleError, OutOfMemoryError)):
            BufferArena.new(CFG, *LIMITS, gpu, group=SoloGroup())
        assert _counts(gpu) == (0, 0, 0, 0), op


def test_peer_accessors_follow_the_buffer_table():
    import ast
    accessors = {n for n in vars(PeerBuffers) if n in BUFFER_NAMES}
    assert accessors == set(POINTER)
    for n in POINTER:
        assert callable(getattr(BufferArena, n))
    stub = ast.parse((pathlib.Path(metrale.__file__).parent / "_arena" / "tp.pyi").read_text())
    cls = next(c for c in stub.body if isinstance(c, ast.ClassDef) and c.name == "PeerBuffers")
    assert {f.name for f in cls.body if isinstance(f, ast.FunctionDef)} - {"__init__", "ptr"} \
        == set(POINTER)
