"""What `metrale.fit` costs, beside its anchor: one sizing evaluation.

A fit is a few sizing evaluations (the 46 sizes and the layout at one
max_batch_tokens), so the anchor is one evaluation: `BufferSizes.from_config`
plus `plan_layout`, and `BufferSizes.from_config` alone.  pyperf times each in
fresh worker processes (median per call); the ratio to the anchor is measured
apart in one process, statement and anchor timed in alternation (median of 31
pairs), since the machine's speed drifts between pyperf's benchmarks.
Run:  python bench/bench_fit.py [-o results.json] [--fast | --rigorous]
"""

import statistics
import timeit

import pyperf


def setup():
    """The namespace of the timed statements."""
    import metrale
    from metrale import BufferSizes, ModelConfig
    from metrale._sizing._layout import plan_layout
    cfg = ModelConfig.preset("qwen3-next-80b")
    return dict(metrale=metrale, BufferSizes=BufferSizes, plan_layout=plan_layout, cfg=cfg,
                GiB=2**30)


# (label, statement): the first row is the anchor.
ROWS = [
    ("anchor: one sizing evaluation (from_config + plan_layout)",
     "plan_layout(BufferSizes.from_config(cfg, 8192, 4096, 16, 32, env={})).slab_bytes"),
    ("anchor: BufferSizes.from_config",
     "BufferSizes.from_config(cfg, 8192, 4096, 16, 32, env={})"),
    ("fit(cfg, 64 GiB): the largest M",
     "metrale.fit(cfg, 64 * GiB, 4096, 16, 32, env={})"),
    ("fit(cfg, 64 GiB, reserve=True, granularity=2 MiB)",
     "metrale.fit(cfg, 64 * GiB, 4096, 16, 32, env={}, reserve=True, granularity=2 << 20)"),
    ("fit(cfg, 64 GiB, max_batch_tokens=8192, kv_bytes_per_token=24576)",
     "metrale.fit(cfg, 64 * GiB, 4096, 16, 32, env={}, max_batch_tokens=8192, "
     "kv_bytes_per_token=24576)"),
]

_NS = None


def timed(stmt):
    def time_func(loops):
        global _NS
        if _NS is None:
            _NS = setup()
        return timeit.Timer(stmt, globals=_NS).timeit(loops)
    return time_func


def paired_ratio(stmt, anchor, ns, pairs=31, number=400):
    """Median time ratio of `stmt` to `anchor`, timed in alternation."""
    ts, ta = timeit.Timer(stmt, globals=ns), timeit.Timer(anchor, globals=ns)
    return statistics.median(ts.timeit(number) / ta.timeit(number) for _ in range(pairs))


def main():
    runner = pyperf.Runner()
    runner.metadata["description"] = "metrale.fit and its anchor"
    results = {label: runner.bench_time_func(label, timed(stmt)) for label, stmt in ROWS}
    if runner.args.worker:     # a worker process: the parent prints the table
        return
    ns, anchor = setup(), ROWS[0][1]
    evals = {label: eval(stmt, ns).evaluations for label, stmt in ROWS if "fit(" in label}
    print(f"\n{'benchmark':<68} {'median us':>10} {'x anchor':>9} {'evals':>6}")
    for label, stmt in ROWS:
        print(f"{label:<68} {results[label].median() * 1e6:>10.1f} "
              f"{paired_ratio(stmt, anchor, ns):>9.2f} {evals.get(label, ''):>6}")


if __name__ == "__main__":
    main()
