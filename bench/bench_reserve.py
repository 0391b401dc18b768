"""GPU benchmark of reserved arenas (stable addresses): sleep, wake, resize and
the fused zeroing, with anchors measured in the same process.

Qwen3-Next-80B preset, max_batch_tokens 8192 (max_seq_len 4096, kv_block_size
16, max_batch_size 32), reserved at those limits (about 2.27 GB mapped):

* sleep(keep=()) and wake() (zeroing included: wake synchronizes), host wall
  time (perf_counter, median and min..max of N rounds), the physical handles
  mapped, and cuMemGetInfo before / after: the share of the mapped bytes sleep
  gives back and wake takes again;
* anchors: cuMemFree + cuMemAlloc of the same bytes (what a new arena costs),
  and re-capturing a torch CUDA graph of a decode-like step over the arena
  (what a moved pointer costs an engine that captured graphs);
* sleep(keep=hidden_states, residual) and sleep(offload=every buffer) with
  their wakes, after the first (which makes the host memory), against
  copying the same bytes device -> pinned host and back (torch), the keep
  also against plain sleep() + wake() + those copies in the same rounds
  (issue 37's measure), and the device memory sleep(offload=...) gives back;
* prepare_sleep(keep=every buffer), then sleep(keep=every buffer) and its
  wake against the same copies, and against plain sleep() + wake() + the
  copies (issue 37's measure);
* resize 1024 -> 8192 -> 1024 on an arena reserved for 8192: times, pointers
  unchanged, mapped bytes before / after, and the peak of used device memory
  during the growth (cuMemGetInfo, after each step of it) against the new size;
* zero_all / zero_prefill_essentials on the reserved arena (one launch of the
  range kernel over non-contiguous buffers) against one cuMemsetD32Async of the
  same bytes on a plain allocation: GPU µs per operation, 20 back to back
  between CUDA events, median of N.

Run:  python bench/bench_reserve.py [--runs 30]
"""

import argparse
import statistics
import time

import torch
from cuda.bindings import driver

from metrale import REFERENCE, BufferArena, CudaBackend, ModelConfig

# Run as a script from bench/: its sibling holds the shared timing.
from bench_cuda import timed_back_to_back

LIMITS = (8192, 4096, 16, 32)


def ok(res):
    err = res[0] if isinstance(res, tuple) else res
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"driver call failed: {err}")
    return res[1] if isinstance(res, tuple) and len(res) == 2 else res


def stats(ms):
    return f"{statistics.median(ms):8.3f} ms  ({min(ms):.3f} .. {max(ms):.3f})"


def wall(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def per_op_us(fn, stream, runs):
    """GPU µs per operation, 20 back to back (bench_cuda's measurement), after
    three warm-up calls."""
    for _ in range(3):
        fn()
    return timed_back_to_back(fn, stream, runs)


def copy_both_ways(nbytes, runs):
    """ms to copy `nbytes` device -> pinned host and back (torch, synchronized)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out, back = [], []
    for _ in range(runs):
        torch.cuda.synchronize()
        out.append(wall(lambda: (host.copy_(dev), torch.cuda.synchronize())))
        back.append(wall(lambda: (dev.copy_(host), torch.cuda.synchronize())))
    return out, back


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    runs = args.runs
    cfg = ModelConfig.preset("qwen3-next-80b")
    gpu = CudaBackend(0)
    torch.cuda.init()
    stream = torch.cuda.current_stream()
    rows = []

    def row(what, value):
        rows.append((what, value))
        print(f"{what:<62} {value}", flush=True)

    print(f"device: {torch.cuda.get_device_name(0)}; {gpu!r}")
    # -- sleep / wake -------------------------------------------------------------
    a = BufferArena.new(cfg, *LIMITS, gpu, reserve=LIMITS)
    mapped = a.committed_bytes()
    row("mapped bytes at max_batch_tokens 8192", f"{mapped:,} ({mapped / 1e9:.3f} GB)")
    row("reserved bytes", f"{a.slab_bytes():,}")
    row("physical handles", f"{gpu.handle_count}")
    ptrs = [a.buffers[n].ptr for n in a.buffers]
    sleeps, wakes, given, taken = [], [], [], []
    for _ in range(runs):
        torch.cuda.synchronize()
        free0 = gpu.mem_info()[0]
        sleeps.append(wall(a.sleep))
        free1 = gpu.mem_info()[0]
        wakes.append(wall(a.wake))
        free2 = gpu.mem_info()[0]
        given.append((free1 - free0) / mapped)
        taken.append((free1 - free2) / mapped)
    assert ptrs == [a.buffers[n].ptr for n in a.buffers]
    row("sleep(keep=()) wall", stats(sleeps))
    row("wake() wall (maps, zeroes zero_all + norm_unit_w, syncs)", stats(wakes))
    row("given back by sleep (cuMemGetInfo / mapped), min", f"{min(given) * 100:.2f} %")
    row("taken again by wake (cuMemGetInfo / mapped), min", f"{min(taken) * 100:.2f} %")

    # -- sleep(keep=...): the copies, the pinned buffers made by the first sleep ------
    keep = ("hidden_states", "residual")
    kb = sum(a.nbytes(n) for n in keep)
    first = wall(lambda: a.sleep(keep=keep)), wall(a.wake)
    # each round: the sleep and wake, then their parts: a plain sleep and wake
    # and the anchor's copies (a noisy host link drifts: the per-round ratios
    # are compared in alternation too)
    host = torch.empty(kb, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(kb, dtype=torch.uint8, device="cuda")
    ks, kw, ps, pw, out, back, rounds = [], [], [], [], [], [], []
    for _ in range(2 * runs):
        torch.cuda.synchronize()
        ks.append(wall(lambda: a.sleep(keep=keep)))
        kw.append(wall(a.wake))
        ps.append(wall(a.sleep))
        pw.append(wall(a.wake))
        out.append(wall(lambda: (host.copy_(dev), torch.cuda.synchronize())))
        back.append(wall(lambda: (dev.copy_(host), torch.cuda.synchronize())))
        rounds.append((ks[-1] + kw[-1]) / (ps[-1] + pw[-1] + out[-1] + back[-1]))
    row(f"sleep(keep={keep}): {kb:,} bytes; first sleep / wake",
        f"{first[0]:.3f} ms / {first[1]:.3f} ms (makes the pinned buffers)")
    row("sleep(keep=...) wall, after the first", stats(ks))
    row("wake() with the kept copies back, wall", stats(kw))
    row("anchor: copy those bytes out / back (pinned, torch)", f"{statistics.median(out):.3f} ms / "
        f"{statistics.median(back):.3f} ms")
    row("plain sleep() / wake() in the same rounds", f"{statistics.median(ps):.3f} ms / "
        f"{statistics.median(pw):.3f} ms")
    ratio = (statistics.median(ks) + statistics.median(kw)) / sum(
        statistics.median(x) for x in (ps, pw, out, back))
    row("sleep + wake (keep) / (sleep() + wake() + the copies)", f"{ratio:.3f}x of the medians; "
        f"{statistics.median(rounds):.3f}x median of {len(rounds)} alternated rounds "
        "(target <= 1.1x)")

    # -- sleep(offload=every buffer): host memory at the same addresses -----------------
    names = tuple(a.buffers)
    torch.cuda.synchronize()
    first = wall(lambda: a.sleep(offload=names)), wall(a.wake)
    os_, ow, og = [], [], []
    for _ in range(max(5, runs // 3)):
        torch.cuda.synchronize()
        free0 = gpu.mem_info()[0]
        os_.append(wall(lambda: a.sleep(offload=names)))
        og.append((gpu.mem_info()[0] - free0) / mapped)
        ow.append(wall(a.wake))
    ob = a.memory_stats()["host_offload_bytes"]
    out, back = copy_both_ways(sum(a.nbytes(n) for n in names), max(5, runs // 3))
    row("sleep(offload=all) first sleep / wake (makes the host handles)",
        f"{first[0]:.3f} ms / {first[1]:.3f} ms; host memory {ob:,} bytes in "
        f"{a.memory_stats()['host_handles']} handles")
    row("sleep(offload=all) wall, after the first", stats(os_))
    row("wake() after sleep(offload=all), wall", stats(ow))
    row("anchor: copy the buffers' bytes out / back (pinned, torch)",
        f"{statistics.median(out):.3f} ms / {statistics.median(back):.3f} ms")
    row("sleep(offload=all) / copy out; wake / copy back",
        f"{statistics.median(os_) / statistics.median(out):.3f}x; "
        f"{statistics.median(ow) / statistics.median(back):.3f}x (goal <= 1.1x each)")
    row("device memory given back by sleep(offload=all), min", f"{min(og) * 100:.2f} % (>= 99 %)")
    sd, wd = [], []
    for _ in range(runs):
        torch.cuda.synchronize()
        sd.append(wall(a.sleep))
        wd.append(wall(a.wake))
    row(f"sleep() / wake() once offloaded ({a.memory_stats()['physical_handles']} handles)",
        f"{statistics.median(sd):.3f} ms / {statistics.median(wd):.3f} ms")

    # -- sleep(keep=every buffer): the same bytes, nothing mapped at their addresses ------
    prep = wall(lambda: a.prepare_sleep(keep=names))
    ka, kb = [], []
    for _ in range(max(5, runs // 3)):
        torch.cuda.synchronize()
        ka.append(wall(lambda: a.sleep(keep=names)))
        kb.append(wall(a.wake))
    row("prepare_sleep(keep=all) (makes the pinned copies)",
        f"{prep:.3f} ms; pinned {a.memory_stats()['host_keep_bytes']:,} bytes")
    row("sleep(keep=all) wall / wake() after it", f"{statistics.median(ka):.3f} ms / "
        f"{statistics.median(kb):.3f} ms")
    parts = statistics.median(sd) + statistics.median(wd) + statistics.median(out) \
        + statistics.median(back)
    row("sleep(keep=all) / copy out; wake / copy back",
        f"{statistics.median(ka) / statistics.median(out):.3f}x; "
        f"{statistics.median(kb) / statistics.median(back):.3f}x")
    row("sleep + wake (keep=all) / (sleep() + wake() + the copies)",
        f"{(statistics.median(ka) + statistics.median(kb)) / parts:.3f}x (target <= 1.1x)")

    # -- anchors ------------------------------------------------------------------
    fa = []
    p = ok(driver.cuMemAlloc(mapped))
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ok(driver.cuMemFree(p))
        p = ok(driver.cuMemAlloc(mapped))
        fa.append((time.perf_counter() - t0) * 1e3)
    ok(driver.cuMemFree(p))
    row("anchor: cuMemFree + cuMemAlloc of the same bytes", stats(fa))

    x = torch.zeros(4096, device="cuda")
    side = torch.cuda.Stream()

    def step(s):
        a.zero_all_rows(stream=s, tokens=1)
        y = x
        for _ in range(200):
            y = y * 1.0001 + 0.5
        x.copy_(y)

    caps = []
    for _ in range(max(5, runs // 3)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            step(torch.cuda.current_stream())
        torch.cuda.synchronize()
        caps.append((time.perf_counter() - t0) * 1e3)
        del g
    row("anchor: re-capture one torch graph (zero_all_rows + 601 ops)", stats(caps))
    a.release()

    # -- resize 1024 -> 8192 -> 1024 -----------------------------------------------
    torch.cuda.synchronize()
    b = BufferArena.new(cfg, 1024, 4096, 16, 32, gpu, reserve=LIMITS)
    ptrs = [b.buffers[n].ptr for n in b.buffers]
    small = b.committed_bytes()
    free_small = gpu.mem_info()[0]
    up = wall(lambda: b.resize(max_batch_tokens=8192))
    big = b.committed_bytes()
    peak_used = free_small - gpu.mem_info()[0]
    down = wall(lambda: b.resize(max_batch_tokens=1024))
    assert ptrs == [b.buffers[n].ptr for n in b.buffers], "a pointer moved"
    row("resize 1024 -> 8192 wall", f"{up:.3f} ms")
    row("resize 8192 -> 1024 wall", f"{down:.3f} ms")
    row("mapped at 1024 / 8192 / 1024 again",
        f"{small:,} / {big:,} / {b.committed_bytes():,}")
    row("device memory added by the growth (cuMemGetInfo) / (8192 - 1024 mapped)",
        f"{peak_used:,} / {big - small:,} ({peak_used / max(1, big - small):.4f}x)")
    row("handles at 1024 after the round trip", f"{gpu.handle_count}")
    row("every pointer unchanged through 1024 -> 8192 -> 1024", "yes")
    b.release()

    # -- fused zeroing vs one memset ------------------------------------------------------
    c = BufferArena.new(cfg, *LIMITS, gpu, reserve=LIMITS)
    plain = BufferArena.new(cfg, *LIMITS, gpu)
    sizes = c.sizes()
    for helper, group in (("zero_all", "zero_all"), ("zero_prefill_essentials", "prefill")):
        nbytes = sum(getattr(sizes, n) for n in REFERENCE.groups[group])
        base = ok(driver.cuMemAlloc(nbytes))
        cs = driver.CUstream(stream.cuda_stream)
        t_mem = per_op_us(lambda: driver.cuMemsetD32Async(base, 0, nbytes // 4, cs), stream, runs)
        t_res = per_op_us(lambda: getattr(c, helper)(stream=stream), stream, runs)
        t_plain = per_op_us(lambda: getattr(plain, helper)(stream=stream), stream, runs)
        ok(driver.cuMemFree(base))
        row(f"{helper}: reserved arena (one range launch, {len(REFERENCE.groups[group])} buffers)",
            f"{t_res:8.2f} us")
        row(f"{helper}: unreserved arena (one memset incl. padding)", f"{t_plain:8.2f} us")
        row(f"{helper}: one memset of the same {nbytes:,} bytes", f"{t_mem:8.2f} us")
        row(f"{helper}: reserved / memset", f"{t_res / t_mem:8.3f}x (target <= 1.02x)")
    c.release()
    plain.release()


if __name__ == "__main__":
    main()
