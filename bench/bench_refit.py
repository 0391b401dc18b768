"""A trainer process refits an engine's Qwen3 in place through one export (issue 52).

On the lent GPU, the engine (this process) holds a transformers
Qwen3ForCausalLM (tests/data/hf/qwen3-8b.json unless --config; bf16) whose
parameters are a weight arena's tensors (metrale.weights, metrale.torch.bind),
its forward a CUDA graph in an activation arena's pool (bench_weights.py's
setup).  A trainer process (torch and metrale.refit's client, no arena) holds
the new weights as its own tensors, made on the device from a seed, so that
the engine can make the same bytes for its oracle.  Each figure with its
anchors measured in the same run:

- the refit (`WeightImport.sync`: the offer, the tensors checked, the
  descriptors mapped chunk by chunk, the copies launched as their chunks come
  (kernels/copy_runs.cu), the device waited for, unmapped, committed) and the
  median of each of its phases, median of --runs, against one device-to-device copy of the same bytes in the trainer (CUDA
  events), the same per-tensor copies into the trainer's own memory, torch IPC
  per parameter (`reduce_tensor` of each, rebuilt and copied in by the engine;
  the first sync of new storages and the later ones), and one flat bucket
  through torch IPC (packed, sent, copied out per parameter);
- after the refit the engine's graph, unchanged, against a fresh model (torch's
  own memory, the new weights made from the seed, its graph in torch's pool):
  logits byte for byte;
- an RL loop of --cycles (generate, sleep deep, the trainer writes its next
  weights, wake, refit, generate): each cycle's logits against the fresh model
  of that cycle's weights, device memory asleep (NVML by pid) against the
  context, and host RSS, across the cycles; and each cycle's refit, timed as
  above (the weight arena is mapped in its sleep's pieces from the start: the
  trainer's reservation and chunks stay the same across the cycles).

    python bench/bench_refit.py [--config tests/data/hf/qwen3-8b.json] [--runs 5] [--cycles 20]

Prints one JSON line per figure; exits 1 when a check fails.
"""

import argparse
import gc
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_weights import (FAILED, activation_arena, build_model, check, committed,  # noqa: E402
                           events_ms, floor, input_ids, mib, nvml_used, row, rss)

import metrale  # noqa: E402
import metrale.torch as mt  # noqa: E402
import metrale.refit as refit_module  # noqa: E402
from metrale.refit import WeightExport, WeightImport  # noqa: E402
from metrale.weights import weight_arena, weight_set  # noqa: E402

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def make_state(params, seed, out=None):
    """The weights of `seed` on the device: a matrix N(0, 0.02), a vector 1 +
    N(0, 0.02); the same bytes in every process (torch's Philox on this GPU)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    state = {} if out is None else out
    for name, dtype, shape in params:
        x = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).mul_(0.02)
        if len(shape) == 1:
            x.add_(1.0)
        if out is None:
            state[name] = x.to(_DTYPES[dtype])
        else:
            state[name].copy_(x)
        del x
    return state


# -- the trainer process -------------------------------------------------------------------


def trainer(path, params, offsets, nbytes, runs, cycles, conn):
    """Refits on the engine's call; anchors measured here; see the module's docstring."""
    from torch.multiprocessing.reductions import reduce_tensor
    try:
        gpu = metrale.CudaBackend(0)
        state = make_state(params, 1000)
        imp = WeightImport(path, gpu, timeout=600)
        side = torch.cuda.Stream()      # the refit's copies beside the trainer's work
        stream = side.cuda_stream
        out = {}
        # the refit, timed from here (the engine's offer already waiting), and its phases
        phases = {k: [] for k in ("offer", "take", "check", "map", "map_launch", "wait_unmap",
                                  "commit")}

        def timed(name, fn):
            def run(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    phases[name].append((time.perf_counter() - t) * 1e3)
            return run

        class TimedSlabs:           # the map and the copies' launches; the wait and the unmap
            def __init__(self, slabs):
                self.remap_peer = timed("map_launch", slabs.remap_peer)
                self.detach = timed("wait_unmap", slabs.detach)
                self._slabs = slabs

            def __getattr__(self, name):
                return getattr(self._slabs, name)
        imp._offer, imp._map = timed("offer", imp._offer), timed("map", imp._map)
        refit_module.check_state = timed("check", refit_module.check_state)
        imp._take, imp._commit = timed("take", imp._take), timed("commit", imp._commit)
        imp._slabs = TimedSlabs(imp._slabs)
        refit_ms = []
        for i in range(runs):
            assert conn.recv() == "offered"
            time.sleep(0.05)
            torch.cuda.synchronize()
            t = time.perf_counter()
            stats = imp.sync(state, stream=stream)
            refit_ms.append((time.perf_counter() - t) * 1e3)
        out.update(refit_ms=refit_ms, copies=stats.copies,
                   phases_ms={k: round(statistics.median(v[:runs]), 3) for k, v in phases.items()
                              if v})
        # anchors: one device-to-device copy of the same bytes; the same per-tensor copies
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        out["d2d_ms"] = events_ms(lambda: dst.copy_(src), runs)
        src = None
        torch.cuda.empty_cache()
        views = [(dst[off:off + state[n].nbytes], state[n].view(-1).view(torch.uint8))
                 for n, off in offsets]

        def per_tensor():
            for d, s in views:
                d.copy_(s)
        out["local_copies_ms"] = events_ms(per_tensor, runs)
        # torch IPC, per parameter: the first sync of these storages, then the later ones
        ipc_ms = []
        for i in range(runs):
            torch.cuda.synchronize()
            t = time.perf_counter()
            conn.send(("ipc", t, [(n, reduce_tensor(state[n])) for n, _o in offsets]))
            assert conn.recv() == "copied"
            ipc_ms.append((time.perf_counter() - t) * 1e3)
        out["ipc_per_param_ms"] = ipc_ms
        # one flat bucket through torch IPC: packed here, copied out by the engine
        bucket_ms = []
        for i in range(runs):
            torch.cuda.synchronize()
            t = time.perf_counter()
            per_tensor()
            torch.cuda.synchronize()
            conn.send(("bucket", t, reduce_tensor(dst)))
            assert conn.recv() == "copied"
            bucket_ms.append((time.perf_counter() - t) * 1e3)
        out["ipc_bucket_ms"] = bucket_ms
        views = dst = None
        torch.cuda.empty_cache()
        conn.send(("anchors", out))
        # the RL loop: write the next weights while the engine sleeps, refit after its
        # wake (its weights in the pieces the offloading sleep cut), timed as above
        rl_ms = []
        for c in range(cycles):
            assert conn.recv() == ("asleep", c)
            make_state(params, 2000 + c, out=state)        # the trainer's step
            torch.cuda.synchronize()
            conn.send(("written", c))
            assert conn.recv() == ("offered", c)
            time.sleep(0.05)
            torch.cuda.synchronize()
            t = time.perf_counter()
            imp.sync(state, stream=stream)
            rl_ms.append((time.perf_counter() - t) * 1e3)
        chunks = len(imp._chunks)
        imp.close()
        conn.send(("done", {"rl_refit_ms": rl_ms, "rl_chunks": chunks}))
    except BaseException as e:
        import traceback
        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


# -- the engine ------------------------------------------------------------------------------


def place(model, state):
    """Make `state`'s tensors the parameters of `model` (a tied one once), in
    every submodule: a model loaded with them, in torch's own memory."""
    owner = {id(p): n for n, p in model.named_parameters()}
    for mod in model.modules():
        for k, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[k] = torch.nn.Parameter(state[owner[id(p)]],
                                                        requires_grad=False)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="tests/data/hf/qwen3-8b.json")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    args = ap.parse_args(argv)

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    context = nvml_used()
    gpu = metrale.CudaBackend(0)    # made first, as an engine does: its trim goes back here
    row(device=torch.cuda.get_device_name(0), torch=torch.__version__, context_mib=mib(context))
    raw, model = build_model(args.config)
    ws = weight_set(model)
    params = [(p.name, p.dtype, list(p.shape)) for p in ws]
    row(model=os.path.basename(args.config), params=len(ws), weight_bytes=ws.nbytes)
    wa = weight_arena(ws, gpu)
    mt.bind(model, wa, ws, copy=True)
    gc.collect()
    torch.cuda.empty_cache()

    aa, mp, s, wsp = activation_arena(raw, gpu)
    ids_host, ids = input_ids(raw, aa, args.batch, args.seq)
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(2):
            model(input_ids=ids, use_cache=False)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=mp.id, stream=s):
            logits = model(input_ids=ids, use_cache=False).logits
    torch.cuda.synchronize()

    # the oracle: the same architecture in torch's own memory, its parameters on meta until
    # a check places a cycle's weights in it
    with torch.device("meta"):
        import transformers
        fresh = transformers.Qwen3ForCausalLM._from_config(model.config, dtype=torch.bfloat16)
    fresh = fresh.eval()
    for name, buf in model.named_buffers():          # rotary tables: not weights
        mod_name, _, key = name.rpartition(".")
        fresh.get_submodule(mod_name)._buffers[key] = buf.clone()

    def generate():
        with torch.cuda.stream(s):
            ids.copy_(ids_host)
            g.replay()
        torch.cuda.synchronize()
        return logits.cpu()

    def oracle(seed):
        """The fresh model with the weights of `seed`: its graph's logits."""
        state = make_state(params, seed)
        place(fresh, state)
        with torch.no_grad(), torch.cuda.stream(s):
            x = ids_host.to("cuda")
            fresh(input_ids=x, use_cache=False)
            torch.cuda.synchronize()
            go = torch.cuda.CUDAGraph()
            with torch.cuda.graph(go, stream=s):
                lo = fresh(input_ids=x, use_cache=False).logits
            go.replay()
        torch.cuda.synchronize()
        out = lo.cpu()
        del go, lo, x, state
        place(fresh, {n: torch.empty(sh, dtype=_DTYPES[d], device="meta")
                      for n, d, sh in params})
        gc.collect()
        torch.cuda.empty_cache()
        return out

    offsets = [(p.name, p.offset) for p in ws]
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    path = os.path.join(tempfile.mkdtemp(), "weights.sock")
    ex = WeightExport(wa, ws, path)
    p = ctx.Process(target=trainer, args=(path, params, offsets, ws.nbytes, args.runs,
                                          args.cycles, there))
    p.start()
    by_name = None
    try:
        for i in range(args.runs):
            here.send("offered")
            epoch = ex.sync(timeout=600)
        # torch IPC anchors: the engine's side (rebuild, copy into the bound parameters)
        by_name = dict(model.named_parameters())
        for kind in ("ipc", "bucket"):
            for i in range(args.runs):
                msg = here.recv()
                if msg[0] == "error":
                    raise RuntimeError(msg[1])
                _k, _t, payload = msg
                with torch.no_grad():
                    if kind == "ipc":
                        for n, (fn, fa) in payload:
                            by_name[n].copy_(fn(*fa))
                    else:
                        bucket = payload[0](*payload[1])
                        for n, off in offsets:
                            w = by_name[n]
                            w.view(-1).view(torch.uint8).copy_(bucket[off:off + w.nbytes])
                        w = None            # a view of the weights: it would pin the arena
                torch.cuda.synchronize()
                payload = bucket = None
                gc.collect()
                torch.cuda.ipc_collect()
                here.send("copied")
        msg = here.recv()
        if msg[0] == "error":
            raise RuntimeError(msg[1])
        a = msg[1]
        med = {k: statistics.median(v) for k, v in a.items() if isinstance(v, list)}
        row(refit_ms=[round(x, 2) for x in a["refit_ms"]], phases_ms=a["phases_ms"],
            d2d_ms=[round(x, 2) for x in a["d2d_ms"]],
            local_copies_ms=[round(x, 2) for x in a["local_copies_ms"]],
            ipc_per_param_ms=[round(x, 2) for x in a["ipc_per_param_ms"]],
            ipc_bucket_ms=[round(x, 2) for x in a["ipc_bucket_ms"]], copies=a["copies"])
        row(refit_over_d2d=round(med["refit_ms"] / med["d2d_ms"], 3),
            refit_over_local_copies=round(med["refit_ms"] / med["local_copies_ms"], 3),
            ipc_per_param_over_refit=round(med["ipc_per_param_ms"] / med["refit_ms"], 2),
            ipc_first_over_refit=round(a["ipc_per_param_ms"][0] / med["refit_ms"], 2),
            ipc_bucket_over_refit=round(med["ipc_bucket_ms"] / med["refit_ms"], 2),
            epoch=epoch)
        check(med["refit_ms"] <= 1.2 * med["d2d_ms"],
              "a refit of every weight within 1.2x a device-to-device copy of their bytes")
        # the IPC anchors wrote the trainer's seed-1000 weights too: the graph, unchanged
        check(torch.equal(generate(), oracle(1000)), "after the refit the engine's graph gives "
              "a fresh model's logits with the new weights, byte for byte")

        # the RL loop
        mems, rsss, ok, held = [], [], [], []
        for c in range(args.cycles):
            wa.sleep()
            aa.sleep()
            torch.cuda.empty_cache()
            gpu.trim_stack()        # the stack a kernel grew, back to the context's own
            mems.append(nvml_used())
            rsss.append(rss())
            held.append(committed(wa, aa))
            here.send(("asleep", c))
            msg = here.recv()
            if msg[0] == "error":
                raise RuntimeError(msg[1])
            wa.wake()
            aa.wake()
            here.send(("offered", c))
            ex.sync(timeout=600)
            ok.append(torch.equal(generate(), oracle(2000 + c)))
        msg = here.recv()
        if msg[0] == "error":
            raise RuntimeError(msg[1])
        rl = msg[1]["rl_refit_ms"]
        row(rl_refit_ms=[round(x, 2) for x in rl], rl_chunks=msg[1]["rl_chunks"],
            rl_refit_over_d2d=round(statistics.median(rl) / med["d2d_ms"], 3))
        row(cycles=args.cycles, cycles_equal=sum(ok), asleep_mib=[mib(x) for x in mems],
            above_context_mib=[mib(x - context) for x in mems], rss_mib=[mib(x) for x in rsss],
            arenas_asleep_mib=[mib(x) for x in held])
        check(all(ok), "every cycle's logits are a fresh model's with that cycle's weights")
        check(max(mems) - context <= 64 << 20, "asleep: the context plus at most 64 MiB")
        check(max(mems) - min(mems) <= 2 << 20, "device memory asleep flat across cycles")
        check(max(rsss) - min(rsss) <= 64 << 20, "host RSS flat across cycles (64 MiB)")
    finally:
        p.join(60)
        if p.is_alive():
            p.kill()
        ex.close()
    g = logits = ids = mp = None
    wsp.remove()
    mt.close_pool(aa)
    aa.release()
    del model, by_name
    gc.collect()
    wa.release()
    end = floor(gpu)
    row(floor_mib=mib(end), floor_above_context_mib=mib(end - context),
        asleep_above_floor_mib=mib(max(mems) - end))
    check(max(mems) - end <= 64 << 20, "asleep: at most 64 MiB above the floor (the context "
          "with the code of the kernels this run loaded)")
    row(failed=FAILED)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
