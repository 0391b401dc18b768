"""Host microbenchmarks through pyperf: accessors, buffers by name (`ptr`,
`ptrs`, for the reference set and an engine's own), call paths, the scratch
fast path and import cost, each beside its anchors in the same invocation.

pyperf runs every benchmark in fresh worker processes, calibrates the loop
count and warns when the figures are unstable; the table at the end gives the
median of each.  pyperf times each benchmark in its own processes, one after
another, and on a noisy machine the speed drifts between them; so the ratio to
the anchor of the group is measured apart, in one process, with the statement
and its anchor timed in alternation (median of 31 pairs of 100,000 calls), and
so is the import cost (40 alternated pairs of fresh interpreters).
Run:  python bench/bench_host.py [-o results.json] [--fast | --rigorous]
(any pyperf option; `python -m pyperf system tune` first on a machine you own).
"""

import statistics
import subprocess
import sys
import threading
import time
import timeit

import pyperf

# -- objects the timed statements use (built in each worker by setup()) --------------


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


def setup():
    """The namespace of the timed statements."""
    from metrale import (REFERENCE, BufferArena, BufferSizes, BufferSpec, HostBackend, ModelConfig,
                         ScratchSpaceManager)
    cfg = ModelConfig.preset("qwen3-next-80b")
    gpu = HostBackend()
    sizes = BufferSizes.from_config(cfg, 128, 4096, 16, 32, env={}).replace(ssm_rowwise_w_bf16=4096)
    arena = BufferArena.from_sizes(sizes, gpu)
    # An arena with nothing to zero: its zeroing calls cost only the call path
    # (argument checks, the in-flight count, the range computation).
    empty = BufferArena.from_sizes(cfg, BufferSizes(**dict.fromkeys(sizes.as_dict(), 0))
                                   .replace(o_latent=256), 128, 32, gpu)
    # An engine's own set (docs/buffer-sets.md): some reference buffers dropped,
    # its own workspaces added.
    own = REFERENCE.without(("ffn_act_q8", "fp8_act")).with_(
        BufferSpec("sampler_probs", "float32", ["max_batch_size", "vocab_size"]))
    custom = BufferArena.new(cfg, 128, 4096, 16, 32, gpu, env={}, buffers=own)
    mgr = ScratchSpaceManager(4096, 8)
    mgr.get_scratch()
    refm = RefScratchManager(4096, 8)
    refm.get_scratch()
    local = threading.local()
    local.space = object()

    # A guard over a reserved arena's classes (awake: check() passes).
    reserved = BufferArena.new(cfg, 128, 4096, 16, 32, gpu, env={},
                               reserve=(128, 4096, 16, 32))
    guard = reserved.guard()

    class Launch:           # what a guarded pass calls: a bound method
        def replay(self):
            pass
    launch = Launch()
    guarded = guard.wrap(launch.replay)

    class Plain:
        pass
    plain = Plain()
    plain.ptr = arena.hidden_states()
    return dict(arena=arena, empty=empty, custom=custom, gpu=gpu, cfg=cfg, mgr=mgr, refm=refm,
                local=local, guard=guard, launch=launch, guarded=guarded,
                slots=SlotsArena(arena.hidden_states()), plain=plain, dct={"hidden_states": 1})


_NS = None


def timed(stmt):
    """A pyperf time function running `stmt` in setup()'s namespace (built once
    per worker process, outside the timing)."""
    def time_func(loops):
        global _NS
        if _NS is None:
            _NS = setup()
        return timeit.Timer(stmt, globals=_NS).timeit(loops)
    return time_func

# (group, label, statement): the first row of a group is its anchor.
ROWS = [
    ("accessor", "anchor: __slots__ method -> int", "slots.hidden_states()"),
    ("accessor", "arena.hidden_states()", "arena.hidden_states()"),
    ("accessor", "arena.qkv_output_bytes()", "arena.qkv_output_bytes()"),
    ("accessor", "anchor: plain attribute read", "plain.ptr"),
    ("accessor", "anchor: dict lookup", "dct['hidden_states']"),
    ("accessor", "arena.take_ssm_rowwise_w_bf16(0)", "arena.take_ssm_rowwise_w_bf16(0)"),
    ("accessor", "arena.moe_fp8_scratch(cfg, 64) (cached)", "arena.moe_fp8_scratch(cfg, 64)"),
    ("accessor", "empty.zero_all(gpu, 0) (call path)", "empty.zero_all(gpu, 0)"),
    ("accessor", "empty.zero_all_rows(gpu, 0, 1) (call path)", "empty.zero_all_rows(gpu, 0, 1)"),
    ("by name", "anchor: arena.hidden_states() (accessor)", "arena.hidden_states()"),
    ("by name", "arena.ptr('hidden_states')", "arena.ptr('hidden_states')"),
    ("by name", "arena.ptrs.hidden_states", "arena.ptrs.hidden_states"),
    ("by name", "arena.buffers['hidden_states'].ptr", "arena.buffers['hidden_states'].ptr"),
    ("by name", "own set: custom.hidden_states()", "custom.hidden_states()"),
    ("by name", "own set: custom.ptr('sampler_probs')", "custom.ptr('sampler_probs')"),
    ("by name", "own set: custom.ptrs.sampler_probs", "custom.ptrs.sampler_probs"),
    ("scratch", "anchor: reference port (dict + lock)", "refm.get_scratch()"),
    ("scratch", "mgr.get_scratch()", "mgr.get_scratch()"),
    ("scratch", "anchor: threading.local read", "local.space"),
    ("guard", "anchor: __slots__ method -> int, again", "slots.hidden_states()"),
    ("guard", "guard.check() (awake; goal <= 50 ns)", "guard.check()"),
    ("guard", "anchor: a bound Python method, called", "launch.replay()"),
    ("guard", "guard.wrap(that method)() (a guarded replay's shape)", "guarded()"),
]


def main():
    runner = pyperf.Runner()
    runner.metadata["description"] = "metrale host microbenchmarks"
    results = {}
    for _, label, stmt in ROWS:
        results[label] = runner.bench_time_func(label, timed(stmt))
    pass_ = runner.bench_command("python -c pass", [sys.executable, "-c", "pass"])
    imp = runner.bench_command("python -c 'import metrale'", [sys.executable, "-c", "import metrale"])
    if runner.args.worker:     # a worker process: the parent prints the table
        return
    ns, anchors = setup(), {}
    print(f"\n{'benchmark':<46} {'median ns':>10} {'x anchor':>9}")
    for group, label, stmt in ROWS:
        anchor = anchors.setdefault(group, stmt)
        print(f"{label:<46} {results[label].median() * 1e9:>10.1f} "
              f"{paired_ratio(stmt, anchor, ns):>9.2f}")
    print(f"\nimport metrale, whole process over a bare interpreter: pyperf medians "
          f"{imp.median() * 1e3:.2f} vs {pass_.median() * 1e3:.2f} ms; alternated pairs: "
          f"{import_delta():.2f} ms median (goal <= 1 ms)")


def paired_ratio(stmt, anchor, ns, pairs=31, number=100_000):
    """Median time ratio of `stmt` to `anchor`, timed in alternation."""
    ts, ta = timeit.Timer(stmt, globals=ns), timeit.Timer(anchor, globals=ns)
    return statistics.median(ts.timeit(number) / ta.timeit(number) for _ in range(pairs))


def import_delta(pairs=40):
    """Median over alternated pairs of fresh interpreters of the extra ms
    `import metrale` costs over `pass`."""
    def run(code):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - t
    return statistics.median((run("import metrale") - run("pass")) * 1e3 for _ in range(pairs))


if __name__ == "__main__":
    main()
