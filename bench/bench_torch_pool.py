"""GPU benchmark of the arena's torch pool (metrale.torch.pool), with anchors
measured in the same process.

The model: a Llama-like decoder in plain torch (8 layers, hidden 2048, 16 heads
of 128, SwiGLU 5632, RMSNorm, RoPE, bf16 random weights, fixed seed) whose decode
step attends over a static KV cache [layers, 2, 512, ctx, heads, head_dim], the
new token's k/v written in its last slot first (so a step's output depends on
its inputs alone).  Weights, cache and static tensors are outside the pool.

(a) graph memory, nano-vllm style: 36 graphs (batch 1, 2, 4, 8, 16..512 by 16)
    captured largest first, (1) each in a private pool, (2) in one shared torch
    pool, (3) in the arena's pool; the largest graph alone as an anchor; replays
    checked against eager.
(b) arena.sleep() / wake() (discard) with the 36 graphs and live tensors in the
    pool, every graph replayed byte-exact after each wake.  Anchors: the same
    arena without a pool, and one VMM handle per pool segment (vLLM's way).
(c) the eager decode step at batch 64 in the pool (mt.use_pool) against torch's
    default allocator, alternated per round.

Run:  python bench/bench_torch_pool.py [--runs 20] [--part a,b,c] [--skip-private]
"""

import argparse
import contextlib
import gc
import itertools
import shlex
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from cuda.bindings import driver

import metrale
import metrale.torch as mt
from metrale import BufferArena, CudaBackend, ModelConfig

LIMITS = (256, 4096, 16, 32)            # a small arena: the pool is what is measured
SIZES = [1, 2, 4, 8] + list(range(16, 513, 16))     # nano-vllm's graph batch sizes
CHECKED = (1, 8, 144, 512)              # batch sizes whose replays are compared to eager
LAYERS, HIDDEN, HEADS, HEAD_DIM, INTER, VOCAB = 8, 2048, 16, 128, 5632, 32000
BF16 = torch.bfloat16
FAILED = []


def ok(res):
    err = res[0] if isinstance(res, tuple) else res
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"driver call failed: {err}")
    return res[1] if isinstance(res, tuple) and len(res) == 2 else res


def row(what, value):
    print(f"{what:<66} {value}", flush=True)


def check(cond, what):
    row(f"check: {what}", "ok" if cond else "FAILED")
    if not cond:
        FAILED.append(what)


def mib(n):
    return f"{n / 2**20:,.1f} MiB"


def ratio(a, b):
    return f"{a / b:.3f}x" if a is not None and b else "n/a"


def med(xs):
    return f"{statistics.median(xs):8.3f} ms  ({min(xs):.3f} .. {max(xs):.3f})"


def wall(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def settle():
    """What nano-vllm and the brief do between approaches: the freed graphs'
    memory goes back to the device."""
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()


def new_arena(gpu, cfg):
    return BufferArena.new(cfg, *LIMITS, gpu, reserve=LIMITS)


# -- the model ------------------------------------------------------------------------------

def rms(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(BF16) * w


def rope(x, cos, sin):          # x [bs, heads, head_dim]; cos, sin [bs, head_dim / 2]
    x1, x2 = x.chunk(2, -1)
    c, s = cos[:, None], sin[:, None]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)


class Decoder:
    """The decode step of a Llama-like decoder, one token per sequence."""

    def __init__(self, ctx, max_bs, seed=0):
        g = torch.Generator(device="cuda")
        g.manual_seed(seed)

        def rnd(*shape, std=1.0):
            return torch.empty(shape, dtype=BF16, device="cuda").normal_(0.0, std, generator=g)

        self.ctx = ctx
        self.emb = rnd(VOCAB, HIDDEN)
        def per_layer(rows, cols):       # a weight per layer, std 1/sqrt(fan-in)
            return [rnd(rows, cols, std=cols ** -0.5) for _ in range(LAYERS)]

        self.wqkv = per_layer(3 * HEADS * HEAD_DIM, HIDDEN)
        self.wo = per_layer(HIDDEN, HEADS * HEAD_DIM)
        self.wgu = per_layer(2 * INTER, HIDDEN)
        self.wd = per_layer(HIDDEN, INTER)
        self.ln1 = [1 + rnd(HIDDEN, std=0.1) for _ in range(LAYERS)]
        self.ln2 = [1 + rnd(HIDDEN, std=0.1) for _ in range(LAYERS)]
        self.lnf = 1 + rnd(HIDDEN, std=0.1)
        self.kv = rnd(LAYERS, 2, max_bs, ctx, HEADS, HEAD_DIM)
        inv = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2, device="cuda") / HEAD_DIM)
        ang = torch.arange(ctx, device="cuda", dtype=torch.float32)[:, None] * inv[None]
        self.cos, self.sin = ang.cos().to(BF16), ang.sin().to(BF16)
        # static inputs / output, sized for the largest batch (nano-vllm's model_runner)
        self.ids = torch.randint(0, VOCAB, (max_bs,), device="cuda", generator=g)
        self.pos = torch.full((max_bs,), ctx - 1, dtype=torch.int64, device="cuda")
        self.out = torch.zeros(max_bs, HIDDEN, dtype=BF16, device="cuda")

    def __call__(self, ids, pos):
        bs = ids.shape[0]
        h = F.embedding(ids, self.emb)
        cos, sin = self.cos[pos], self.sin[pos]
        for i in range(LAYERS):
            q, k, v = F.linear(rms(h, self.ln1[i]), self.wqkv[i]).view(bs, 3, HEADS,
                                                                        HEAD_DIM).unbind(1)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            kc, vc = self.kv[i, 0, :bs], self.kv[i, 1, :bs]
            kc[:, self.ctx - 1] = k     # the new token's slot, written before it is read
            vc[:, self.ctx - 1] = v
            o = F.scaled_dot_product_attention(q.unsqueeze(2), kc.transpose(1, 2),
                                               vc.transpose(1, 2))
            h = h + F.linear(o.reshape(bs, HEADS * HEAD_DIM), self.wo[i])
            gate, up = F.linear(rms(h, self.ln2[i]), self.wgu[i]).chunk(2, -1)
            h = h + F.linear(F.silu(gate) * up, self.wd[i])
        return rms(h, self.lnf)

    def step(self, bs):
        self.out[:bs] = self(self.ids[:bs], self.pos[:bs])


def capture(m, sizes, pool, stream):
    """nano-vllm's capture_cudagraph: largest first, an eager warm-up before each.
    pool: None (each graph its own private pool), "shared" (the first graph's
    pool) or a pool id."""
    graphs = {}
    for bs in sorted(sizes, reverse=True):
        m.step(bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=None if pool == "shared" else pool, stream=stream):
            m.step(bs)
        if pool == "shared":
            pool = g.pool()
        graphs[bs] = g
    torch.cuda.synchronize()
    return graphs


def compare(m, graphs, eager):
    """(byte-exact count, worst max |diff|, all close) of the replays against eager."""
    exact, worst, close = 0, 0.0, True
    for bs, ref in eager.items():
        graphs[bs].replay()
        got = m.out[:bs]
        exact += torch.equal(got, ref)
        d = (got.float() - ref.float()).abs().max().item()
        worst = max(worst, d)
        close &= d <= 1e-2 * ref.float().abs().max().item()
    return exact, worst, close


# -- (a) graph memory -----------------------------------------------------------------------

def part_a(env, args):
    m, cap, gpu, cfg = env["model"], env["cap"], env["gpu"], env["cfg"]
    eager = {}
    for bs in CHECKED:
        m.step(bs)
        eager[bs] = m.out[:bs].clone()
    nbytes = int(args.pool_gib * 2**30)
    mem = {}
    ways = ([] if args.skip_private else ["private"]) + ["shared", "metrale", "largest alone"]
    for way in ways:
        settle()
        arena = pool = None
        if way == "metrale":
            arena = new_arena(gpu, cfg)
            pool = mt.pool(arena, nbytes).id        # keep the id only: close_pool drops the MemPool
        elif way == "shared":
            pool = "shared"
        elif way == "largest alone":
            pool = torch.cuda.graph_pool_handle()
        sizes = [max(SIZES)] if way == "largest alone" else SIZES
        r0 = torch.cuda.memory_reserved()
        t0 = time.perf_counter()
        graphs = capture(m, sizes, pool, cap)
        took = time.perf_counter() - t0
        settle()
        mem[way] = torch.cuda.memory_reserved() - r0
        row(f"({way}) {len(graphs)} graphs: torch reserved delta",
            f"{mib(mem[way])} (capture {took:.2f} s)")
        if arena is not None:
            s = arena.pool.stats()
            mem["committed"], mem["peak"] = s["committed"], s["peak_in_use"]
            row("(metrale) pool committed / in use / peak in use",
                f"{mib(s['committed'])} / {mib(s['in_use'])} / {mib(s['peak_in_use'])}")
            row("(metrale) segments, chunks, handles created, allocs / frees, refused",
                f"{s['segments']}, {s['chunks']}, {s['creates']}, {s['allocs']} / {s['frees']}, "
                f"{s['refused']}")
            check(s["refused"] == 0, "(metrale) the pool refused no segment")
        if way != "largest alone":
            exact, worst, close = compare(m, graphs, eager)
            row(f"({way}) replays vs eager at batch {CHECKED}",
                f"{exact}/{len(eager)} byte-exact, max |diff| {worst:.3g}")
            check(close, f"({way}) replays match eager (exact or within 1% of max |x|)")
        del graphs
        settle()
        if arena is not None:
            mt.close_pool(arena)
            arena.release()
    shared = mem.get("shared")
    print()
    row("private / shared (torch reserved)", ratio(mem.get("private"), shared))
    row("metrale committed / shared (goal <= 1.0x)", ratio(mem.get("committed"), shared))
    row("metrale peak in use / shared", ratio(mem.get("peak"), shared))
    row("metrale torch reserved delta / shared", ratio(mem.get("metrale"), shared))
    row("largest graph alone / shared (all 36)", ratio(mem.get("largest alone"), shared))


# -- (b) sleep and wake ---------------------------------------------------------------------

class PerSegment:
    """vLLM's sleep mode (CuMemAllocator): one physical handle per torch segment;
    sleep unmaps and releases each, wake creates, maps and grants access to each,
    one driver call apiece, over one reserved range."""

    def __init__(self, sizes, dev):
        self.prop = driver.CUmemAllocationProp()
        self.prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self.prop.location.id = dev
        self.acc = driver.CUmemAccessDesc()
        self.acc.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self.acc.location.id = dev
        self.acc.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.sizes, self.total = list(sizes), sum(sizes)
        self.base = int(ok(driver.cuMemAddressReserve(self.total, 0, 0, 0)))
        self.at = [self.base + o for o in itertools.accumulate([0] + self.sizes[:-1])]
        self.handles = []
        self.map_all()

    def map_all(self):
        for p, n in zip(self.at, self.sizes):
            h = ok(driver.cuMemCreate(n, self.prop, 0))
            ok(driver.cuMemMap(p, n, 0, h, 0))
            ok(driver.cuMemSetAccess(p, n, [self.acc], 1))
            self.handles.append(h)

    def unmap_all(self):
        ok(driver.cuCtxSynchronize())       # as arena.sleep waits for the device's work
        for p, n, h in zip(self.at, self.sizes, self.handles):
            ok(driver.cuMemUnmap(p, n))
            ok(driver.cuMemRelease(h))
        self.handles = []

    def close(self):
        if self.handles:
            self.unmap_all()
        ok(driver.cuMemAddressFree(self.base, self.total))


def part_b(env, args):
    m, cap, gpu, cfg, runs = env["model"], env["cap"], env["gpu"], env["cfg"], args.runs
    arena, plain, anchor = new_arena(gpu, cfg), new_arena(gpu, cfg), None
    graphs = live = None
    try:
        pool_id = mt.pool(arena, int(args.pool_gib * 2**30)).id
        graphs = capture(m, SIZES, pool_id, cap)
        with mt.use_pool(arena):        # live tensors in the pool beside the graphs' memory
            live = [torch.full((n,), 7, dtype=torch.uint8, device="cuda")
                    for n in (4 << 20, 32 << 20, 256 << 20)]
        inputs = (m.ids.clone(), m.pos.clone())

        def replay_all():
            # re-run semantics: inputs refilled, every graph recomputes its outputs
            m.ids.copy_(inputs[0])
            m.pos.copy_(inputs[1])
            outs = {}
            for bs, g in graphs.items():
                g.replay()
                outs[bs] = m.out[:bs].clone()
            torch.cuda.synchronize()
            return outs

        ref = replay_all()
        again = replay_all()        # the baseline: replays without a sleep between them
        base_bad = sum(not torch.equal(again[bs], ref[bs]) for bs in ref)
        row("replays differing from the first, with no sleep between", f"{base_bad} of {len(ref)}")
        segs, s = arena.pool.segments(), arena.pool.stats()
        ms = arena.memory_stats()
        row("pool: segments, chunks, in use / committed",
            f"{s['segments']}, {s['chunks']}, {mib(s['in_use'])} / {mib(s['committed'])}")
        row("arena.memory_stats(): pool reserved / committed / in use / peak",
            f"{mib(ms['pool_reserved_bytes'])} / {mib(ms['pool_committed_bytes'])}"
            f" / {mib(ms['pool_in_use_bytes'])} / {mib(ms['pool_peak_in_use_bytes'])}")
        row("arena buffers mapped; live tensors in the pool",
            f"{mib(arena.committed_bytes())}; {mib(sum(t.numel() for t in live))}")
        anchor = PerSegment([n for _, n in segs], torch.cuda.current_device())
        ps, pw, qs, qw, au, am, given = [], [], [], [], [], [], []
        bad, moved, awake_ok = 0, 0, True
        for _ in range(runs):
            torch.cuda.synchronize()
            free0 = torch.cuda.mem_get_info()[0]
            ps.append(wall(arena.sleep))
            given.append(torch.cuda.mem_get_info()[0] - free0)
            awake_ok &= arena.pool.stats()["asleep"]
            pw.append(wall(arena.wake))
            awake_ok &= not arena.pool.stats()["asleep"]
            got = replay_all()
            bad += sum(not torch.equal(got[bs], ref[bs]) for bs in ref)
            moved += arena.pool.segments() != segs
            qs.append(wall(plain.sleep))
            qw.append(wall(plain.wake))
            au.append(wall(anchor.unmap_all))
            am.append(wall(anchor.map_all))
        row("arena (+ pool) sleep() wall", med(ps))
        row("arena (+ pool) wake() wall (maps, zeroes, syncs)", med(pw))
        row("anchor: arena without a pool, sleep()", med(qs))
        row("anchor: arena without a pool, wake()", med(qw))
        row(f"anchor: per-segment unmap + release ({len(segs)} segments)", med(au))
        row(f"anchor: per-segment create + map + access ({len(segs)} segments)", med(am))
        mps, mpw, mqs, mqw, mau, mam = map(statistics.median, (ps, pw, qs, qw, au, am))
        row("the pool's share: sleep / wake (with - without a pool)",
            f"{mps - mqs:.3f} ms / {mpw - mqw:.3f} ms")
        row("pool sleep / per-segment unmap (whole sleep; pool's share)",
            f"{ratio(mps, mau)}; {ratio(mps - mqs, mau)}")
        row("pool wake / per-segment map (whole wake; pool's share)",
            f"{ratio(mpw, mam)}; {ratio(mpw - mqw, mam)}")
        row("goal: discard sleep <= 5 ms, wake <= 5 ms (medians, whole arena)",
            f"{mps:.3f} / {mpw:.3f} ms: {'met' if max(mps, mpw) <= 5 else 'NOT met'}")
        row("device memory given back by sleep (cuMemGetInfo), min / committed",
            f"{mib(min(given))} / {mib(s['committed'] + arena.committed_bytes())}")
        check(awake_ok, "the pool sleeps with the arena and wakes with it")
        check(moved == 0, "no segment moved through sleep / wake")
        check(bad == 0, f"{runs} x {len(ref)} replays after wake byte-exact ({bad} differ)")
    finally:
        graphs = live = None        # torch gives the pool's segments back
        settle()
        if anchor is not None:
            anchor.close()
        if arena.pool is not None:
            mt.close_pool(arena)
        arena.release()
        plain.release()


# -- (c) a decode step's allocations --------------------------------------------------------

def part_c(env, args):
    m, gpu, cfg, runs = env["model"], env["gpu"], env["cfg"], args.runs
    arena = new_arena(gpu, cfg)
    ys = []
    try:
        mt.pool(arena, int(args.pool_gib * 2**30))
        bs = 64
        ids, pos = m.ids[:bs], m.pos[:bs]

        def per_step(in_pool):
            """ms per eager step, `args.steps` back to back, synchronized at both ends."""
            with mt.use_pool(arena) if in_pool else contextlib.nullcontext():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    y = m(ids, pos)
                torch.cuda.synchronize()
                t = (time.perf_counter() - t0) * 1e3 / args.steps
            return t, y

        for _ in range(3):              # warm-up: the pool's segments, kernels, caches
            per_step(True)
            per_step(False)
        allocs0 = arena.pool.stats()["allocs"]
        inside, outside, rounds = [], [], []
        for r in range(runs):
            for in_pool in ((True, False) if r % 2 else (False, True)):   # alternated
                (inside if in_pool else outside).append(per_step(in_pool)[0])
            rounds.append(inside[-1] / outside[-1])
        s = arena.pool.stats()
        row(f"eager decode step, batch {bs}, default allocator", med(outside))
        row(f"eager decode step, batch {bs}, in the arena's pool", med(inside))
        row("pool / default (goal: within noise)",
            f"{ratio(statistics.median(inside), statistics.median(outside))} of the medians; "
            f"{statistics.median(rounds):.3f}x median of {runs} alternated rounds")
        row("pool segments, in use; segment allocs during the timed steps",
            f"{s['segments']}, {mib(s['in_use'])}; {s['allocs'] - allocs0}")
        ys = [per_step(True)[1], per_step(False)[1]]
        check(torch.equal(ys[0], ys[1]), "the step's output is the same in the pool and out of it")
    finally:
        ys = None
        settle()
        if arena.pool is not None:
            mt.close_pool(arena)
        arena.release()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--part", default="a,b,c", help="parts to run, e.g. a,b")
    ap.add_argument("--skip-private", action="store_true",
                    help="(a): skip the 36 private pools")
    ap.add_argument("--ctx", type=int, default=256, help="KV cache tokens per sequence")
    ap.add_argument("--pool-gib", type=float, default=8.0, help="the pool's range, GiB")
    ap.add_argument("--steps", type=int, default=10, help="(c): steps per timed run")
    args = ap.parse_args()
    parts = [p.strip() for p in args.part.split(",") if p.strip()]
    torch.cuda.init()
    torch.set_grad_enabled(False)
    gpu = CudaBackend(0)
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__} (CUDA {torch.version.cuda});"
          f" metrale {metrale.__version__}")
    print(f"command: python {shlex.join(sys.argv)}")
    m = Decoder(args.ctx, max(SIZES))
    cap = torch.cuda.Stream()           # every capture on this stream (shared pools need one)
    # cuBLAS's workspace is allocated per (handle, stream) by the caching allocator:
    # made here on both streams, it stays out of every graph's pool.
    m.step(max(SIZES))
    with torch.cuda.stream(cap):
        m.step(max(SIZES))
    settle()
    weights = torch.cuda.memory_allocated()
    print(f"model: {LAYERS} layers, hidden {HIDDEN}, ctx {args.ctx}; weights + KV cache + "
          f"static tensors {weights / 2**30:.2f} GiB (default allocator)")
    env = {"model": m, "cap": cap, "gpu": gpu, "cfg": ModelConfig.preset("qwen3-next-80b")}
    known = {"a": (part_a, "graph memory: 36 graphs, three pools"),
             "b": (part_b, "sleep / wake of the pool"), "c": (part_c, "a decode step's allocations")}
    for p in parts:
        fn, title = known.get(p, (None, "unknown part"))
        print(f"\n-- ({p}) {title} " + "-" * 40)
        if fn is None:
            FAILED.append(f"unknown part {p!r}")
            continue
        try:
            fn(env, args)
        except Exception:
            traceback.print_exc()
            FAILED.append(f"part ({p}) raised")
        settle()
    print()
    row("checks failed", ", ".join(FAILED) if FAILED else "none")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
