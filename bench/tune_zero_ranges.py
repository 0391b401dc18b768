"""Check and time candidate zero_all_rows kernels on the real ranges.

Builds bench/zero_ranges_variants.cu to PTX with nvcc (or takes --ptx), takes
the zero_all_rows ranges of the Qwen3-Next-80B preset at max_batch_tokens 8192
from metrale's planner, checks each variant (poisoned slab: every range byte
zero, 4 KiB either side untouched) and times it with CUDA events (median of
--runs; each run queued behind a spin kernel, so the events time the GPU and
not the host's issue), beside the shipped kernel and two anchors: one
contiguous cuMemsetD32Async of the same byte count (the limit) and an empty
launch (the fixed cost).
Run on a GPU:  python bench/tune_zero_ranges.py [--runs 200]
"""

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile

from cuda.bindings import driver as cu

from metrale import REFERENCE, BufferSizes, ModelConfig
from metrale._sizing._layout import plan_layout, zero_rows_ranges
from metrale.sizes import Target

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")
MAXR = len(REFERENCE.groups["zero_all"])      # MT_MAX_RANGES of kernels/zero_ranges.h


class Args(ctypes.Structure):
    _fields_ = [("base", ctypes.c_ulonglong), ("offset", ctypes.c_ulonglong * MAXR),
                ("length", ctypes.c_ulonglong * MAXR), ("count", ctypes.c_int)]


class Args2(ctypes.Structure):
    _fields_ = [("base", ctypes.c_ulonglong), ("offset", ctypes.c_ulonglong * MAXR),
                ("length", ctypes.c_ulonglong * MAXR), ("per", ctypes.c_ulonglong),
                ("count", ctypes.c_int)]


class Args3(ctypes.Structure):
    # ctypes' view of mt_zero_args (src/metrale/kernels/zero_ranges.h)
    _fields_ = [("base", ctypes.c_ulonglong), ("offset", ctypes.c_ulonglong * MAXR),
                ("length", ctypes.c_ulonglong * MAXR), ("first", ctypes.c_uint * (MAXR + 1)),
                ("per", ctypes.c_uint), ("count", ctypes.c_int)]


def hb_layout(ranges, per, big_first):
    """(ordered ranges, first[], grid) for the hb_* kernels."""
    rs = sorted(ranges, key=lambda r: -r[1]) if big_first else list(ranges)
    first, g = [], 0
    for _, n in rs:
        first.append(g)
        g += max(1, -(-(n // 16) // per))
    first.append(g)
    return rs, first, g


def ok(res):
    err, *rest = res if isinstance(res, tuple) else (res,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{err!r}")
    return rest[0] if len(rest) == 1 else rest


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--ptx")
    ap.add_argument("--arena-only", action="store_true", help="only the metrale-arena section")
    a = ap.parse_args()
    if a.ptx:
        ptx = open(a.ptx, "rb").read()
    else:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "v.ptx")
            subprocess.run(["nvcc", "-ptx", "-arch=compute_90", "-I", SRC,
                            os.path.join(HERE, "zero_ranges_variants.cu"), "-o", out], check=True)
            ptx = open(out, "rb").read()

    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    sms = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    mod = ok(cu.cuModuleLoadData(ptx + b"\0"))
    stream = ok(cu.cuStreamCreate(1))
    e0, e1 = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))

    cfg = ModelConfig.preset("qwen3-next-80b")
    sizes = BufferSizes.from_config(cfg, 8192, 4096, 16, 32, target=Target(sms, "auto"))
    slab = plan_layout(sizes).slab_bytes
    base = int(ok(cu.cuMemAlloc(slab)))
    print(f"{sms} SMs; slab {slab:,} bytes")

    def launch(fn, grid, block, args):
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        ok(cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, ctypes.addressof(params), 0))

    spin = ok(cu.cuModuleGetFunction(mod, b"spin"))
    cycles = ctypes.c_longlong(400_000)        # ~200 us: longer than any issue below

    def timed(call, runs):
        for _ in range(5):
            call()
        ts = []
        for _ in range(runs):
            # queue the work behind a spin so the events time the GPU, not the host's issue
            sp = (ctypes.c_void_p * 1)(ctypes.addressof(cycles))
            ok(cu.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, ctypes.addressof(sp), 0))
            ok(cu.cuEventRecord(e0, stream))
            call()
            ok(cu.cuEventRecord(e1, stream))
            ok(cu.cuEventSynchronize(e1))
            ts.append(ok(cu.cuEventElapsedTime(e0, e1)) * 1e3)
        return statistics.median(ts), min(ts)

    def make_args(ranges, per=None):
        if isinstance(per, tuple):                  # hb_*: (per, big_first)
            rs, first, _ = hb_layout(ranges, *per)
            args = Args3()
            args.base, args.count, args.per = base, len(rs), per[0]
            for i, (o, n) in enumerate(rs):
                args.offset[i], args.length[i] = o, n
            for i, f in enumerate(first):
                args.first[i] = f
            return args
        args = Args() if per is None else Args2()
        if per is not None:
            args.per = per
        args.base = base
        args.count = len(ranges)
        for i, (o, n) in enumerate(ranges):
            args.offset[i], args.length[i] = o, n
        return args

    def check(fn, grid, block, ranges, per=None):
        ok(cu.cuMemsetD8Async(base, 0xAB, slab, stream))
        launch(fn, grid, block, make_args(ranges, per))
        ok(cu.cuStreamSynchronize(stream))
        for o, n in ranges:
            lo, hi = max(0, o - 4096), min(slab, o + n + 4096)
            buf = bytearray(hi - lo)
            ok(cu.cuMemcpyDtoH(buf, base + lo, hi - lo))
            pre, mid, post = buf[:o - lo], buf[o - lo:o - lo + n], buf[o - lo + n:]
            # a neighbouring range may lie inside the guard band: only bytes of no range must stay
            covered = [(max(lo, ro), min(hi, ro + rn)) for ro, rn in ranges if ro < hi and ro + rn > lo]
            if mid.count(0) != n:
                return False
            for j, b in enumerate(pre + post):
                addr = lo + j if j < len(pre) else o + n + (j - len(pre))
                if b != 0xAB and not any(c0 <= addr < c1 for c0, c1 in covered):
                    return False
        return True

    names = ["v0_stride", "blk_u4", "blk_u2", "hb_u1", "hb_u2", "hb_u4"]
    fns = {n: ok(cu.cuModuleGetFunction(mod, n.encode())) for n in names}
    shipped = open(os.path.join(HERE, "..", "src", "metrale", "kernels", "zero_ranges.ptx"), "rb").read()
    fns["shipped"] = ok(cu.cuModuleGetFunction(ok(cu.cuModuleLoadData(shipped + b"\0")),
                                               b"metrale_zero_ranges"))
    empty = make_args([])
    scenarios = [(f"zero_all_rows(tokens={t})", zero_rows_ranges(sizes, 8192, t)) for t in (1, 16, 4096)]

    def configs(ranges):
        most = max(n for _, n in ranges)
        out = [("v0_stride", max(1, min(-(-(most // 16) // 256), sms * 8)), 256)]
        out.append(("shipped", hb_layout(ranges, 512, True)[2], 256, (512, True)))
        for fn in ("hb_u2", "hb_u4"):
            for per in (256, 512, 768, 1024, 2048, 4096, 8192):
                for big_first in (False, True):
                    out.append((fn, hb_layout(ranges, per, big_first)[2], 256, (per, big_first)))
        return out

    for label, ranges in ([] if a.arena_only else scenarios):
        total = sum(n for _, n in ranges)
        print(f"\n# {label}: {len(ranges)} ranges, {total:,} bytes")
        rows = []
        at = max(ranges, key=lambda r: r[1])[0]
        at = at if at + total <= slab else 0        # the same pages as the kernel, mostly
        rows.append(("anchor: contiguous cuMemsetD32Async (limit)", "",
                     timed(lambda: cu.cuMemsetD32Async(base + at, 0, total // 4, stream), a.runs)))
        rows.append(("anchor: empty launch", "", timed(lambda: launch(fns["v0_stride"], 1, 32, empty), a.runs)))
        for n, g, t, *per in configs(ranges):
            per = per[0] if per else None
            if total < 1 << 28 and not check(fns[n], g, t, ranges, per):
                print(f"WRONG: {n} grid {g} block {t}")
                continue
            args = make_args(ranges, per)
            tag = n + ("" if not isinstance(per, tuple) else " big-first" if per[1] else " in-order")
            tag += f" per {per[0]}" if isinstance(per, tuple) else ""
            rows.append((tag, f"{g}x{t}", timed(lambda: launch(fns[n], g, t, args), a.runs)))
        rows.sort(key=lambda r: r[2][0])
        print(f"{'variant':<46} {'grid':>10} {'median us':>10} {'min':>8} {'TB/s':>7}")
        for lab, cfgs, (med, mn) in rows:
            print(f"{lab:<46} {cfgs:>10} {med:>10.2f} {mn:>8.2f} {total / med / 1e6:>7.2f}")

    # metrale's own call against the raw launch of the same kernel on the same
    # slab: what the Python call path and the arena's placement add, if anything.
    from metrale import BufferArena, CudaBackend
    gpu = CudaBackend(0)
    arena = BufferArena.new(cfg, 8192, 4096, 16, 32, gpu)
    hs = int(stream)
    for tokens in (1, 16):
        ranges = zero_rows_ranges(sizes, 8192, tokens)
        total = sum(n for _, n in ranges)
        abase = arena.hidden_states() - plan_layout(sizes).offsets["hidden_states"]
        per = (512, True)
        rs, first, g = hb_layout(ranges, *per)
        args = make_args(ranges, per)
        args.base = abase
        print(f"\n# on a metrale arena's slab, tokens={tokens}")
        for lab, fn in ((f"arena.zero_all_rows(gpu, stream, {tokens})",
                         lambda: arena.zero_all_rows(gpu, hs, tokens)),
                        ("raw launch of the shipped kernel, same ranges",
                         lambda: launch(fns["shipped"], g, 256, args)),
                        ("contiguous memset of the same bytes",
                         lambda: cu.cuMemsetD32Async(abase + max(ranges, key=lambda r: r[1])[0],
                                                     0, total // 4, stream))):
            med, mn = timed(fn, a.runs)
            print(f"{lab:<52} {med:>10.2f} {mn:>8.2f}")
    arena.release(gpu)
    ok(cu.cuMemFree(base))


if __name__ == "__main__":
    sys.exit(main())
