"""Host-side microbenchmarks: import cost, accessors, carve, scratch fast path.

Each row is the per-call time of `repeats` timeit runs of `number` calls:
median and spread (min .. max), with the anchors measured in the same process.
Run:  python bench/bench_host.py [--quick]
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import timeit


def measure(stmt, glb, number, repeats):
    t = timeit.Timer(stmt, globals=glb)
    t.timeit(number // 10 or 1)                                 # warm up
    runs = [t.timeit(number) / number * 1e9 for _ in range(repeats)]
    return statistics.median(runs), min(runs), max(runs)


def import_cost(runs):
    """In-process time of `import metrale` in fresh interpreters (ms)."""
    code = "import time; t=time.perf_counter(); import metrale; print((time.perf_counter()-t)*1e3)"
    base = "import time; t=time.perf_counter(); import _testcapi as _; print((time.perf_counter()-t)*1e3)"
    own, ref = [], []
    for _ in range(runs):
        own.append(float(subprocess.check_output([sys.executable, "-c", code])))
        ref.append(float(subprocess.check_output([sys.executable, "-c", base])))
    whole = []
    for _ in range(runs):
        for cmd, out in (("import metrale", whole), ("pass", None)):
            t = timeit.default_timer()
            subprocess.check_call([sys.executable, "-c", cmd])
            dt = (timeit.default_timer() - t) * 1e3
            if out is not None:
                out.append(dt)
            else:
                whole[-1] -= dt
    return own, ref, whole


class SlotsArena:
    """The pure-Python anchor: a __slots__ method returning an int."""
    __slots__ = ("_p",)

    def __init__(self, p):
        self._p = p

    def hidden_states(self):
        return self._p


class RefScratchManager:
    """A Python port of the reference's design: a dict keyed by thread id under a lock."""

    def __init__(self, size, max_threads):
        self._lock = threading.RLock()
        self._map = {}
        self.size, self.max_threads = size, max_threads

    def get_scratch(self):
        tid = threading.get_ident()
        with self._lock:
            s = self._map.get(tid)
            if s is None:
                if len(self._map) >= self.max_threads:
                    raise RuntimeError("limit")
                s = self._map[tid] = bytearray(self.size)
            return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    number, repeats, runs = (100_000, 7, 10) if args.quick else (1_000_000, 15, 40)

    own, ref, whole = import_cost(runs)
    import metrale
    from metrale import BufferArena, BufferSizes, HostBackend, ModelConfig, ScratchSpaceManager

    cfg = ModelConfig.preset("qwen3-next-80b")
    gpu = HostBackend()
    sizes = BufferSizes.from_config(cfg, 128, 4096, 16, 32, env={}).replace(ssm_rowwise_w_bf16=4096)
    arena = BufferArena.from_sizes(cfg, sizes, 128, 32, gpu)
    # An arena with nothing to zero: its zeroing calls cost only the call path
    # (argument checks, the in-flight count, the range computation).
    empty = BufferArena.from_sizes(cfg, BufferSizes(**dict.fromkeys(sizes.as_dict(), 0))
                                   .replace(o_latent=256), 128, 32, gpu)
    moe_cfg = cfg
    slots = SlotsArena(arena.hidden_states())

    class Plain:
        pass
    plain = Plain()
    plain.ptr = arena.hidden_states()

    mgr = ScratchSpaceManager(4096, 8)
    mgr.get_scratch()
    refm = RefScratchManager(4096, 8)
    refm.get_scratch()
    local = threading.local()
    local.space = object()

    glb = dict(arena=arena, empty=empty, gpu=gpu, slots=slots, plain=plain, mgr=mgr, refm=refm, local=local,
               cfg=moe_cfg, dct={"hidden_states": 1})
    rows = [
        ("arena.hidden_states()", "arena.hidden_states()"),
        ("arena.qkv_output_bytes()", "arena.qkv_output_bytes()"),
        ("arena.take_ssm_rowwise_w_bf16(0)", "arena.take_ssm_rowwise_w_bf16(0)"),
        ("arena.moe_fp8_scratch(cfg, 64)", "arena.moe_fp8_scratch(cfg, 64)"),
        ("empty.zero_all(gpu, 0)", "empty.zero_all(gpu, 0)"),
        ("empty.zero_all_rows(gpu, 0, 1)", "empty.zero_all_rows(gpu, 0, 1)"),
        ("anchor: __slots__ method -> int", "slots.hidden_states()"),
        ("anchor: plain attribute read", "plain.ptr"),
        ("anchor: dict lookup", "dct['hidden_states']"),
        ("mgr.get_scratch()", "mgr.get_scratch()"),
        ("anchor: reference port (dict+lock)", "refm.get_scratch()"),
        ("anchor: threading.local read", "local.space"),
    ]
    results = {}
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.platform()}")
    print(f"metrale {metrale.__version__}; {repeats} x {number:,} calls per row\n")
    print(f"{'what':<38} {'median ns':>10} {'min':>8} {'max':>8}")
    for label, stmt in rows:
        med, lo, hi = measure(stmt, glb, number, repeats)
        results[label] = med
        print(f"{label:<38} {med:>10.1f} {lo:>8.1f} {hi:>8.1f}")
    ratio = results["arena.hidden_states()"] / results["anchor: __slots__ method -> int"]
    print(f"\npointer accessor / __slots__ method: {ratio:.2f}x (goal <= 0.55x)")
    print(f"\nimport metrale, in-process (fresh interpreter, {runs} runs): median "
          f"{statistics.median(own):.2f} ms (min {min(own):.2f}, max {max(own):.2f}); "
          f"anchor `import _testcapi`: {statistics.median(ref):.2f} ms")
    print(f"whole process `-c 'import metrale'` minus `-c pass`: median "
          f"{statistics.median(whole):.2f} ms (goal <= 3 ms)")
    arena.release(gpu)
    empty.release(gpu)


if __name__ == "__main__":
    main()
