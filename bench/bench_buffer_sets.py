"""GPU benchmark of arenas over buffer sets other than REFERENCE (docs/buffer-sets.md).

For each set: zero_all and zero_prefill_essentials against one contiguous
cuMemsetD32Async of the same span, and zero_all_rows(1) against one memset of
the bytes it clears (also with L2 holding clean lines, as after a forward
pass); GPU time from CUDA events (bench_cuda.timed: median of N runs, each
queued behind a spin).  Sets: REFERENCE (its figures must not change), the
Llama-3.1-8B engine's own set of docs/examples/llama31_8b.py, and a set of 30
zero_all buffers (the most one launch holds) with mixed row rules and 4 KiB
and 64 KiB alignments.  Then the host cost of a buffer by name: the compiled
accessor, ``arena.ptr(name)``, ``arena.ptrs.NAME`` and a Python method call,
timed in alternation (median ratio of 31 pairs).
Run:  python bench/bench_buffer_sets.py [--runs 50] [--m 8192]
"""

import argparse
import os
import runpy
import statistics
import sys
import timeit

import torch
from cuda.bindings import driver

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import timed  # noqa: E402

from metrale import REFERENCE, BufferArena, BufferSpec, CudaBackend, ModelConfig  # noqa: E402
from metrale._sizing._layout import plan_layout  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wide_set():
    """REFERENCE without its quantized-path scratch, with 12 more zero_all
    buffers (30 in all): rows 'M', 'Mp' and 'whole', aligned to 4 KiB or 64 KiB."""
    llama = runpy.run_path(os.path.join(ROOT, "docs", "examples", "llama31_8b.py"))
    base = REFERENCE.without(llama["QUANTIZED"])
    extra = []
    for i in range(12):
        rows = ("M", "Mp", "whole")[i % 3]
        first = "Mp" if rows == "Mp" else "max_batch_tokens"
        extra.append(BufferSpec(f"ws{i}", "bfloat16", [first, 256 * (i + 1)], zero_all=True,
                                rows=rows, align=4096 if i % 2 else 65536,
                                prefill=i < 3))
    return base.with_(extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--m", type=int, default=8192)
    args = ap.parse_args()
    torch.cuda.init()
    gpu = CudaBackend(0)
    print(f"{torch.cuda.get_device_name()}; max_batch_tokens {args.m}")
    llama = runpy.run_path(os.path.join(ROOT, "docs", "examples", "llama31_8b.py"))["LLAMA"]
    sets = (("qwen3-next-80b", REFERENCE, "REFERENCE"), ("llama-3.1-8b", llama, "Llama set"),
            ("llama-3.1-8b", wide_set(), "30 zero_all"))
    ts = torch.cuda.Stream()
    torch.cuda.set_stream(ts)
    h = ts.cuda_stream
    cs = driver.CUstream(h)
    weights = torch.rand(64 << 20, device="cuda")       # 256 MB: evicts L2
    arenas = {}
    print(f"\n{'set':<12} {'operation':<32} {'GPU µs':>8} {'anchor µs':>10} {'ratio':>7} {'bytes':>14}")
    for preset, buffers, label in sets:
        cfg = ModelConfig.preset(preset)
        arena = BufferArena.new(cfg, args.m, 4096, 16, 32, gpu, env={}, buffers=buffers)
        arenas[label] = arena
        plan = plan_layout(arena.sizes())
        rows1 = plan.rows_ranges(1)
        n1 = sum(n for _, n in rows1)
        span = max(plan.zero_all[1], plan.zero_prefill[1], n1)
        scratch = torch.empty(span, dtype=torch.uint8, device="cuda")

        def memset(n, scratch=scratch):
            return lambda: driver.cuMemsetD32Async(scratch.data_ptr(), 0, n // 4, cs)

        cases = (("zero_all", lambda a=arena: a.zero_all(gpu, h), memset(plan.zero_all[1]),
                  plan.zero_all[1], None),
                 ("zero_prefill_essentials", lambda a=arena: a.zero_prefill_essentials(gpu, h),
                  memset(plan.zero_prefill[1]), plan.zero_prefill[1], None),
                 (f"zero_all_rows(1) [{len(rows1)} ranges]", lambda a=arena: a.zero_all_rows(gpu, h, 1),
                  memset(n1), n1, None),
                 ("zero_all_rows(1), L2 clean", lambda a=arena: a.zero_all_rows(gpu, h, 1),
                  memset(n1), n1, lambda: weights.sum()))
        for name, op, anchor, nbytes, prelude in cases:
            for _ in range(2):                  # alternate the two, keep the medians
                r_op = timed(op, ts, args.runs, prelude)[0]
                r_an = timed(anchor, ts, args.runs, prelude)[0]
            print(f"{label:<12} {name:<32} {r_op:>8.2f} {r_an:>10.2f} {r_op / r_an:>7.3f} {nbytes:>14,}")

    class Plain:
        def m(self):
            return 1
    glb = dict(ref=arenas["REFERENCE"], own=arenas["Llama set"], plain=Plain())
    print(f"\n{'host cost':<40} {'median ns':>10} {'x accessor':>11} {'x method':>9}")
    anchor, method = "ref.hidden_states()", "plain.m()"
    for stmt in ("ref.hidden_states()", "ref.ptr('hidden_states')", "ref.ptrs.hidden_states",
                 "own.hidden_states()", "own.ptr('sampler_probs')", "own.ptrs.sampler_probs",
                 "plain.m()"):
        t = timeit.Timer(stmt, globals=glb)
        ns = statistics.median(t.timeit(200_000) / 200_000 * 1e9 for _ in range(15))
        ta, tm = timeit.Timer(anchor, globals=glb), timeit.Timer(method, globals=glb)
        ra = statistics.median(t.timeit(100_000) / ta.timeit(100_000) for _ in range(31))
        rm = statistics.median(t.timeit(100_000) / tm.timeit(100_000) for _ in range(31))
        print(f"{stmt:<40} {ns:>10.1f} {ra:>11.2f} {rm:>9.2f}")
    torch.cuda.synchronize()
    for a in arenas.values():
        a.release(gpu)


if __name__ == "__main__":
    main()
