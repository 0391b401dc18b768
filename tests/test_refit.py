"""metrale.refit on the host backend: a trainer writes an engine's weights in
place through one export (memfd descriptors over a Unix socket), checked
first, one copy per back-to-back run, committed (the weights' epoch counts
it), across sleeps and wakes that replace the engine's chunks; refusals that
write nothing; an engine that survives a trainer that dies.  The export under
it, `BufferArena.export_memory`, and the host backend's shareable memory
across an offload.  On the GPU: tests/test_refit_cuda.py."""

import mmap
import multiprocessing
import os
import threading

import numpy as np
import pytest

from metrale import BufferArena, BufferSizes, HostBackend, MetraleError, ModelConfig
from metrale.refit import WeightExport, WeightImport
from metrale.weights import weight_arena, weight_set

SHAPES = {"embed": ("float32", (100, 8)), "norm": ("float32", (8,)),
          "proj": ("int8", (3, 100)), "head": ("float32", (8, 16))}
BYTES = {"float32": 4, "int8": 1}


def _state(seed):
    rng = np.random.default_rng(seed)
    return {n: (rng.integers(-100, 100, s).astype(np.int8) if d == "int8"
                else rng.standard_normal(s).astype(np.float32)) for n, (d, s) in SHAPES.items()}


def _arena_bytes(arena, ws):
    """Each parameter's bytes in the arena, by name (the offsets written out:
    every one at the previous end rounded up to 256)."""
    v = np.asarray(arena.view(ws.buffer, "uint8")).copy()
    out, at = {}, 0
    for name, (dtype, shape) in SHAPES.items():
        n = BYTES[dtype] * int(np.prod(shape))
        at = -(-at // 256) * 256
        out[name] = v[at:at + n].tobytes()
        at += n
    return out


@pytest.fixture
def engine(tmp_path):
    ws = weight_set(SHAPES)
    arena = weight_arena(ws, HostBackend())
    ex = WeightExport(arena, ws, tmp_path / "weights.sock")
    yield arena, ws, ex
    ex.close()
    arena.release()


def _in_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:          # noqa: B902 - handed to the test
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_a_trainer_writes_every_weight_in_place_across_sleeps(engine):
    arena, ws, ex = engine
    epoch0 = arena.guard("weights").epochs["weights"]
    imp = WeightImport(ex.path, HostBackend())
    for cycle in range(4):
        state = _state(cycle)
        t, out = _in_thread(lambda: ex.sync(timeout=30))
        stats = imp.sync(state)
        t.join()
        assert "error" not in out, out
        assert (stats.params, stats.copies) == (4, 4)
        assert stats.nbytes == sum(a.nbytes for a in state.values())
        got = _arena_bytes(arena, ws)
        for name, a in state.items():
            assert got[name] == a.tobytes(), (cycle, name)
        # each refit one more epoch, and so is each wake
        assert out["value"] == epoch0 + 2 * cycle + 1 == arena.guard("weights").epochs["weights"]
        assert imp.epoch == out["value"] - 1
        arena.sleep()               # the chunks change: the next sync maps the new ones
        assert arena.committed_bytes() == 0
        arena.wake()
        assert _arena_bytes(arena, ws) == got
    assert imp.ws == ws
    imp.close()
    stats = arena.memory_stats()
    assert stats["imported_handles"] == 0 and not arena.pins()


def _trainer(path, seeds, conn):
    imp = WeightImport(path, HostBackend())
    for seed in seeds:
        imp.sync(_state(seed))
    imp.close()
    conn.send("done")


def test_the_trainer_is_another_process(engine):
    arena, ws, ex = engine
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=_trainer, args=(ex.path, [7, 8], there))
    p.start()
    try:
        for seed in (7, 8):
            ex.sync(timeout=60)
            got = _arena_bytes(arena, ws)
            assert all(got[n] == a.tobytes() for n, a in _state(seed).items()), seed
            arena.sleep()
            arena.wake()
        assert here.recv() == "done"
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
    assert p.exitcode == 0


def test_tensors_back_to_back_in_one_source_are_one_copy(tmp_path):
    shapes = {"a": ("float32", (64,)), "b": ("float32", (128,)), "c": ("int8", (512,))}
    ws = weight_set(shapes)         # 256, 512 and 512 bytes: no padding between them
    with weight_arena(ws, HostBackend()) as arena, \
            WeightExport(arena, ws, tmp_path / "s") as ex:
        flat = np.arange(ws.nbytes, dtype=np.uint64).astype(np.uint8)
        state = {"a": flat[:256].view(np.float32), "b": flat[256:768].view(np.float32),
                 "c": flat[768:1280].view(np.int8)}
        with WeightImport(ex.path, HostBackend()) as imp:
            t, out = _in_thread(lambda: ex.sync(timeout=30))
            assert imp.sync(state).copies == 1
            t.join()
            # separate arrays: one copy each
            t, out = _in_thread(lambda: ex.sync(timeout=30))
            assert imp.sync({n: a.copy() for n, a in state.items()}).copies == 3
            t.join()
        assert np.asarray(arena.view("weights", "uint8")).tobytes() == flat[:1280].tobytes()


@pytest.mark.parametrize("change,match,exc", [
    (lambda s: s.pop("norm"), "missing 1: 'norm'", ValueError),
    (lambda s: s.update(extra=np.zeros(3, np.float32)), "not in the weight set 1: 'extra'",
     ValueError),
    (lambda s: s.update(head=np.zeros((8, 16), np.float64)), "'head' is float64", ValueError),
    (lambda s: s.update(proj=np.zeros((100, 3), np.int8)), r"'proj' is int8 \[100, 3\]",
     ValueError),
    (lambda s: s.update(embed=np.zeros((8, 100), np.float32).T), "'embed' is not C-contiguous",
     ValueError),
    (lambda s: s.update(norm=[0.0] * 8), "'norm' must be a torch tensor or a numpy array",
     TypeError),
])
def test_a_state_that_is_not_the_weight_set_is_refused_and_nothing_written(
        engine, change, match, exc):
    arena, ws, ex = engine
    imp = WeightImport(ex.path, HostBackend())
    t, out = _in_thread(lambda: ex.sync(timeout=30))
    imp.sync(_state(1))
    t.join()
    before = _arena_bytes(arena, ws)
    epoch = arena.guard("weights").epochs["weights"]
    state = _state(2)
    change(state)
    t, out = _in_thread(lambda: ex.sync(timeout=30))
    with pytest.raises(exc, match=match) as e:
        imp.sync(state)
    t.join()
    assert isinstance(out["error"], MetraleError) and "aborted" in str(out["error"])
    assert str(e.value) in str(out["error"])        # the engine is told why
    assert "nothing was written" in str(out["error"])
    assert _arena_bytes(arena, ws) == before
    assert arena.guard("weights").epochs["weights"] == epoch     # nothing written: not counted
    # the engine dropped the connection; a new trainer goes on
    imp.close()
    imp = WeightImport(ex.path, HostBackend())
    t, out = _in_thread(lambda: ex.sync(timeout=30))
    imp.sync(_state(3))
    t.join()
    assert _arena_bytes(arena, ws)["head"] == _state(3)["head"].tobytes()
    imp.close()


def _dies_after_the_offer(path):
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.recv(16)
    os._exit(3)                         # holding the descriptors: the kernel closes them


def test_an_engine_outlives_a_trainer_that_dies(engine):
    arena, ws, ex = engine
    before = _arena_bytes(arena, ws)
    p = multiprocessing.get_context("spawn").Process(target=_dies_after_the_offer,
                                                     args=(ex.path,))
    p.start()
    with pytest.raises(MetraleError, match="connection failed.*may be partly written"):
        ex.sync(timeout=30)
    p.join(30)
    assert p.exitcode == 3
    assert _arena_bytes(arena, ws) == before
    arena.sleep()                       # not held: it sleeps and wakes
    arena.wake()
    assert _arena_bytes(arena, ws) == before


def test_no_trainer_in_time(engine):
    arena, _ws, ex = engine
    with pytest.raises(MetraleError, match="no trainer connected"):
        ex.sync(timeout=0.2)
    arena.sleep()
    arena.wake()


def test_arguments_are_checked(engine, tmp_path):
    arena, ws, ex = engine
    with pytest.raises(TypeError, match="timeout"):
        ex.sync(timeout="1")
    with pytest.raises(ValueError, match="timeout"):
        ex.sync(timeout=0)
    with pytest.raises(TypeError, match="ws must be a WeightSet"):
        WeightExport(arena, {}, tmp_path / "x")
    with pytest.raises(OSError):
        WeightExport(arena, ws, ex.path)            # the path is taken
    with pytest.raises(TypeError, match="gpu must be a backend"):
        WeightImport(ex.path, "cpu")
    with pytest.raises(MetraleError, match="no engine listens"):
        WeightImport(tmp_path / "nobody", HostBackend(), timeout=0.2)
    imp = WeightImport(ex.path, HostBackend())
    with pytest.raises(TypeError, match="stream"):
        imp.sync(_state(0), stream="s")
    imp.close()
    ex.close()
    assert not os.path.exists(ex.path)
    with pytest.raises(MetraleError, match="closed"):
        ex.sync()


# -- the export under it -------------------------------------------------------------------


def _sizes(ws):
    return BufferSizes.from_config(ModelConfig(), 1, 1, 1, 1, buffers=ws.buffers, env={})


def test_export_memory_holds_the_arena_until_it_ends():
    ws = weight_set(SHAPES)
    with weight_arena(ws, HostBackend()) as arena:
        v = arena.view("weights", "uint8")
        np.asarray(v)[:] = 0x5A
        epoch = arena.guard("weights").epochs["weights"]
        ex = arena.export_memory("weights")
        assert ex.is_open and ex.offsets == {"weights": 0} and ex.epoch == epoch
        assert sum(n for _o, n in ex.chunks) == arena.committed_bytes()
        fds = ex.fds()
        assert len(fds) == len(ex.chunks)
        nb = arena.nbytes("weights")
        for (off, n), fd in zip(ex.chunks, fds):    # the arena's own pages
            with mmap.mmap(fd, n) as m:
                k = max(0, min(n, nb - off))
                assert m[:k] == b"\x5a" * k
                if off == 0:
                    m[:4] = b"\x01\x02\x03\x04"
        assert np.asarray(v)[:4].tolist() == [1, 2, 3, 4]
        del v
        for op in (arena.sleep, arena.release, lambda: arena.view("weights", "uint8")):
            with pytest.raises(MetraleError):
                op()
        with pytest.raises(MetraleError):
            arena.export_memory("weights")          # one at a time
        assert ex.end() == epoch + 1 and not ex.is_open
        assert ex.end() == epoch + 1                # idempotent
        with pytest.raises(MetraleError, match="ended"):
            ex.fds()
        with pytest.raises(TypeError, match="written"):
            ex.end(1)
        ex = arena.export_memory("weights")
        assert ex.end(False) == epoch + 1           # nothing sent: not counted
        ex = arena.export_memory("weights")
        del ex                                      # collected: ended, counted
        assert arena.guard("weights").epochs["weights"] == epoch + 2
        arena.sleep()
        with pytest.raises(MetraleError, match="sleeps: wake it first"):
            arena.export_memory("weights")
        arena.wake()
        with pytest.raises(TypeError, match="tag must be a str"):
            arena.export_memory(0)
        with pytest.raises(ValueError, match="'kv' is not a class"):
            arena.export_memory("kv")


def test_only_an_exportable_arena_exports():
    ws = weight_set(SHAPES)
    with weight_arena(ws, HostBackend(), exportable=False) as arena:
        with pytest.raises(MetraleError, match="not exportable"):
            arena.export_memory("weights")
    sizes = _sizes(ws)
    with pytest.raises(ValueError, match="needs reserve_sizes"):
        BufferArena.from_sizes(sizes, HostBackend(), exportable=True)
    with pytest.raises(TypeError, match="exportable must be a bool"):
        BufferArena.from_sizes(sizes, HostBackend(), reserve_sizes=sizes, exportable=1)


def test_shareable_memory_keeps_its_pages_across_an_offload():
    """The host backend's wake of an offloaded shareable buffer fills the
    handles' own pages (what an importer maps), not private ones."""
    ws = weight_set(SHAPES)
    with weight_arena(ws, HostBackend()) as arena:
        for round_ in range(2):
            np.asarray(arena.view("weights", "uint8"))[:] = 0x30 + round_
            arena.sleep()
            arena.wake()
            ex = arena.export_memory("weights")
            nb = arena.nbytes("weights")
            for (off, n), fd in zip(ex.chunks, ex.fds()):
                with mmap.mmap(fd, n) as m:
                    k = max(0, min(n, nb - off))
                    assert m[:k] == bytes([0x30 + round_]) * k, (round_, off)
            ex.end(False)


@pytest.mark.parametrize("op,nth,written", [("import", 1, False), ("map", 1, False),
                                            ("copy", 2, True)])
def test_a_trainer_fault_is_told_and_leaves_nothing_mapped(engine, op, nth, written):
    from metrale.testing import FaultyBackend
    arena, ws, ex = engine
    before = _arena_bytes(arena, ws)
    epoch = arena.guard("weights").epochs["weights"]
    gpu = FaultyBackend()
    imp = WeightImport(ex.path, gpu)
    gpu.inject_fault(op, nth)
    state = _state(4)
    t, out = _in_thread(lambda: ex.sync(timeout=30))
    with pytest.raises((MetraleError, OSError)):
        imp.sync(state)
    t.join()
    msg = str(out["error"])
    assert "aborted" in msg and "injected" in msg.lower()
    assert ("may be partly written" in msg) == written
    assert arena.guard("weights").epochs["weights"] == epoch + written
    got = _arena_bytes(arena, ws)
    if written:         # the first tensor in the arena's order was copied, the rest not
        assert got["embed"] == state["embed"].tobytes()
        assert all(got[n] == before[n] for n in ("norm", "proj", "head"))
    else:
        assert got == before
    assert gpu.mapped_bytes == 0        # the trainer unmapped what it had mapped
    imp.close()
    arena.sleep()                       # the engine's arena is let go
    arena.wake()


def test_an_engine_fault_sends_nothing_and_lets_the_arena_go(tmp_path):
    from metrale.testing import FaultyBackend
    ws = weight_set(SHAPES)
    gpu = FaultyBackend()
    with weight_arena(ws, gpu) as arena, WeightExport(arena, ws, tmp_path / "s") as ex:
        imp = WeightImport(ex.path, HostBackend())
        gpu.inject_fault("export", 1)
        t, out = _in_thread(lambda: imp.sync(_state(0), timeout=2))
        with pytest.raises(MetraleError, match="INJECTED"):
            ex.sync(timeout=30)
        arena.sleep()
        arena.wake()
        t.join()
        assert isinstance(out["error"], MetraleError)    # no offer came
        imp.close()


def test_remap_peer_checks_every_run_before_the_first_chunk_is_mapped():
    """PeerSlabs.remap_peer's runs, the refit's copies: a run that leaves the
    chunks (here into the hole between two), or overlaps the one before it, is
    refused, naming it, before anything is mapped or copied; so is a chunk
    that overlaps another or leaves the reservation."""
    from metrale._sharing._peer_slabs import PeerSlabs
    page = mmap.PAGESIZE
    fds = [os.memfd_create("chunk") for _ in range(2)]
    chunks = [(0, page), (2 * page, page)]
    src = np.arange(page, dtype=np.uint8)
    gpu = HostBackend()
    slabs = PeerSlabs(gpu)
    try:
        for fd in fds:
            os.ftruncate(fd, page)
        slabs.map_peer("w", 3 * page, [], [])
        for runs, error, match in [
                ([(0, src.ctypes.data, page), (page, src.ctypes.data, 8)], ValueError,
                 r"runs\[1\].*not all mapped"),
                ([(2 * page, src.ctypes.data, 8), (2 * page + 8, src.ctypes.data, page)],
                 ValueError, r"runs\[1\].*not all mapped"),
                ([(0, src.ctypes.data, 16), (16, src.ctypes.data, 8.0)], TypeError,
                 r"runs\[1\] must hold three ints"),
                ([(0, src.ctypes.data, 16), [16, src.ctypes.data, 8]], ValueError,
                 r"runs\[1\] must be an \(offset, src, nbytes\) tuple"),
                ([(-8, src.ctypes.data, 16)], ValueError, r"runs\[0\] holds a negative"),
                ([(0, src.ctypes.data, 2**64)], ValueError,
                 r"runs\[0\] holds a number of more than 64"),
                ([(0, src.ctypes.data, 16), (8, src.ctypes.data, 16)], ValueError,
                 r"runs\[1\] starts at 8, before the end")]:
            with pytest.raises(error, match=match):
                slabs.remap_peer("w", chunks, fds, runs)
            assert slabs.mapped() == (0, 0) and gpu.mapped_bytes == 0
        run = [(8, src.ctypes.data, 16)]
        for bad, error, match in [
                ([(0, 2 * page), (page, page)], ValueError,
                 rf"chunk \[{page}, \+{page}\) overlaps the one before it \(which ends at "
                 rf"{2 * page}\)"),
                ([(-page, page), (0, page)], ValueError, r"lies outside its"),
                ([(0, page), (3 * page, page)], ValueError,
                 rf"\[{3 * page}, \+{page}\) lies outside its {3 * page}-byte"),
                ([(0, 0), (0, page)], ValueError, r"chunk \[0, \+0\) lies outside"),
                ([(0, page), (page, float(page))], TypeError, r"chunks\[1\] must be two ints")]:
            for runs in (None, run):    # the engine's chunks checked before anything maps
                with pytest.raises(error, match=match):
                    slabs.remap_peer("w", bad, fds, runs)
                assert slabs.mapped() == (0, 0) and gpu.mapped_bytes == 0
        assert os.pread(fds[0], page, 0) == bytes(page)
        assert os.pread(fds[1], page, 0) == bytes(page)
        slabs.remap_peer("w", chunks, fds, [(8, src.ctypes.data, 16),
                                            (2 * page, src.ctypes.data + 16, 32)])
        slabs.detach()
        assert os.pread(fds[0], 24, 0) == bytes(8) + src[:16].tobytes()
        assert os.pread(fds[1], 32, 0) == src[16:48].tobytes()
    finally:
        slabs.close()
        for fd in fds:
            os.close(fd)


def test_remap_peer_copies_each_run_once_the_chunks_under_it_are_mapped():
    """PeerSlabs.remap_peer with runs, the refit's path: chunks given out of
    order are mapped by offset, and each run copied as soon as the chunks
    under it are (a fault at the second chunk's import finds the first run
    copied already), a run across two chunks among them; a bad run is
    refused before anything is mapped; a fault unmaps everything."""
    from metrale._sharing._peer_slabs import PeerSlabs
    from metrale.testing import FaultyBackend
    page = mmap.PAGESIZE
    chunks = [(2 * page, page), (0, page), (page, page)]        # not by offset
    src = (np.arange(3 * page) * 7 % 251).astype(np.uint8)
    # in offset order: a run in chunk 0, one across chunks 0 and 1, one in chunk 2
    runs = [(8, src.ctypes.data, 16), (page - 4, src.ctypes.data + 100, 12),
            (2 * page + 1, src.ctypes.data + 300, page - 1)]
    fds = [os.memfd_create("chunk") for _ in chunks]
    by_offset = {o: fd for (o, _n), fd in zip(chunks, fds)}
    try:
        for fd in fds:
            os.ftruncate(fd, page)
        gpu = FaultyBackend()
        slabs = PeerSlabs(gpu)
        base = slabs.map_peer("w", 3 * page, [], [])
        with pytest.raises(ValueError, match=r"runs\[1\].*not all mapped"):
            slabs.remap_peer("w", chunks[1:], fds[1:], [(8, src.ctypes.data, 16),
                                                        (page * 2 + 8, src.ctypes.data, 8)])
        assert slabs.mapped() == (0, 0) and gpu.mapped_bytes == 0
        assert slabs.copies_begun == 0
        gpu.inject_fault("import", 2)
        with pytest.raises(MetraleError, match="(?i)injected"):
            slabs.remap_peer("w", chunks, fds, runs)
        assert slabs.mapped() == (0, 0) and gpu.mapped_bytes == 0
        assert slabs.copies_begun == 1
        assert os.pread(by_offset[0], page, 0) == bytes(8) + src[:16].tobytes() + bytes(page - 24)
        assert os.pread(by_offset[page], page, 0) == bytes(page)
        gpu.inject_fault("copy", 2)     # run 1, after chunk 1
        with pytest.raises(MetraleError, match="(?i)injected"):
            slabs.remap_peer("w", chunks, fds, runs)
        assert slabs.mapped() == (0, 0) and gpu.mapped_bytes == 0
        assert slabs.copies_begun == 3
        assert os.pread(by_offset[page], page, 0) == bytes(page)
        assert slabs.remap_peer("w", chunks, fds, runs) == base
        slabs.detach()
        want = bytearray(3 * page)
        for off, a, n in runs:
            want[off:off + n] = src[a - src.ctypes.data:a - src.ctypes.data + n].tobytes()
        got = b"".join(os.pread(by_offset[o], page, 0) for o in (0, page, 2 * page))
        assert got == bytes(want)
        assert slabs.copies_begun == 6
        slabs.close()
    finally:
        for fd in fds:
            os.close(fd)


def test_the_trainers_own_kernel_writes_through_mapped(engine):
    """WeightImport.mapped: the trainer writes the engine's weights itself
    (here memmove, a kernel on the GPU) at `ptr(name)`; the block's end
    commits (one epoch more), a raise in it aborts with the weights counted
    as maybe written, and a pointer asked for after it is refused."""
    import ctypes
    arena, ws, ex = engine
    imp = WeightImport(ex.path, HostBackend())
    state = _state(5)
    epoch0 = arena.guard("weights").epochs["weights"]
    bases = []
    for cycle in range(2):          # a sleep and a wake between: the same addresses
        t, out = _in_thread(lambda: ex.sync(timeout=30))
        with imp.mapped(timeout=30) as w:
            assert w.ws == ws and w.ptr() == w.ptr("embed")
            bases.append(w.ptr())
            for name, a in state.items():
                ctypes.memmove(w.ptr(name), a.ctypes.data, a.nbytes)
        t.join()
        assert out["value"] == epoch0 + 2 * cycle + 1 == imp.epoch + 1
        got = _arena_bytes(arena, ws)
        assert all(got[n] == a.tobytes() for n, a in state.items())
        arena.sleep()
        arena.wake()
    assert bases[0] == bases[1]
    with pytest.raises(MetraleError, match="the refit is over"):
        w.ptr("embed")
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        t, out = _in_thread(lambda: ex.sync(timeout=30))
        try:
            with imp.mapped(timeout=30) as w:
                ctypes.memmove(w.ptr("norm"), bytes(32), 32)
                w.ptr("nope")
        finally:
            t.join()
    assert isinstance(out["error"], MetraleError)
    assert "aborted" in str(out["error"]) and "may be partly written" in str(out["error"])
    assert _arena_bytes(arena, ws)["norm"] == bytes(32)     # written before the raise
    assert arena.guard("weights").epochs["weights"] == epoch0 + 5
    assert arena.memory_stats()["imported_handles"] == 0 and not arena.pins()
    arena.sleep()                   # the arena let go: it sleeps and wakes
    arena.wake()
    imp.close()


@pytest.mark.parametrize("op", ["import", "map"])
def test_a_fault_before_mapped_yields_tells_nothing_was_written(engine, op):
    from metrale.testing import FaultyBackend
    arena, ws, ex = engine
    before = _arena_bytes(arena, ws)
    epoch = arena.guard("weights").epochs["weights"]
    gpu = FaultyBackend()
    imp = WeightImport(ex.path, gpu)
    gpu.inject_fault(op, 1)
    t, out = _in_thread(lambda: ex.sync(timeout=30))
    with pytest.raises(MetraleError, match="(?i)injected"):
        with imp.mapped(timeout=30):
            pytest.fail("the block ran without the engine's memory")
    t.join()
    assert "nothing was written" in str(out["error"])
    assert arena.guard("weights").epochs["weights"] == epoch
    assert _arena_bytes(arena, ws) == before and gpu.mapped_bytes == 0
