"""Two installed trees of metrale, timed in alternating processes.

    python bench/compare_trees.py OLD_PYTHON NEW_PYTHON [--rounds 15]

Each round runs one fresh process per tree, in alternating order, and each
process times every row below (timeit, best of 5 repeats of `number` calls,
per call); the table gives, per row, the median over the rounds for each tree
and the median of the per-round ratios new / old.  Alternating processes
cancel most of a noisy machine's drift, which sequential runs (pyperf's
workers, one benchmark after another) do not.  Import cost: the median extra
time of ``import metrale`` over ``pass`` in fresh interpreters, alternated
the same way.  For refactors that must not slow the hot paths down.
"""

import argparse
import json
import statistics
import subprocess
import time

# (label, setup-free statement, calls per timing); `arena`, `empty`, `gpu`,
# `cfg`, `sizes` come from _SETUP.
ROWS = [
    ("arena.hidden_states()", "arena.hidden_states()", 200_000),
    ("arena.qkv_output_bytes()", "arena.qkv_output_bytes()", 200_000),
    ("arena.take_ssm_rowwise_w_bf16(0)", "arena.take_ssm_rowwise_w_bf16(0)", 100_000),
    ("empty.zero_all(gpu, 0) (call path)", "empty.zero_all(gpu, 0)", 100_000),
    ("empty.zero_all_rows(gpu, 0, 1) (call path)", "empty.zero_all_rows(gpu, 0, 1)", 100_000),
    ("from_sizes + release (construction)",
     "build(small).release()", 2_000),
    ("BufferSizes.from_config (sizing)",
     "BufferSizes.from_config(cfg, 8192, 4096, 16, 32, env=noenv)", 2_000),
]

_SETUP = """
from metrale import BufferArena, BufferSizes, HostBackend, ModelConfig
cfg = ModelConfig.preset("qwen3-next-80b")
noenv = {}
gpu = HostBackend()
sizes = BufferSizes.from_config(cfg, 128, 4096, 16, 32, env={}).replace(ssm_rowwise_w_bf16=4096)
# from_sizes(sizes, gpu) where the sizes carry their shape and limits (issue 34),
# the older form before; the same one call in both trees.
if hasattr(BufferSizes, "config"):
    build = lambda s: BufferArena.from_sizes(s, gpu)
else:
    build = lambda s: BufferArena.from_sizes(cfg, s, s.limits.max_batch_tokens,
                                             s.limits.max_batch_size, gpu)
arena = build(sizes)
empty = BufferArena.from_sizes(cfg, BufferSizes(**dict.fromkeys(sizes.as_dict(), 0))
                               .replace(o_latent=256), 128, 32, gpu)
small = BufferSizes.from_config(cfg, 1, 64, 16, 1, env={})
"""

_CHILD = """
import json, sys, timeit
ns = {}
exec(SETUP, ns)
out = {}
for label, stmt, number in json.loads(sys.argv[1]):
    t = timeit.Timer(stmt, globals=ns)
    out[label] = min(t.repeat(5, number)) / number
print(json.dumps(out))
"""


def one(python):
    code = _CHILD.replace("SETUP", repr(_SETUP))
    r = subprocess.run([python, "-c", code, json.dumps(ROWS)], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout)


def import_ms(python):
    t = time.perf_counter()
    subprocess.run([python, "-c", "import metrale"], check=True)
    a = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([python, "-c", "pass"], check=True)
    return (a - (time.perf_counter() - t)) * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    runs = {"old": [], "new": []}
    imports = {"old": [], "new": []}
    for k in range(args.rounds):
        order = ("old", "new") if k % 2 == 0 else ("new", "old")
        for which in order:
            runs[which].append(one(getattr(args, which)))
            imports[which].append(import_ms(getattr(args, which)))
    print(f"{'row':<44} {'old ns':>9} {'new ns':>9} {'new/old':>8}")
    for label, _stmt, _n in ROWS:
        old = [r[label] for r in runs["old"]]
        new = [r[label] for r in runs["new"]]
        ratio = statistics.median(n / o for n, o in zip(new, old))
        print(f"{label:<44} {statistics.median(old) * 1e9:>9.1f} "
              f"{statistics.median(new) * 1e9:>9.1f} {ratio:>8.3f}")
    print(f"{'import metrale (ms over a bare interpreter)':<44} "
          f"{statistics.median(imports['old']):>9.2f} {statistics.median(imports['new']):>9.2f}")


if __name__ == "__main__":
    main()
