"""The refit's own cost on the host backend: metrale.refit against plain copies (issue 52).

A weight set from tests/data/hf/qwen3-8b.json cut to --layers layers and a
32,000-token vocabulary, in float16 (numpy has no bfloat16: the same bytes), in a host
weight arena; a trainer thread of this process holds the new weights as one
numpy array per parameter.  Timed in alternation in this one process (median
of --runs; time.perf_counter):

- `WeightImport.sync` (the offer, the memfds mapped, one copy per tensor,
  unmapped, committed) while the engine's `WeightExport.sync` waits;
- the anchor: the same per-tensor copies into a buffer of the trainer's own
  (np.copyto), and one copy of all the bytes at once.

The ratio is the protocol's overhead over the copies it makes; on the GPU the
copies are device-to-device (bench/bench_refit.py).

    python bench/bench_refit_host.py [--layers 4] [--runs 7]
"""

import argparse
import json
import os
import statistics
import tempfile
import threading
import time

import numpy as np

from metrale import HostBackend
from metrale.refit import WeightExport, WeightImport
from metrale.weights import hf_params, weight_arena, weight_set

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args(argv)
    with open(os.path.join(HERE, "..", "tests", "data", "hf", "qwen3-8b.json")) as f:
        config = json.load(f)
    config.update(num_hidden_layers=args.layers, vocab_size=32000, dtype="float16")
    config.pop("torch_dtype", None)
    params = hf_params(config)
    ws = weight_set(params)
    rng = np.random.default_rng(0)
    state = {n: rng.standard_normal(s, dtype=np.float32).astype(np.float16)
             for n, (_d, s) in params.items()}
    arena = weight_arena(ws, HostBackend())
    path = os.path.join(tempfile.mkdtemp(), "weights.sock")
    ex = WeightExport(arena, ws, path)
    imp = WeightImport(path, HostBackend())
    own = np.empty(ws.nbytes, np.uint8)
    flat = np.concatenate([a.view(np.uint8).ravel() for a in state.values()])
    views = [(own[ws[n].offset:ws[n].offset + a.nbytes], a.view(np.uint8).ravel())
             for n, a in state.items()]

    def refit():
        done = {}
        t = threading.Thread(target=lambda: done.setdefault("epoch", ex.sync(timeout=60)))
        t.start()
        time.sleep(0.01)                # the offer waiting, as the engine's would be
        t0 = time.perf_counter()
        imp.sync(state)
        dt = time.perf_counter() - t0
        t.join()
        return dt

    def per_tensor():
        t0 = time.perf_counter()
        for d, s in views:
            np.copyto(d, s)
        return time.perf_counter() - t0

    def one_copy():
        t0 = time.perf_counter()
        np.copyto(own[:flat.nbytes], flat)
        return time.perf_counter() - t0

    refit(), per_tensor(), one_copy()           # pages touched once
    r, p, o = [], [], []
    for _ in range(args.runs):
        r.append(refit())
        p.append(per_tensor())
        o.append(one_copy())
    got = np.asarray(arena.view("weights", "uint8"))
    ok = all(got[ws[n].offset:ws[n].offset + a.nbytes].tobytes() == a.tobytes()
             for n, a in state.items())
    del got
    mr, mp, mo = (statistics.median(x) * 1e3 for x in (r, p, o))
    print(json.dumps({"params": len(ws), "bytes": ws.nbytes, "refit_ms": round(mr, 2),
                      "per_tensor_copies_ms": round(mp, 2), "one_copy_ms": round(mo, 2),
                      "refit_over_per_tensor": round(mr / mp, 3),
                      "refit_over_one_copy": round(mr / mo, 3), "bytes_equal": ok}))
    imp.close()
    ex.close()
    arena.release()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
