"""GPU benchmark of metrale.checkpoint: an engine process checkpointed and
restored by the driver, its captured graph replayed afterwards with no
recapture.

The engine (tests/test_checkpoint_cuda.py's `engine_main`, a process of its
own) builds the Qwen3-Next-80B arena reserved at its limits (max_batch_tokens
8192 by default: about 2.3 GB), optionally plus a plain allocation standing
for weights (--extra-gib), and captures one CUDA graph over the arena
(zero_all, a copy, a memset).  Then, for each of N rounds:

* supervisor: suspend(pid) = lock + checkpoint, resume(pid) = restore +
  unlock, each step's wall time; the GPU's used memory (NVML) before, while
  checkpointed and after; then the engine checks its pointers, its sentinels
  and one replay of the graph it captured at the start, byte for byte;
* self: the engine checkpoints its own pid, with prepare() before and
  finish() after (their times: detaching and attaching the peers of its
  shared arenas; it has none, so they measure the calls themselves, or give
  the reason they cannot run in this build).

Anchors from the same engine: building the arena, capturing the graph (its
first capture, and again), one replay.  And a probe of what a lock does with
GPU work queued: --busy N memsets of the extra allocation queued without
waiting, then lock(timeout=0.2).

Run:  python bench/bench_checkpoint.py [--rounds 5] [--limits 8192] [--extra-gib 8]
      [--json out.json]
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import metrale.checkpoint as ckpt                                     # noqa: E402
from metrale import MetraleError                                     # noqa: E402
from test_checkpoint_cuda import EngineProcess, gpu_used_bytes, self_round   # noqa: E402

GB = 1e9


def ms(values):
    values = [v * 1e3 for v in values]
    return f"{statistics.median(values):9.2f} ms  ({min(values):.2f} .. {max(values):.2f})"


def supervised_round(eng, k):
    r = {"armed": eng.ask(cmd="arm", k=k), "used_before": gpu_used_bytes()}
    r.update(ckpt.suspend(eng.pid, timeout=300))
    r["state"] = ckpt.state(eng.pid)
    r["used_checkpointed"] = gpu_used_bytes()
    r.update(ckpt.resume(eng.pid, timeout=300))
    r["state_after"] = ckpt.state(eng.pid)
    r["used_after"] = gpu_used_bytes()
    r.update(eng.ask(cmd="verify", k=k))
    return r


def progress(kind, r):
    steps = {**r.get("suspend", {}), **r.get("resume", {}), **r}
    print(f"  {kind}: " + ", ".join(f"{s} {steps[s] * 1e3:.1f} ms" for s in
                                    ("lock", "checkpoint", "restore", "unlock") if s in steps)
          + f", given back {(r['used_before'] - r['used_checkpointed']) / GB:.2f} GB, "
          f"ok {r['ok']}", flush=True)


def lock_probe(eng, n):
    """lock(timeout=0.2) with n memsets queued: does it wait for the work?"""
    eng.ask(cmd="busy", n=n)
    t0 = time.perf_counter()
    try:
        ckpt.lock(eng.pid, timeout=0.2)
        outcome = "locked"
    except MetraleError as e:
        outcome = str(e)
    took = time.perf_counter() - t0
    if outcome == "locked":
        ckpt.unlock(eng.pid)
    sync = eng.ask(cmd="sync")["sync_s"]
    return {"queued": n, "lock_s": took, "outcome": outcome, "sync_after_s": sync}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--self-rounds", type=int, default=3)
    ap.add_argument("--limits", type=int, default=8192, help="max_batch_tokens (and reserve)")
    ap.add_argument("--extra-gib", type=float, default=0.0, help="a plain allocation too")
    ap.add_argument("--busy", type=int, default=0, help="memsets queued for the lock probe")
    ap.add_argument("--probe-nvml", action="store_true",
                    help="in the last self round, ask NVML from inside the checkpointed engine")
    ap.add_argument("--json", help="write every measurement here")
    a = ap.parse_args()
    info = ckpt.driver_info()
    eng = EngineProcess(limits=(a.limits, 4096, 16, 32), extra_bytes=int(a.extra_gib * (1 << 30)))
    out = {"driver": info, "ready": eng.ready, "rounds": [], "self": []}
    try:
        committed = eng.ready["committed"] + int(a.extra_gib * (1 << 30))
        print(f"driver {info['driver']} (CUDA API {info['cuda']}); engine pid {eng.pid}: arena "
              f"{eng.ready['committed'] / GB:.2f} GB mapped + extra {a.extra_gib:g} GiB")
        for k in range(1, a.rounds + 1):
            out["rounds"].append(supervised_round(eng, k))
            progress("supervisor", out["rounds"][-1])
        for k in range(a.rounds + 1, a.rounds + 1 + a.self_rounds):
            last = k == a.rounds + a.self_rounds
            out["self"].append(self_round(eng, k, timeout=60, probe_nvml=last and a.probe_nvml))
            progress("self", out["self"][-1])
        out["recapture_s"] = [eng.ask(cmd="capture")["capture_s"] for _ in range(3)]
        if a.busy:
            out["lock_probe"] = lock_probe(eng, a.busy)
    finally:
        eng.close()
    rs, ss = out["rounds"], out["self"]
    ok = all(r["ok"] for r in rs + ss)
    print(f"every round: pointers unchanged, sentinels kept, the graph replayed byte for byte: "
          f"{'yes' if ok else 'NO'}")
    if rs:
        print(f"supervisor, {len(rs)} rounds (median, min .. max):")
        for step in ("lock", "checkpoint", "restore", "unlock"):
            print(f"  {step:<11} {ms([r[step] for r in rs])}")
        given = [(r["used_before"] - r["used_checkpointed"]) / GB for r in rs]
        print(f"  device memory given back while checkpointed: {min(given):.2f} .. "
              f"{max(given):.2f} GB (the engine mapped {committed / GB:.2f} GB + its context)")
        print(f"  graph replay after restore {ms([r['replay_s'] for r in rs])}")
    if ss:
        print(f"self, {len(ss)} rounds:")
        for step in ("lock", "checkpoint", "restore", "unlock"):
            print(f"  {step:<11} {ms([r['suspend'].get(step, r['resume'].get(step)) for r in ss])}")
        for step in ("prepare_s", "finish_s"):
            vals = [r[step] for r in ss]
            shown = ms(vals) if all(isinstance(v, float) for v in vals) else f"not run: {vals[0]}"
            print(f"  {step[:-2]:<11} {shown}")
        if "nvml_while_checkpointed" in ss[-1]:
            print(f"  NVML inside the checkpointed process: {ss[-1]['nvml_while_checkpointed']}")
    print(f"anchors: arena build {eng.ready['build_s'] * 1e3:.2f} ms, first graph capture "
          f"{eng.ready['capture_s'] * 1e3:.2f} ms, recapture {ms(out['recapture_s'])}")
    if "lock_probe" in out:
        p = out["lock_probe"]
        print(f"lock with {p['queued']} memsets queued: {p['lock_s'] * 1e3:.1f} ms, "
              f"{p['outcome']}; the queue drained {p['sync_after_s'] * 1e3:.1f} ms later")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
