"""Where a process's device memory grows beyond the CUDA context (issue 52).

After the deep sleep, bench_weights.py finds the process about 160 MiB above
the context at start, with every buffer given back.  This bench takes the
steps of that run one by one in a fresh process and, after each, gives back
everything an allocator holds (torch's cache, cuBLAS's workspaces) and reads
the process's device memory (NVML, by pid) and the driver's per-thread stack:
what remains after a step is what it added to the context itself (kernel
code loaded lazily, a grown stack, library handles).  Last, the stack is
trimmed (`CudaDevice.trim_stack`) and the memory read once more.

    python bench/bench_context.py [--config tests/data/hf/qwen3-8b.json]

Prints one JSON line per step (MiB above the context at start, and the step's
own growth), then the stack trim's.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_weights import build_model, floor, mib, row, stack_limit  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="tests/data/hf/qwen3-8b.json")
    args = ap.parse_args(argv)

    torch.zeros(1, device="cuda")
    context = last = floor()            # every allocator's cache given back, no trim

    def step(name, **extra):
        nonlocal last
        now = floor()
        row(step=name, above_context_mib=mib(now - context), added_mib=mib(now - last),
            stack=stack_limit(), **extra)
        last = now

    row(device=torch.cuda.get_device_name(0), torch=torch.__version__,
        context_mib=mib(context), stack=stack_limit(),
        lazy_loading=os.environ.get("CUDA_MODULE_LOADING", "(unset: the driver's default)"))

    import metrale
    gpu = metrale.CudaBackend(0)
    step("metrale.CudaBackend (its zeroing kernels loaded)")

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    a = None
    step("one bf16 GEMM (cuBLAS)")

    q = torch.randn(4, 32, 16, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4, 8, 16, 128, device="cuda", dtype=torch.bfloat16)
    F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True).sum().item()
    q = k = None
    step("scaled_dot_product_attention (GQA, causal)")

    raw, model = build_model(args.config)
    step("the model built (random init, bf16)")

    ids = torch.randint(0, raw["vocab_size"], (4, 16), device="cuda")
    with torch.no_grad():
        model(input_ids=ids, use_cache=False).logits.sum().item()
    step("one eager forward")

    s = torch.cuda.Stream()
    with torch.no_grad():
        with torch.cuda.stream(s):
            model(input_ids=ids, use_cache=False)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            model(input_ids=ids, use_cache=False)
        g.replay()
    g = None            # its output, not kept, is the graph's private pool's
    step("a CUDA graph of it captured, replayed and destroyed")

    model = ids = None
    step("the model freed")

    before, after = gpu.trim_stack()
    step("trim_stack", trim=[before, after])
    return 0


if __name__ == "__main__":
    sys.exit(main())
