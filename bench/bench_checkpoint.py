"""GPU benchmark of metrale.checkpoint: an engine process checkpointed and
restored by the driver, awake and lean (its arena asleep), its captured
graph replayed afterwards with no recapture.

The engine (tests/test_checkpoint_cuda.py's `engine_main`, a process of its
own) builds the Qwen3-Next-80B arena reserved at its limits (max_batch_tokens
8192 by default: about 2.3 GB), optionally plus a plain allocation standing
for weights (--extra-gib), and captures one CUDA graph over the arena
(zero_all, a copy, a memset).  Then, in the same run and the same engine,
rounds of two forms, each awake and asleep in turn:

* supervisor: the engine calls prepare(); this process suspends its pid
  (lock + checkpoint) and resumes it (restore + unlock); the engine calls
  finish();
* self: the engine calls prepare(), then suspends and resumes its own pid,
  then finish();
* awake: prepare() (nothing to detach: the arena stays mapped, all of it
  in the driver's image); asleep (a lean checkpoint, issue 38):
  prepare(sleep={"keep": [moe_router_in_f32, token_ids]}): the arena
  sleeps, keeping the buffer the graph copies from (64 MiB) and a small
  sentinel, discarding the rest; finish() wakes it.

Per round: each step's wall time; the engine's resident host memory (VmRSS,
as suspend reads it) just before and after its checkpoint, whose difference
is the image the driver took; the GPU's used memory (NVML, read here) before
prepare, after it, while checkpointed and after; then the engine checks its
pointers, its sentinels (after a lean round: the kept buffers keep theirs,
the discarded ones of the zero_all set read zero) and one replay of the
graph it captured at the start, byte for byte.

Printed per form: the medians awake and asleep, their ratio, the image in
each mode and its reduction as a fraction of the arena's committed bytes,
against the issue's goals (image smaller by >= 95 % of the arena's committed
bytes; checkpoint + restore <= 0.4x awake).  Anchors: building the arena,
capturing the graph (first, and again), one replay.  --busy N: a probe of
what a lock does with N memsets queued (lock(timeout=0.2)).

Run:  python bench/bench_checkpoint.py [--rounds 3] [--self-rounds 2] [--limits 8192]
      [--extra-gib 8] [--json out.json]
      python bench/bench_checkpoint.py --quick        # one round of each: under 3 minutes
"""

import argparse
import faulthandler
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import metrale.checkpoint as ckpt                                     # noqa: E402
from metrale import MetraleError                                     # noqa: E402
from test_checkpoint_cuda import (LEAN, EngineProcess, self_round,   # noqa: E402
                                  supervised_round)

GB = 1e9
MODES = (("awake", False), ("asleep", LEAN))
# The issue's goals for a lean checkpoint.
GOAL_REDUCTION, GOAL_TIME = 0.95, 0.4


def med(values):
    return statistics.median(values)


def ms(values):
    values = [v * 1e3 for v in values]
    return f"{med(values):9.2f} ms ({min(values):.2f} .. {max(values):.2f})"


def steps(r):
    """The seconds of each step of a round, flat."""
    out = {s: r[s] for s in ("prepare_s", "finish_s") if s in r}
    out.update({k: v for k, v in r["suspend"].items() if k in ("lock", "checkpoint")})
    out.update({k: v for k, v in r["resume"].items() if k in ("restore", "unlock")})
    out["ckpt_restore"] = out["checkpoint"] + out["restore"]
    out["end_to_end"] = sum(out[s] for s in ("prepare_s", "lock", "checkpoint", "restore",
                                             "unlock", "finish_s"))
    return out


def image(r):
    """The host memory the checkpoint took (VmRSS after minus before), or None."""
    s = r["suspend"]
    if s["rss_before"] is None or s["rss_checkpointed"] is None:
        return None
    return s["rss_checkpointed"] - s["rss_before"]


def progress(form, mode, r):
    t = steps(r)
    img = image(r)
    print(f"  {form} {mode}: " + ", ".join(f"{s.removesuffix('_s')} {t[s] * 1e3:.1f} ms" for s in
                                          ("prepare_s", "checkpoint", "restore", "finish_s"))
          + f", image {'?' if img is None else f'{img / GB:.3f} GB'}, the checkpoint freed "
          f"{(r['used_prepared'] - r['used_checkpointed']) / GB:.3f} GB, ok {r['ok']}"
          + ("" if r["ok"] else f" {r['bad']}"), flush=True)


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


def report(form, rounds, committed):
    """The medians of one form, awake and asleep, and the goals."""
    aw, sl = rounds["awake"], rounds["asleep"]
    print(f"{form}: {len(aw)} awake and {len(sl)} asleep rounds (median, min .. max)")
    print(f"  {'':<22} {'awake':<36} {'asleep':<36} asleep/awake")
    ta, ts = [steps(r) for r in aw], [steps(r) for r in sl]
    for step, label in (("prepare_s", "prepare"), ("lock", "lock"), ("checkpoint", "checkpoint"),
                        ("restore", "restore"), ("unlock", "unlock"), ("finish_s", "finish"),
                        ("ckpt_restore", "checkpoint + restore"),
                        ("end_to_end", "prepare .. finish")):
        a, s = [t[step] for t in ta], [t[step] for t in ts]
        print(f"  {label:<22} {ms(a):<36} {ms(s):<36} {med(s) / med(a):.3f}x")
    out = {"ckpt_restore_ratio": med([t["ckpt_restore"] for t in ts])
           / med([t["ckpt_restore"] for t in ta]),
           "end_to_end_ratio": med([t["end_to_end"] for t in ts])
           / med([t["end_to_end"] for t in ta])}
    ia, is_ = [image(r) for r in aw], [image(r) for r in sl]
    if None in ia + is_:
        print("  image: the engine's /proc/<pid>/status could not be read")
    else:
        out["image_awake"], out["image_asleep"] = med(ia), med(is_)
        out["reduction"] = (med(ia) - med(is_)) / committed
        print(f"  image (engine VmRSS while checkpointed minus before): awake "
              f"{med(ia) / GB:.3f} GB, asleep {med(is_) / GB:.3f} GB: smaller by "
              f"{(med(ia) - med(is_)) / GB:.3f} GB = {out['reduction']:.1%} of the arena's "
              f"{committed / GB:.3f} GB committed")
    fa = [(r["used_prepared"] - r["used_checkpointed"]) for r in aw]
    fs = [(r["used_prepared"] - r["used_checkpointed"]) for r in sl]
    print(f"  device memory the checkpoint itself freed (NVML, after prepare minus while "
          f"checkpointed): awake {med(fa) / GB:.3f} GB, asleep {med(fs) / GB:.3f} GB")
    given = [(r["used_before"] - r["used_checkpointed"]) / GB for r in aw + sl]
    print(f"  device memory given back while checkpointed (NVML, before prepare): "
          f"{min(given):.3f} .. {max(given):.3f} GB")
    print(f"  graph replay after the restore: awake {ms([r['replay_s'] for r in aw])}, asleep "
          f"{ms([r['replay_s'] for r in sl])}")
    print(f"  record (asleep, the engine's log line): {sl[-1]['line']}")
    if "reduction" in out:
        print(f"  goal: image smaller by >= {GOAL_REDUCTION:.0%} of the arena's committed bytes: "
              f"{out['reduction']:.1%}, {'met' if out['reduction'] >= GOAL_REDUCTION else 'NOT met'}")
    print(f"  goal: checkpoint + restore <= {GOAL_TIME}x awake: {out['ckpt_restore_ratio']:.3f}x, "
          f"{'met' if out['ckpt_restore_ratio'] <= GOAL_TIME else 'NOT met'} (prepare .. finish: "
          f"{out['end_to_end_ratio']:.3f}x)")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="supervisor rounds, each mode")
    ap.add_argument("--self-rounds", type=int, default=2, help="self rounds, each mode")
    ap.add_argument("--quick", action="store_true", help="one round of each form and mode")
    ap.add_argument("--limits", type=int, default=8192, help="max_batch_tokens (and reserve)")
    ap.add_argument("--extra-gib", type=float, default=0.0, help="a plain allocation too")
    ap.add_argument("--busy", type=int, default=0, help="memsets queued for the lock probe")
    ap.add_argument("--probe-nvml", action="store_true",
                    help="in the last awake self round, ask NVML from inside the checkpointed "
                         "engine")
    ap.add_argument("--watchdog", type=float, default=None,
                    help="seconds before the run is stopped with every thread's stack "
                         "(default 170 with --quick, else 1800)")
    ap.add_argument("--json", help="write every measurement here")
    a = ap.parse_args()
    if a.quick:
        a.rounds = a.self_rounds = 1
    if min(a.rounds, a.self_rounds) < 1:
        ap.error("--rounds and --self-rounds must be at least 1")
    # The last guard: every call below has its own timeout, this bounds them all.
    faulthandler.dump_traceback_later(a.watchdog or (170 if a.quick else 1800), exit=True)
    info = ckpt.driver_info()
    eng = EngineProcess(limits=(a.limits, 4096, 16, 32), extra_bytes=int(a.extra_gib * (1 << 30)))
    out = {"driver": info, "ready": eng.ready, "supervisor": {"awake": [], "asleep": []},
           "self": {"awake": [], "asleep": []}}
    try:
        committed = eng.ready["committed"]
        print(f"driver {info['driver']} (CUDA API {info['cuda']}); engine pid {eng.pid}: arena "
              f"{committed / GB:.3f} GB committed + extra {a.extra_gib:g} GiB", flush=True)
        k = 0
        for _ in range(a.rounds):
            for mode, sleep in MODES:
                k += 1
                out["supervisor"][mode].append(supervised_round(eng, k, 300.0, sleep))
                progress("supervisor", mode, out["supervisor"][mode][-1])
        for i in range(a.self_rounds):
            for mode, sleep in MODES:
                k += 1
                probe = a.probe_nvml and mode == "awake" and i == a.self_rounds - 1
                out["self"][mode].append(self_round(eng, k, 60.0, probe, sleep))
                progress("self", mode, out["self"][mode][-1])
        out["recapture_s"] = [eng.ask(cmd="capture")["capture_s"] for _ in range(3)]
        if a.busy:
            out["lock_probe"] = lock_probe(eng, a.busy)
    finally:
        eng.close()
    faulthandler.cancel_dump_traceback_later()
    every = [r for form in ("supervisor", "self") for mode in out[form].values() for r in mode]
    ok = all(r["ok"] for r in every)
    print(f"every round: pointers unchanged, sentinels kept (lean: the discarded zero_all "
          f"buffers zero), the graph replayed byte for byte: {'yes' if ok else 'NO'}")
    for form in ("supervisor", "self"):
        out[form + "_summary"] = report(form, out[form], committed)
    if any("nvml_while_checkpointed" in r for r in out["self"]["awake"]):
        print(f"NVML inside the checkpointed process: "
              f"{out['self']['awake'][-1]['nvml_while_checkpointed']}")
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
