"""GPU benchmark of the debug arena (docs/debug.md) on one device.

Qwen3-Next-80B preset at max_batch_tokens 8192, one arena built with
debug=True (4 KiB guard bands) and one without, in the same process.

The operations that return results (check_guards, find_nonfinite,
fingerprint) wait for them, so each is timed by the host clock around one
call on an idle stream (median and min..max of N runs), and by CUDA events
recorded around the call; the enqueue-only ones (poison_rows, the zeroing)
as bench_cuda.py times them: GPU time from events around one call queued
behind a spin kernel, and per operation over 20 back to back.

Anchors in the same run:
- reading the bytes once: one torch reduction (int64 sum) over a contiguous
  tensor of the same byte count as the buffers fingerprinted, timed the same
  way (host clock around the launch and a synchronize);
- the reference's host-copy checksum path: debug_buffer_checksum (16 buffers:
  one synchronize, a device-to-host copy of each, the float32 sums on the
  host; 5 runs, it takes about a second), against fingerprint of the same 16
  buffers;
- the arena without debug mode: zero_all, zero_all_rows(1) (zero cost when
  off: the debug arena's zeroing is one fused launch over 18 ranges instead
  of one memset);
- zero_all_rows(1) beside poison_rows(1), which writes the bytes it leaves.

Goals (issue 14): check_guards <= 30 us; fingerprint of the 18 zero_all
buffers <= 1.2x reading those bytes once.
Run:  python bench/bench_debug.py [--runs 50] [--m 8192] [--cpu N]
"""

import argparse
import logging
import statistics
import time

import torch

import metrale
from metrale import REFERENCE, BufferArena, CudaBackend, ModelConfig

from bench_cuda import timed, timed_back_to_back, warm_up


def wall(fn, runs):
    """(host µs median, min, max) of one call between two synchronizes (the
    call itself waits for its results)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(t), min(t), max(t)


def events(fn, stream, runs):
    """GPU µs median between events recorded just before and after one call
    (for calls that wait for their own results: launch gap included)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = []
    for _ in range(runs):
        torch.cuda.synchronize()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        t.append(start.elapsed_time(end) * 1e3)
    return statistics.median(t)


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
    logging.getLogger("metrale").setLevel(logging.ERROR)    # the checksum's records
    torch.cuda.init()
    gpu = CudaBackend(0)
    cfg = ModelConfig.preset("qwen3-next-80b")
    print(f"{torch.cuda.get_device_name()} ({gpu.sm_count()} SMs, cc {gpu.compute_capability()}); "
          f"torch {torch.__version__}; metrale {metrale.__version__}; target {gpu.target()}")

    t0 = time.perf_counter()
    arena = BufferArena.new(cfg, args.m, 4096, 16, 32, gpu, debug=True)
    t_build = (time.perf_counter() - t0) * 1e3
    plain = BufferArena.new(cfg, args.m, 4096, 16, 32, gpu)
    sizes = arena.sizes()
    zero_all, checksum = REFERENCE.groups["zero_all"], REFERENCE.groups["checksum"]
    zbytes = sum(getattr(sizes, n) for n in zero_all)
    cbytes = sum(getattr(sizes, n) for n in checksum)
    print(f"debug arena: slab {arena.slab_bytes():,} bytes (plain {plain.slab_bytes():,}); "
          f"{arena.summary().live_buffers} guard bands of 4,096 bytes + padding; built in "
          f"{t_build:.2f} ms (first debug arena: kernels loaded)")
    print(f"zero_all buffers {zbytes:,} bytes; checksum buffers {cbytes:,} bytes\n")

    ts = torch.cuda.Stream()
    torch.cuda.set_stream(ts)
    h = ts.cuda_stream
    for a in (arena, plain):
        a.zero_all(stream=h)
    contig = torch.zeros(zbytes // 8, dtype=torch.int64, device="cuda")     # the same bytes
    contig16 = contig[:cbytes // 8]

    # -- operations that wait for their results: host clock and events ----------------
    sync_rows = [
        ("check_guards", lambda: arena.check_guards(stream=h)),
        ("find_nonfinite(tokens=1)", lambda: arena.find_nonfinite(stream=h, tokens=1)),
        (f"find_nonfinite(tokens={args.m}) (all rows)",
         lambda: arena.find_nonfinite(stream=h, tokens=args.m)),
        ("fingerprint(18 zero_all buffers)", lambda: arena.fingerprint(stream=h, names=zero_all)),
        ("anchor: read the 18's bytes once (sum)", lambda: contig.sum()),
        ("fingerprint(16 checksum buffers)", lambda: arena.fingerprint(stream=h, names=checksum)),
        ("anchor: read the 16's bytes once (sum)", lambda: contig16.sum()),
        ("anchor: debug_buffer_checksum (16, host)",
         lambda: arena.debug_buffer_checksum(stream=h, tag="bench")),
        ("fingerprint() (every live buffer)", lambda: arena.fingerprint(stream=h)),
    ]
    print(f"{'operation (waits for its result)':<44} {'host µs':>9} {'min':>9} {'max':>9} "
          f"{'events µs':>10}")
    res = {}
    warm_up(sync_rows[3][1])
    for label, fn in sync_rows:
        n = min(runs, 5) if "debug_buffer_checksum" in label else runs   # ~1 s a call
        r = wall(fn, n)
        e = events(fn, ts, n)
        res[label] = r
        print(f"{label:<44} {r[0]:>9.1f} {r[1]:>9.1f} {r[2]:>9.1f} {e:>10.1f}")

    # -- enqueue-only operations: as bench_cuda.py -------------------------------------------
    async_rows = [
        ("poison_rows(tokens=1)", lambda: arena.poison_rows(stream=h, tokens=1)),
        ("zero_all_rows(tokens=1), debug arena", lambda: arena.zero_all_rows(stream=h, tokens=1)),
        ("zero_all_rows(tokens=1), plain arena", lambda: plain.zero_all_rows(stream=h, tokens=1)),
        ("zero_all, debug arena (18 ranges)", lambda: arena.zero_all(stream=h)),
        ("zero_all, plain arena (one memset)", lambda: plain.zero_all(stream=h)),
    ]
    print(f"\n{'operation (enqueued)':<44} {'GPU µs':>9} {'min':>9} {'max':>9} "
          f"{'x20 µs/op':>10} {'issue µs':>9}")
    warm_up(async_rows[3][1])
    for label, fn in async_rows:
        r = timed(fn, ts, runs)
        seq = timed_back_to_back(fn, ts, 15)
        res[label] = r
        print(f"{label:<44} {r[0]:>9.1f} {r[1]:>9.1f} {r[2]:>9.1f} {seq:>10.1f} {r[3]:>9.2f}")

    cg = res["check_guards"][0]
    fp18 = res["fingerprint(18 zero_all buffers)"][0]
    rd18 = res["anchor: read the 18's bytes once (sum)"][0]
    fp16 = res["fingerprint(16 checksum buffers)"][0]
    ck16 = res["anchor: debug_buffer_checksum (16, host)"][0]
    print(f"\ncheck_guards: {cg:.1f} us per call, host clock (goal <= 30)")
    print(f"fingerprint of the 18 zero_all buffers: {fp18:.1f} us, {zbytes / fp18 / 1e6:.2f} TB/s; "
          f"{fp18 / rd18:.3f}x reading those bytes once (goal <= 1.2x)")
    print(f"fingerprint of the 16 checksum buffers: {fp16:.1f} us vs the host-copy checksum "
          f"{ck16:.1f} us ({ck16 / fp16:.0f}x faster)")
    print(f"zero_all: debug arena {res['zero_all, debug arena (18 ranges)'][0]:.1f} us, plain "
          f"{res['zero_all, plain arena (one memset)'][0]:.1f} us")
    torch.cuda.synchronize()
    arena.release()
    plain.release()


if __name__ == "__main__":
    main()
