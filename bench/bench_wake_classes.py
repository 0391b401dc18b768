"""GPU benchmark of classes that wake apart (docs/stable-addresses.md), with the
anchors measured in the same process.

An arena of three classes on one device: "zeroed" (one 2 GiB buffer of
contract "zero"), "filled" (a 2 GiB bfloat16 buffer of contract "fill:1.0")
and "weights" (a small kept buffer, awake throughout):

* ``wake(tags="zeroed")`` after ``sleep(tags="zeroed")``: host wall time of
  the call (it maps the class's memory, zeroes it and synchronizes), against
  the raw driver doing the same in the same rounds: cuMemCreate + cuMemMap +
  cuMemSetAccess of 2 GiB, one cuMemsetD8Async of its bytes and a
  synchronization (goal: at most 1.1x);
* ``wake(tags="filled")``: the same against mapping plus one
  cuMemsetD16Async of bfloat16 1.0 (0x3F80) over the bytes (goal: 1.1x);
  each woken buffer is checked after every round (zeros; 1.0);
* a guarded CUDA graph (`metrale.torch.graph`) against a plain
  ``torch.cuda.CUDAGraph`` of the same empty capture: host µs per
  ``replay()``, 10,000 back to back, the two interleaved, median of the
  rounds (goal: at most 1.02x).

Run:  python bench/bench_wake_classes.py [--runs 15]
"""

import argparse
import statistics
import time

import torch
from cuda.bindings import driver

import metrale.torch as mt
from metrale import BufferArena, BufferSet, BufferSpec, CudaBackend, MetraleError, ModelConfig

GIB = 1 << 30
LIMITS = (64, 512, 16, 8)
SET = BufferSet([
    BufferSpec("zeroed", "uint8", [2 * GIB], tag="zeroed"),
    BufferSpec("filled", "bfloat16", [GIB], wake="fill:1.0", tag="filled"),
    BufferSpec("weights", "bfloat16", ["H", "H"], wake="keep", tag="weights"),
])
REPLAYS = 10_000


def ok(res):
    err = res[0] if isinstance(res, tuple) else res
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"driver call failed: {err}")
    return res[1] if isinstance(res, tuple) and len(res) == 2 else res


def wall_ms(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


class Driver:
    """The anchor: physical memory mapped at a reserved range, written, given back."""

    def __init__(self, nbytes, device=0):
        self.n = nbytes
        prop = driver.CUmemAllocationProp()
        prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device
        self.prop = prop
        self.va = ok(driver.cuMemAddressReserve(nbytes, 0, 0, 0))
        access = driver.CUmemAccessDesc()
        access.location = prop.location
        access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.access = access
        self.h = None

    def map_and(self, write):
        self.h = ok(driver.cuMemCreate(self.n, self.prop, 0))
        ok(driver.cuMemMap(self.va, self.n, 0, self.h, 0))
        ok(driver.cuMemSetAccess(self.va, self.n, [self.access], 1))
        write(self.va)
        ok(driver.cuCtxSynchronize())

    def give_back(self):
        ok(driver.cuMemUnmap(self.va, self.n))
        ok(driver.cuMemRelease(self.h))
        self.h = None

    def close(self):
        ok(driver.cuMemAddressFree(self.va, self.n))


def class_rows(a, runs, row):
    anchor = Driver(2 * GIB)
    kinds = {
        "zeroed": lambda va: ok(driver.cuMemsetD8Async(va, 0, 2 * GIB, 0)),
        "filled": lambda va: ok(driver.cuMemsetD16Async(va, 0x3F80, GIB, 0)),
    }
    for cls, write in kinds.items():
        t = mt.tensor(a, cls)
        want = torch.zeros(1, dtype=t.dtype, device="cuda") if cls == "zeroed" else \
            torch.ones(1, dtype=t.dtype, device="cuda")
        del t
        ours, theirs = [], []
        for k in range(runs + 2):           # two warm-up rounds
            a.sleep(tags=cls)
            torch.cuda.synchronize()
            m = wall_ms(lambda: a.wake(tags=cls))
            t = mt.tensor(a, cls)
            if not bool((t == want).all()):
                raise SystemExit(f"{cls}: the woken buffer is not its contract's")
            t.fill_(7)                      # the next round's wake must write it again
            del t
            torch.cuda.synchronize()
            d = wall_ms(lambda: anchor.map_and(write))
            anchor.give_back()
            if k >= 2:
                ours.append(m)
                theirs.append(d)
        mo, md = statistics.median(ours), statistics.median(theirs)
        row(f'wake(tags="{cls}"), 2 GiB', f"{mo:8.3f} ms  ({min(ours):.3f} .. {max(ours):.3f})")
        row(f"  anchor: create + map + access + one "
            f"{'memset' if cls == 'zeroed' else 'fill'} + sync",
            f"{md:8.3f} ms  ({min(theirs):.3f} .. {max(theirs):.3f})")
        row("  ratio (goal 1.1x)", f"{mo / md:.3f}x")
    anchor.close()


def replay_rows(a, runs, row):
    def captured(kernel):
        plain, guarded = torch.cuda.CUDAGraph(), mt.graph(a, uses=["weights"])
        s = torch.cuda.Stream()
        for g in (plain, guarded):
            with torch.cuda.stream(s):
                g.capture_begin()
                if kernel is not None:
                    kernel.add_(1)
                g.capture_end()
        for g in (plain, guarded):
            g.replay()
        torch.cuda.synchronize()
        return plain, guarded

    what = "empty graph"            # the replay's own cost alone
    try:
        plain, guarded = captured(None)
    except RuntimeError as e:       # a torch that refuses an empty graph: one tiny kernel
        print(f"an empty graph does not replay here ({e}); one 1-element kernel instead")
        what = "graph of one 1-element kernel"
        plain, guarded = captured(torch.zeros(1, device="cuda"))

    def per_replay_us(g):
        rep = g.replay
        t0 = time.perf_counter()
        for _ in range(REPLAYS):
            rep()
        t = time.perf_counter() - t0
        torch.cuda.synchronize()
        return t * 1e6 / REPLAYS

    for g in (plain, guarded):
        per_replay_us(g)
    p, q = [], []
    for _ in range(runs):
        p.append(per_replay_us(plain))
        q.append(per_replay_us(guarded))
    mp, mq = statistics.median(p), statistics.median(q)
    row(f"plain CUDAGraph.replay(), {what}", f"{mp:8.3f} µs")
    row(f"metrale.torch.graph(...).replay(), {what}", f"{mq:8.3f} µs")
    row("  ratio (goal 1.02x)", f"{mq / mp:.3f}x")
    a.sleep(tags="weights")
    try:
        guarded.replay()
    except MetraleError as e:
        row("  a replay with its class asleep", f"refused: {e}")
    else:
        raise SystemExit("a guarded replay over a sleeping class ran")
    a.wake(tags="weights")
    del plain, guarded


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    torch.cuda.init()
    gpu = CudaBackend(0)
    cfg = ModelConfig.preset("qwen3-next-80b")

    def row(what, value):
        print(f"{what:<62} {value}", flush=True)

    print(f"device: {torch.cuda.get_device_name(0)}; {gpu!r}")
    a = BufferArena.new(cfg, *LIMITS, gpu, reserve=LIMITS, buffers=SET)
    try:
        class_rows(a, args.runs, row)
        replay_rows(a, max(5, args.runs), row)
    finally:
        torch.cuda.synchronize()
        a.release()


if __name__ == "__main__":
    main()
