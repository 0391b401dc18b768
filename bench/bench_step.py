"""GPU benchmark of one-graph steps: zeroing with the token count read on the
device, the one-copy step upload, and one graph against one per bucket.

Qwen3-Next-80B preset at max_batch_tokens 8192, max_seq_len 4096, KV blocks of
16, max_batch_size 32 (so R = 32, B = 257).  In the same process:

1. GPU time of zero_all_rows(tokens_at=...) against zero_all_rows(tokens=n)
   for n = 1, 16, 4096, 8192 (each alone behind a spin, median of N, and per
   operation over 20 back to back), for grids of 4..32 blocks per SM.
2. Host cost of a decode-step prologue for a batch of 32: the same numpy fill
   (token ids, positions, LoRA slots, KV slots, sequence lengths, block
   table), then
   - metrale: StepInputs.upload (one copy + one zeroing launch), eager;
   - metrale: one replay of a graph holding that upload;
   - torch eager: pinned tensors, one copy_(non_blocking=True) per region, then
     zero_() on each of the 18 buffers trimmed as zero_all_rows(32) trims them;
   - torch: the same copies, then one replay of a graph of those zero_() calls.
   Median host µs per step over many steps, each behind a spin so that the
   GPU never stalls the host; the GPU is drained between steps.
3. One graph for every batch size against one graph per bucket (vLLM's
   default 35 sizes: 1, 2, 4, 8, 16, ..., 256): captures, capture +
   instantiation time, device memory the graphs take (cuMemGetInfo).
Run:  python bench/bench_step.py [--runs 30] [--steps 2000] [--zeroing-only] [--tunings ...]
"""

import argparse
import statistics
import time

import numpy as np
import torch

from metrale import REFERENCE, BufferArena, CudaBackend, ModelConfig
from metrale._sizing._layout import plan_layout

from bench_cuda import timed, timed_back_to_back, warm_up

BUCKETS = [1, 2, 4] + list(range(8, 257, 8))      # vLLM's default capture sizes (35)
BATCH = 32


def numpy_inputs(rng, B):
    return dict(token_ids=rng.integers(0, 150_000, BATCH, dtype=np.uint32),
                positions=rng.integers(0, 4096, BATCH, dtype=np.uint32),
                seq_slot=rng.integers(0, 8, BATCH, dtype=np.int32),
                slots=rng.integers(0, 2**30, BATCH, dtype=np.int64),
                seq_lens=rng.integers(1, 4096, BATCH, dtype=np.int32),
                block_table=rng.integers(0, 2**20, (BATCH, B), dtype=np.int32))


def fill(dst, src):
    """The numpy fill every path does: the step's rows of each region."""
    for name, a in src.items():
        dst[name][:a.shape[0]] = a


def host_cost(step, drain, steps):
    """Median host µs of `step` (each behind a spin so the GPU never stalls
    the host), the GPU drained between steps."""
    per = []
    for _ in range(steps):
        torch.cuda._sleep(50_000)
        t0 = time.perf_counter()
        step()
        per.append((time.perf_counter() - t0) * 1e6)
        drain()
    return statistics.median(per)


def graph_memory_and_time(make, count):
    """Capture `count` graphs with `make(i)` on a side stream: (seconds,
    bytes of device memory they took)."""
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    t0 = time.perf_counter()
    graphs = []
    for i in range(count):
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.graph(g, stream=s):
            make(i, s)
        graphs.append(g)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    free1, _ = torch.cuda.mem_get_info()
    return secs, free0 - free1, graphs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--zeroing-only", action="store_true", help="part 1 only")
    ap.add_argument("--tunings", default="1:512:8:1,2:512:8:1,1:512:8:0",
                    help="blocks_per_sm:tile_chunks:spread:queue (1 or 0), comma-separated (part 1)")
    args = ap.parse_args()
    cfg = ModelConfig.preset("qwen3-next-80b")
    gpu = CudaBackend(0)
    M = 8192
    arena = BufferArena.new(cfg, M, 4096, 16, 32, gpu)
    st = arena.step_inputs()
    s = torch.cuda.Stream()
    torch.cuda.set_stream(s)
    B = st.max_blocks
    print(f"{torch.cuda.get_device_name()}: Qwen3-Next-80B, M = {M}, R = {st.layout.rows()}, "
          f"B = {B}; step span {st.nbytes:,} bytes; {gpu.sm_count()} SMs")

    # -- 1. device count against host count ---------------------------------------------
    print("\n1. zero_all_rows: GPU µs, median (min..max) of", args.runs,
          "alone / per op over 20 back to back")
    print(f"{'n':>6} {'grid/SM':>7} {'tile':>5} {'spread':>6} {'queue':>5} {'host count':>22} {'device count':>22} {'x alone':>8} {'x b2b':>7}")
    cell = torch.zeros(1, dtype=torch.int32, device="cuda")
    default = gpu.rows_at_tuning()
    tunings = [tuple(int(x) for x in t.split(":")) for t in args.tunings.split(",")]
    for per_sm, per, spread, queue in tunings:
        gpu.tune_rows_at(blocks_per_sm=per_sm, tile_chunks=per, spread=spread, queue=bool(queue))
        for n in (1, 16, 64, 256, 1024, 2048, 4096, 6000, 8192):
            cell.fill_(n)
            torch.cuda.synchronize()
            host = lambda: arena.zero_all_rows(stream=s, tokens=n)            # noqa: E731
            dev = lambda: arena.zero_all_rows(stream=s, tokens_at=cell.data_ptr())  # noqa: E731
            warm_up(host, 0.2)
            rh = timed(host, s, args.runs)
            rd = timed(dev, s, args.runs)
            bh = timed_back_to_back(host, s, max(args.runs // 3, 5))
            bd = timed_back_to_back(dev, s, max(args.runs // 3, 5))
            print(f"{n:>6} {per_sm:>7} {per:>5} {spread:>6} {queue:>5} {rh[0]:>8.1f} ({rh[1]:.1f}..{rh[2]:.1f}) "
                  f"{rd[0]:>8.1f} ({rd[1]:.1f}..{rd[2]:.1f}) {rd[0] / rh[0]:>8.3f} {bd / bh:>7.3f}")
    gpu.tune_rows_at(**default)
    # The device count inside one captured graph (the default shape), replayed for
    # every n, against the host count's launch for that n.
    print("\n1b. zero_all_rows(tokens_at=...) captured once in a CUDA graph, replayed for each n;"
          " GPU µs, median of", args.runs)
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=s):
        arena.zero_all_rows(stream=torch.cuda.current_stream(), tokens_at=cell.data_ptr())
    torch.cuda.set_stream(s)
    print(f"{'n':>6} {'host count':>12} {'graph replay':>12} {'x':>7}")
    for n in (1, 16, 64, 256, 1024, 2048, 4096, 6000, 8192):
        cell.fill_(n)
        torch.cuda.synchronize()
        host = lambda: arena.zero_all_rows(stream=s, tokens=n)            # noqa: E731
        rh = timed(host, s, args.runs)
        rg = timed(g.replay, s, args.runs)
        print(f"{n:>6} {rh[0]:>12.1f} {rg[0]:>12.1f} {rg[0] / rh[0]:>7.3f}")
    del g
    if args.zeroing_only:
        return

    # -- 2. decode prologue host cost ---------------------------------------------------
    rng = np.random.default_rng(0)
    inputs = numpy_inputs(rng, B)
    views = {n: getattr(st, n) for n in inputs}
    # torch: pinned host tensors and device tensors at the same places
    sizes = arena.sizes()
    tok_dev = torch.from_dlpack(arena.view("token_ids", "uint8"))
    scr_dev = torch.from_dlpack(arena.view("scratch", "uint8"))
    meta = st.layout
    regions = {"token_ids": (tok_dev, 0, 4 * M)}
    for name, off in (("positions", meta.positions_offset()), ("seq_slot", meta.seq_slot_offset()),
                      ("slots", meta.slots_offset()), ("seq_lens", meta.seq_lens_offset()),
                      ("block_table", meta.block_table_offset())):
        regions[name] = (scr_dev, 32768 + off, views[name].nbytes)
    pinned = {n: torch.zeros(nb, dtype=torch.uint8, pin_memory=True) for n, (_, _, nb) in regions.items()}
    pinned_np = {n: pinned[n].numpy().view(views[n].dtype).reshape(views[n].shape) for n in regions}
    targets = {n: dev[off:off + nb] for n, (dev, off, nb) in regions.items()}
    zero_views = {n: torch.from_dlpack(arena.view(n, "uint8")) for n in REFERENCE.groups["zero_all"]
                  if getattr(sizes, n)}
    plan = plan_layout(sizes)                      # the torch path trims as zero_all_rows does
    trimmed = [v[:plan.rows_length(n, BATCH)] for n, v in zero_views.items()]

    def torch_copies():
        for n, t in targets.items():
            t.copy_(pinned[n], non_blocking=True)

    def torch_zero():
        for t in trimmed:
            t.zero_()

    g_torch = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_torch, stream=s):
        torch_zero()
    st.tokens = BATCH
    g_one = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_one, stream=s):
        st.upload(s)

    def m_eager():
        fill(views, inputs)
        st.tokens = BATCH
        st.upload(s)

    def m_graph():
        fill(views, inputs)
        st.tokens = BATCH
        g_one.replay()

    # zeroing first: it clears scratch, where the metadata goes
    def t_eager():
        fill(pinned_np, inputs)
        torch_zero()
        torch_copies()

    def t_graph():
        fill(pinned_np, inputs)
        g_torch.replay()
        torch_copies()

    def only_fill():
        fill(views, inputs)

    drain = torch.cuda.synchronize
    paths = [("numpy fill alone", only_fill), ("metrale: fill + upload (copy + zeroing)", m_eager),
             ("metrale: fill + graph replay (copy + zeroing)", m_graph),
             ("torch eager: fill + 18 zero_() + 6 copy_", t_eager),
             ("torch: fill + graph replay of the zeroing + 6 copy_", t_graph)]
    for _, fn in paths:
        for _ in range(200):
            fn()
        drain()
    res = {}
    for rnd in range(3):                      # interleaved rounds; the median of each path
        for name, fn in paths:
            res.setdefault(name, []).append(host_cost(fn, drain, args.steps // 3))
    print(f"\n2. decode prologue, batch {BATCH}: host µs per step (median of 3 interleaved rounds "
          f"of {args.steps // 3})")
    te = statistics.median(res[paths[3][0]])
    tg = statistics.median(res[paths[4][0]])
    print(f"{'path':<52} {'host µs':>8} {'x torch graph':>14} {'x torch eager':>14}")
    for name, _ in paths:
        v = statistics.median(res[name])
        print(f"{name:<52} {v:>8.1f} {v / tg:>14.3f} {v / te:>14.3f}")
    # the two metrale paths leave the same bytes as the torch path's copies + zeroing
    m_eager()
    drain()
    snap_m = [t.clone() for t in targets.values()]
    t_eager()
    drain()
    assert all(torch.equal(a, t) for a, t in zip(snap_m, targets.values())), "uploads differ"

    # -- 3. one graph against one per bucket -------------------------------------------
    print(f"\n3. graphs: one for every batch size against one per bucket ({len(BUCKETS)} sizes)")

    def per_bucket(i, stream):
        torch_copies_on(stream)
        arena.zero_all_rows(stream=stream, tokens=BUCKETS[i])

    def torch_copies_on(stream):
        with torch.cuda.stream(stream):
            torch_copies()

    def one(i, stream):
        st.upload(stream)

    secs35, mem35, g35 = graph_memory_and_time(per_bucket, len(BUCKETS))
    secs1, mem1, g1 = graph_memory_and_time(one, 1)
    print(f"{'':<36} {'graphs':>7} {'capture + instantiate ms':>25} {'device memory':>14}")
    print(f"{'one per bucket (host count)':<36} {len(g35):>7} {secs35 * 1e3:>25.1f} {mem35:>14,}")
    print(f"{'one graph (device count)':<36} {len(g1):>7} {secs1 * 1e3:>25.1f} {mem1:>14,}")
    torch.cuda.synchronize()      # the views and graphs hold the arena until the process ends


if __name__ == "__main__":
    main()
