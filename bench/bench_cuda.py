"""GPU benchmark of the arena's zeroing and accessors on one device.

Qwen3-Next-80B preset at max_batch_tokens 8192.  Per operation: GPU time from
CUDA events around one call (median and min..max of N runs, each queued behind
a spin kernel so that the events time the GPU alone), GPU time per operation
over 20 back to back between two events, issue time from the host clock around
one call, and host time per call in bursts of 50 behind a spin.  Anchors in the
same process: 18 cuMemsetD8Async through Python cuda.bindings.driver, torch
zero_() on 18 tensors, the same as a torch CUDA graph, and one contiguous
memset of the same bytes (the limit).  zero_all_rows and the memset of its bytes
are also timed with L2 holding clean lines (256 MB read before each run), as a
forward pass leaves it, instead of the dirty lines of their own previous run.
Run:  python bench/bench_cuda.py [--runs 100] [--cpu N]
"""

import argparse
import statistics
import time
import timeit

import torch
from cuda.bindings import driver

import metrale
from metrale import BufferArena, CudaBackend, ModelConfig
from metrale._sizing._layout import plan_layout, zero_rows_ranges


def timed(fn, stream, runs, prelude=None):
    """(GPU µs median, min, max, host issue µs median, every GPU µs).
    `prelude` runs before each timed run, outside the events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    gpu_t, host_t = [], []
    for _ in range(runs):
        if prelude is not None:
            prelude()
        # Queue the work behind a ~200 us spin so that the events time the GPU
        # alone: from an idle stream they would also count the host's issue time.
        torch.cuda._sleep(400_000)
        start.record(stream)
        t0 = time.perf_counter()
        fn()
        host_t.append((time.perf_counter() - t0) * 1e6)
        end.record(stream)
        end.synchronize()
        gpu_t.append(start.elapsed_time(end) * 1e3)
    return statistics.median(gpu_t), min(gpu_t), max(gpu_t), statistics.median(host_t), gpu_t


def timed_back_to_back(fn, stream, runs, k=20):
    """GPU µs per operation when `k` of them run back to back between two events
    (median over `runs`): the cost one adds to a stream of work, without the
    launch edge and the event granularity of a lone operation."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per = []
    for _ in range(runs):
        torch.cuda._sleep(2_000_000)
        start.record(stream)
        for _ in range(k):
            fn()
        end.record(stream)
        end.synchronize()
        per.append(start.elapsed_time(end) * 1e3 / k)
    return statistics.median(per)


def warm_up(fn, seconds=0.5):
    """Run `fn` (synchronised) for `seconds`: the first tens of milliseconds of
    large memsets after an idle spell ran ~10 % slow on the H200, which a few
    warm-up calls per row did not cover."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()
        torch.cuda.synchronize()


def share_under(r, limit=16.0):
    """Fraction of the timed runs in `r` (from timed()) at or under `limit` µs."""
    return sum(t <= limit for t in r[4]) / len(r[4])


def burst_issue(fn, reps=15, n=50):
    """Host µs per call when `n` calls are issued back to back behind a spin
    (the queue never drains, as in an engine's step): median of `reps` bursts."""
    per = []
    for _ in range(reps):
        torch.cuda._sleep(2_000_000)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--cpu", type=int, help="pin the process to this CPU first")
    args = ap.parse_args()
    if args.cpu is not None:
        import os
        os.sched_setaffinity(0, {args.cpu})
    runs = args.runs
    torch.cuda.init()
    gpu = CudaBackend(0)
    cfg = ModelConfig.preset("qwen3-next-80b")
    print(f"{torch.cuda.get_device_name()} ({gpu.sm_count()} SMs, cc {gpu.compute_capability()}); "
          f"torch {torch.__version__}; metrale {metrale.__version__}; target {gpu.target()}")

    builds = []
    for _ in range(7):
        t0 = time.perf_counter()
        a = BufferArena.new(cfg, args.m, 4096, 16, 32, gpu)
        builds.append((time.perf_counter() - t0) * 1e3)
        a.release(gpu)
    arena = BufferArena.new(cfg, args.m, 4096, 16, 32, gpu)
    sizes = arena.sizes()
    zero_all = plan_layout(sizes).groups["zero_all"]     # the table's 18 buffers
    zbytes = sum(getattr(sizes, n) for n in zero_all)
    print(f"arena: slab {arena.slab_bytes():,} bytes; zero_all buffers {zbytes:,} bytes; "
          f"construction median {statistics.median(builds):.3f} ms "
          f"(min {min(builds):.3f}, max {max(builds):.3f}; context already created)\n")

    ts = torch.cuda.Stream()
    torch.cuda.set_stream(ts)
    h = ts.cuda_stream
    cs = driver.CUstream(h)
    ptrs = [(getattr(arena, n)(), getattr(sizes, n)) for n in zero_all]
    tensors = [torch.from_dlpack(arena.view(n, "uint8")) for n in zero_all]
    contig_buf = torch.empty(zbytes, dtype=torch.uint8, device="cuda")   # same bytes, one range

    def py_memsets():
        for p, n in ptrs:
            driver.cuMemsetD8Async(p, 0, n, cs)

    def torch_zero():
        for t in tensors:
            t.zero_()

    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=ts):
        torch_zero()

    def one_memset():
        driver.cuMemsetD32Async(contig_buf.data_ptr(), 0, zbytes // 4, cs)

    rows1_ranges = zero_rows_ranges(sizes, args.m, 1)
    rows1 = sum(n for _, n in rows1_ranges)

    def rows1_memset():
        driver.cuMemsetD32Async(contig_buf.data_ptr(), 0, rows1 // 4, cs)

    rows = [
        ("zero_all", lambda: arena.zero_all(gpu, h)),
        ("zero_prefill_essentials", lambda: arena.zero_prefill_essentials(gpu, h)),
        ("zero_all_rows(tokens=1)", lambda: arena.zero_all_rows(gpu, h, 1)),
        ("zero_all_rows(tokens=16)", lambda: arena.zero_all_rows(gpu, h, 16)),
        ("zero_all_rows(tokens=4096)", lambda: arena.zero_all_rows(gpu, h, 4096)),
        ("anchor: one contiguous memset (limit)", one_memset),
        ("anchor: contiguous memset, rows(1) bytes", rows1_memset),
        ("anchor: 18 cuMemsetD8Async (Python)", py_memsets),
        ("anchor: torch zero_() x18", torch_zero),
        ("anchor: torch CUDA graph replay x18", g.replay),
    ]
    rg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(rg, stream=ts):
        arena.zero_all_rows(gpu, torch.cuda.current_stream(), 1)
    rows.append(("zero_all_rows(1) in a CUDA graph replay", rg.replay))
    print(f"{'operation':<42} {'GPU µs':>9} {'min':>8} {'max':>8} {'x20 µs/op':>10} "
          f"{'issue µs':>9} {'burst µs':>9}")
    res = {}
    warm_up(rows[0][1])
    for label, fn in rows:
        r = timed(fn, ts, runs)
        res[label] = r
        seq = timed_back_to_back(fn, ts, 15)
        b = burst_issue(fn)
        print(f"{label:<42} {r[0]:>9.1f} {r[1]:>8.1f} {r[2]:>8.1f} {seq:>10.1f} {r[3]:>9.2f} {b:>9.2f}")
    lim = res["anchor: one contiguous memset (limit)"][0]
    # Repeated runs find L2 (50 MB) full of the dirty lines of the previous run of
    # the same bytes. In an engine, a step starts after the forward pass streamed
    # gigabytes of weights through L2: clean lines. Read 256 MB before each run.
    weights = torch.rand(64 << 20, device="cuda")
    clean = (("zero_all_rows(tokens=1)", "zero_all_rows(1), L2 clean"),
             ("zero_all_rows(tokens=16)", "zero_all_rows(16), L2 clean"),
             ("anchor: contiguous memset, rows(1) bytes", "anchor: memset rows(1) bytes, L2 clean"))
    fns = dict(rows)
    for key, label in clean:
        r = timed(fns[key], ts, runs, prelude=lambda: weights.sum())
        res[label] = r
        print(f"{label:<42} {r[0]:>9.1f} {r[1]:>8.1f} {r[2]:>8.1f} {'':>10} {r[3]:>9.2f}")
    print(f"\nzero_all / contiguous memset: {res['zero_all'][0] / lim:.3f}x (goal <= 1.02x); "
          f"{zbytes / res['zero_all'][0] / 1e6:.2f} TB/s")
    r1 = res["zero_all_rows(tokens=1)"][0]
    under = share_under(res["zero_all_rows(tokens=1)"])
    rc = res["zero_all_rows(1), L2 clean"]
    print(f"zero_all_rows(1), L2 clean: {rc[0]:.2f} us, {share_under(rc):.0%} "
          f"of runs at or under 16; {rc[0] / res['anchor: memset rows(1) bytes, L2 clean'][0]:.3f}x "
          "the memset of those bytes")
    print(f"zero_all_rows(1): {rows1:,} bytes in {len(rows1_ranges)} ranges, {r1:.2f} us (goal <= 16; "
          f"{under:.0%} of runs at or under); "
          f"{r1 / res['anchor: contiguous memset, rows(1) bytes'][0]:.3f}x one contiguous memset of those bytes")

    import cupy
    try:
        from cuda.core import Device
    except ImportError:
        from cuda.core.experimental import Device
    dev = Device(0)
    dev.set_current()
    buf = dev.memory_resource.allocate(1 << 20, stream=dev.default_stream)
    tt = torch.empty(16, device="cuda")
    cp = cupy.empty(16)
    glb = dict(arena=arena, tt=tt, cp=cp, buf=buf)
    print(f"\n{'accessor':<36} {'median ns':>10} {'min':>8} {'max':>8}")
    for label, stmt in (("arena.hidden_states()", "arena.hidden_states()"),
                        ("arena.qkv_output_bytes()", "arena.qkv_output_bytes()"),
                        ("torch tensor.data_ptr()", "tt.data_ptr()"),
                        ("CuPy array.data.ptr", "cp.data.ptr"),
                        ("cuda.core int(buffer.handle)", "int(buf.handle)")):
        t = timeit.Timer(stmt, globals=glb)
        vals = [t.timeit(200_000) / 200_000 * 1e9 for _ in range(15)]
        print(f"{label:<36} {statistics.median(vals):>10.1f} {min(vals):>8.1f} {max(vals):>8.1f}")
    # The torch anchors' tensors are views of the arena: release refuses while they live.
    torch.cuda.synchronize()
    tensors.clear()
    arena.release(gpu)


if __name__ == "__main__":
    main()
