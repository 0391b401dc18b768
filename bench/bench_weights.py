"""A transformers Qwen3ForCausalLM on metrale's memory, and its deep sleep (issue 52).

On the lent GPU: the model is built by transformers from a published config
(tests/data/hf/qwen3-8b.json unless --config; random weights, bf16), its
parameters bound to a weight arena (metrale.weights, metrale.torch.bind), its
forward captured as a CUDA graph in an activation arena's pool (KV cache and
activations in the arena's classes, cuBLAS's workspace in a declared buffer).
Then, each figure with its anchor measured in this process:

- the graph's logits against an eager forward of the same model (torch.equal);
- the deep sleep: device memory of this process by NVML (by pid) against the
  CUDA context measured at start, the weights offloaded to pinned host memory
  (made by the first sleep and reused), the activation arena and torch's pool
  discarded, torch's caching allocator emptied;
- the weights' wake (median of --runs) against one pinned host-to-device copy
  of their bytes (CUDA events); the rest's wake (the activation arena, its
  pool mapped again and zeroed) in ms;
- after every wake the graph's logits byte for byte those before the sleep;
  host RSS and device memory across the cycles.

    python bench/bench_weights.py [--config tests/data/hf/qwen3-8b.json] [--runs 5]

Prints one JSON line per figure, then a summary; exits 1 when a check fails.
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch
import transformers

import metrale
import metrale.torch as mt
from metrale import REFERENCE, BufferArena, BufferSpec, ModelConfig
from metrale.weights import hf_params, weight_arena, weight_set

FAILED = []


def row(**kw):
    print(json.dumps(kw), flush=True)


def check(cond, what):
    row(check=what, ok=bool(cond))
    if not cond:
        FAILED.append(what)


def nvml_used(pid=None):
    """This process's device memory in bytes, as NVML reports it (by pid).

    Raises RuntimeError when NVML lists no such pid (a PID namespace of its
    own, as in some containers): every figure would be missing."""
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    pid = os.getpid() if pid is None else pid
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    for p in procs:
        if p.pid == pid:
            return p.usedGpuMemory
    raise RuntimeError(f"NVML lists no process {pid} on device 0 (it lists "
                       f"{[p.pid for p in procs]}): run outside a PID namespace of its own")


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def floor(gpu=None):
    """The process's device memory once every buffer is given back (torch's
    cache and cuBLAS's workspaces emptied, with `gpu` its stack trimmed): the
    CUDA context with the code of every kernel the run loaded (lazy loading),
    which no allocator holds and none can give back."""
    gc.collect()
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    if gpu is not None:
        gpu.trim_stack()
    return nvml_used()


def stack_limit():
    """The context's per-thread stack (CU_LIMIT_STACK_SIZE), read through
    cuda.bindings: the driver grows it for a kernel that needs more and keeps
    it, and the local memory behind it scales with every resident thread."""
    from cuda.bindings import driver
    err, v = driver.cuCtxGetLimit(driver.CUlimit.CU_LIMIT_STACK_SIZE)
    check(err == driver.CUresult.CUDA_SUCCESS, f"cuCtxGetLimit: {err}")
    return v


def committed(*arenas):
    """Device bytes the arenas hold (their pools' included)."""
    return sum(a.memory_stats()["committed_bytes"] + a.memory_stats().get("pool_committed_bytes", 0)
               for a in arenas)


def mib(n):
    return None if n is None else round(n / 2**20, 1)


def build_model(path):
    with open(path) as f:
        raw = json.load(f)
    raw.pop("quantization_config", None)
    cfg = transformers.AutoConfig.for_model(raw["model_type"], **{
        k: v for k, v in raw.items() if k not in ("model_type", "architectures")})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen3ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    return raw, model.eval()


def activation_arena(raw, gpu):
    """The engine's activation arena: REFERENCE's buffers for the model and
    cuBLAS's workspace (offloaded asleep: the installed workspace stays a
    valid pointer), its pool for torch, and a stream whose cuBLAS handle has
    that workspace.  Returns (arena, pool, stream, workspaces)."""
    cfg = ModelConfig.from_hf_config(raw)
    buffers = REFERENCE.with_([BufferSpec("cublas_workspace", size=32 << 20, wake="offload")])
    aa = BufferArena.new(cfg, 256, 2048, 16, 8, gpu, buffers=buffers,
                         reserve=(256, 2048, 16, 8))
    mp = mt.pool(aa, 8 << 30)
    s = torch.cuda.Stream()
    wsp = mt.install_workspaces(aa, cublas="cublas_workspace", stream=s)
    return aa, mp, s, wsp


def input_ids(raw, aa, batch, seq):
    """A batch of token ids from a fixed seed: on the host, and in the arena's pool."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids_host = torch.randint(0, raw["vocab_size"], (batch, seq), generator=gen)
    with mt.use_pool(aa):
        ids = ids_host.to("cuda")
    return ids_host, ids


def events_ms(fn, runs):
    out = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="tests/data/hf/qwen3-8b.json")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    args = ap.parse_args(argv)

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    context = nvml_used()
    stack0 = stack_limit()
    gpu = metrale.CudaBackend(0)    # made first, as an engine does: its trim goes back to stack0
    row(device=torch.cuda.get_device_name(0), torch=torch.__version__,
        transformers=transformers.__version__, context_mib=mib(context))

    raw, model = build_model(args.config)
    ws = weight_set(model)
    row(model=os.path.basename(args.config), params=len(ws), weight_bytes=ws.nbytes)
    check(weight_set(hf_params(raw)) == ws,
          "metrale's parameter list of the config is transformers' model's")

    wa = weight_arena(ws, gpu)
    mt.bind(model, wa, ws, copy=True)
    gc.collect()
    torch.cuda.empty_cache()
    base = wa.ptr(ws.buffer)
    check(all(base <= p.data_ptr() < base + ws.nbytes for p in model.parameters()),
          "every parameter is in the weight arena")

    aa, mp, s, wsp = activation_arena(raw, gpu)
    ids_host, ids = input_ids(raw, aa, args.batch, args.seq)
    with torch.no_grad():
        with torch.cuda.stream(s):
            for _ in range(2):
                eager = model(input_ids=ids, use_cache=False).logits
        torch.cuda.synchronize()
        eager = eager.cpu()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=mp.id, stream=s):
            logits = model(input_ids=ids, use_cache=False).logits
        g.replay()
        torch.cuda.synchronize()
        ref = logits.cpu()
        # the anchor: the same capture in torch's own pool
        g_torch = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g_torch, stream=s):
            logits_torch = model(input_ids=ids, use_cache=False).logits
        g_torch.replay()
        torch.cuda.synchronize()
        anchor = logits_torch.cpu()
        del g_torch, logits_torch
    row(graph_vs_eager_max_abs=float((ref.float() - eager.float()).abs().max()),
        graph_vs_eager_equal=bool(torch.equal(ref, eager)))
    check(torch.equal(ref, anchor), "the graph in the arena's pool gives torch's own pool's "
          "graph's logits, byte for byte")
    check(wsp.cublas_active(), "cuBLAS's workspace is the declared buffer")
    stats = aa.memory_stats()
    row(pool_mib=mib(stats["pool_committed_bytes"]), pool_segments=stats["pool_segments"])

    def sleep_all(trim=True):
        wa.sleep()
        aa.sleep()
        torch.cuda.empty_cache()
        if trim:
            gpu.trim_stack()    # the stack a kernel grew, back to the context's own

    def wake_check(i):
        ids.copy_(ids_host)             # the pool was discarded: the inputs written again
        g.replay()
        torch.cuda.synchronize()
        check(torch.equal(logits.cpu(), ref), f"cycle {i}: the logits after the wake are "
              "those before the sleep")

    del eager
    gc.collect()
    torch.cuda.synchronize()
    awake = nvml_used()
    t = time.perf_counter()
    sleep_all(trim=False)
    asleep_s = time.perf_counter() - t
    untrimmed = nvml_used()             # read outside the sleep's time, as the trim's
    stack_run = stack_limit()
    t = time.perf_counter()
    trim = gpu.trim_stack()
    asleep_s += time.perf_counter() - t
    asleep = nvml_used()
    stack_now = stack_limit()
    check(trim == (stack_run, stack0) == (stack_run, stack_now),
          f"trim_stack: {trim}, the driver's stack {stack_now}")
    row(stack_start=stack0, stack_after_run=stack_run, asleep_untrimmed_mib=mib(untrimmed),
        trim_freed_mib=mib(untrimmed - asleep))
    row(awake_mib=mib(awake), asleep_mib=mib(asleep), context_mib=mib(context),
        above_context_mib=mib(asleep - context), sleep_ms=round(asleep_s * 1e3, 2),
        arenas_asleep_mib=mib(committed(wa, aa)),
        torch_allocated_mib=mib(torch.cuda.memory_allocated()))
    check(asleep - context <= 64 << 20, "asleep: the context plus at most 64 MiB")
    t = time.perf_counter()
    wa.wake()
    weights_wake = time.perf_counter() - t
    t = time.perf_counter()
    aa.wake()
    rest_wake = time.perf_counter() - t
    wake_check(0)

    # the anchor: one pinned copy of the weights' bytes to the device
    host = torch.empty(ws.nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(ws.nbytes, dtype=torch.uint8, device="cuda")
    copy_ms = events_ms(lambda: dev.copy_(host, non_blocking=True), args.runs)
    dev = host = None
    torch.cuda.empty_cache()
    wakes, rests, sleeps, mems, rsss = [weights_wake * 1e3], [rest_wake * 1e3], [], [], []
    for i in range(1, args.runs + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        sleep_all()
        sleeps.append((time.perf_counter() - t) * 1e3)
        mems.append(nvml_used())
        t = time.perf_counter()
        wa.wake()
        torch.cuda.synchronize()
        wakes.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        aa.wake()
        torch.cuda.synchronize()
        rests.append((time.perf_counter() - t) * 1e3)
        wake_check(i)
        rsss.append(rss())
    med_wake, med_copy = statistics.median(wakes[1:]), statistics.median(copy_ms)
    row(weights_wake_ms=[round(x, 2) for x in wakes], pinned_copy_ms=[round(x, 2) for x in copy_ms],
        median_wake_ms=round(med_wake, 2), median_copy_ms=round(med_copy, 2),
        ratio=round(med_wake / med_copy, 3))
    row(rest_wake_ms=[round(x, 2) for x in rests], sleep_ms=[round(x, 2) for x in sleeps],
        asleep_mib=[mib(x) for x in mems], rss_mib=[mib(x) for x in rsss],
        offload_host_bytes=wa.memory_stats().get("offload_host_bytes"))
    check(med_wake <= 1.1 * med_copy, "the weights wake within 1.1x a pinned copy")
    check(max(rests) <= 50, "everything else awake within 50 ms")
    check(max(mems) - min(mems) <= 2 << 20, "device memory asleep flat across cycles")
    check(max(rsss) - min(rsss) <= 64 << 20, "host RSS flat across cycles (64 MiB)")

    g = logits = ids = mp = None
    wsp.remove()
    mt.close_pool(aa)
    aa.release()
    del model
    gc.collect()
    wa.release()
    end = floor(gpu)
    row(floor_mib=mib(end), floor_above_context_mib=mib(end - context),
        asleep_above_floor_mib=mib(asleep - end))
    check(asleep - end <= 64 << 20, "asleep: at most 64 MiB above the floor (the context "
          "with the code of the kernels this run loaded)")
    row(failed=FAILED)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
