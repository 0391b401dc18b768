"""Two-GPU benchmark of arena.peer_all_reduce (issue 26): the live rows of
hidden_states summed through the peers' mapped slabs, checked bit for bit
against NCCL all_reduce and timed beside it, beside torch's symmetric-memory
one-shot and two-shot all-reduce (where the installed torch has them) and
beside a copy of the peer's live rows through the mapping (the link limit).

Run on a machine with two GPUs (NVLink) under torchrun:

    torchrun --nproc-per-node 2 bench/bench_tp.py [--tokens 8192] [--runs 30]

Each rank (one process per GPU, torch.distributed with NCCL):

1. builds the Qwen3-Next-80B arena at max_batch_tokens M with group=WORLD
   (one export and one import of the slab and of the signal area per rank);
2. checks, for bf16 (hidden_states) and fp32 (moe_router_in_f32) and
   n = 1, 32, 4096 and M rows, that peer_all_reduce gives the bits
   torch.distributed.all_reduce gives for the same rows, eagerly and through
   one CUDA graph captured with tokens_at and replayed with the count
   changed on the device;
3. times, with CUDA events (median of --runs, each 10 operations back to
   back after a barrier), for live sizes from 128 KiB to the whole buffer:
   peer_all_reduce (eager, tokens=n), NCCL all_reduce of the live rows,
   symmetric-memory one-shot / two-shot all-reduce of them, and a copy of the
   peer's live rows through the mapping;
4. times the one graph at n = 32 against an NCCL all_reduce of the whole
   buffer captured in a graph (what one graph for every batch size would
   otherwise run);
5. rank 0 prints the tables and the ratios the issue sets as goals:
   peer_all_reduce / best anchor <= 1.0 at every size, / the mapped copy
   <= 1.1, and the one graph at n = 32 >= 10x faster than the NCCL graph.

Needs torch (CUDA, NCCL) and metrale built with CUDA.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import metrale
from metrale import BufferArena, ModelConfig

LIMITS_REST = (4096, 16, 32)


def symm_ops(group, n_bytes):
    """torch's symmetric-memory one-shot and two-shot all-reduce over a buffer
    of n_bytes, or {} where this torch lacks them."""
    try:
        import torch.distributed._symmetric_memory as symm
        buf = symm.empty(n_bytes // 2, dtype=torch.bfloat16, device="cuda")
        symm.rendezvous(buf, group.group_name)
        ops = {}
        for name in ("one_shot_all_reduce", "two_shot_all_reduce_"):
            fn = getattr(torch.ops.symm_mem, name, None)
            if fn is not None:
                ops[name] = fn
        return buf, ops
    except Exception as e:          # not built with it, or no NVLink
        print(f"symmetric memory unavailable: {type(e).__name__}: {e}", file=sys.stderr)
        return None, {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192, help="max_batch_tokens M (default 8192)")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per row (default 30)")
    ap.add_argument("--preset", default="qwen3-next-80b")
    args = ap.parse_args()

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        sys.exit("bench_tp.py runs with exactly two ranks (torchrun --nproc-per-node 2)")
    peer = 1 - rank
    M = args.tokens
    gpu = metrale.CudaBackend(local)
    dist.barrier()
    t0 = time.perf_counter()
    arena = BufferArena.new(ModelConfig.preset(args.preset), M, *LIMITS_REST, gpu,
                            group=dist.group.WORLD)
    setup_ms = (time.perf_counter() - t0) * 1e3
    counts = (gpu.export_count, gpu.import_count, gpu.handle_count)
    stream = torch.cuda.current_stream()
    hs = torch.from_dlpack(arena.view("hidden_states"))             # [M, H] bf16
    f32 = torch.from_dlpack(arena.view("moe_router_in_f32")) if arena.nbytes("moe_router_in_f32") \
        else None
    row = hs[0].numel() * 2
    count = torch.from_dlpack(arena.view("token_ids", "int32"))[:1]  # the device-held count
    gen = torch.Generator(device="cuda").manual_seed(1234 + rank)

    def fill(t):
        t.copy_(torch.randn(t.shape, generator=gen, device="cuda", dtype=torch.float32) * 4)

    # -- bits against NCCL ------------------------------------------------------------
    checks = {}
    graph = torch.cuda.CUDAGraph()
    names = ["hidden_states"] + (["moe_router_in_f32"] if f32 is not None else [])
    arena.peer_all_reduce(names, tokens=1)                # warm, outside the capture
    torch.cuda.synchronize()
    dist.barrier()
    with torch.cuda.graph(graph):
        arena.peer_all_reduce(names, stream=torch.cuda.current_stream(), tokens_at=count.data_ptr())
    for mode in ("eager", "graph"):
        for n in (1, 32, 4096, M):
            n = min(n, M)
            tensors = [hs] + ([f32] if f32 is not None else [])
            for t in tensors:
                fill(t)
            refs = [t[:n].clone() for t in tensors]
            for r in refs:
                dist.all_reduce(r)
            count.fill_(n)
            torch.cuda.synchronize()
            dist.barrier()
            if mode == "eager":
                arena.peer_all_reduce(names, tokens=n)
            else:
                graph.replay()
            torch.cuda.synchronize()
            arena.check_peer_reduce()
            for t, r in zip(tensors, refs):
                key = f"{mode} {t.dtype} n={n}: the bits of NCCL all_reduce"
                checks[key] = torch.equal(t[:n].view(torch.uint8), r.view(torch.uint8))
            dist.barrier()

    # -- timings ------------------------------------------------------------------------
    live = torch.empty_like(hs)
    from cuda.bindings import driver as drv
    symm_buf, symm = symm_ops(dist.group.WORLD, hs.numel() * 2)

    def timed(fn, k=10):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        per = []
        for _ in range(args.runs):
            dist.barrier()
            torch.cuda.synchronize()
            start.record(stream)
            for _ in range(k):
                fn()
            end.record(stream)
            end.synchronize()
            per.append(start.elapsed_time(end) * 1e3 / k)
        dist.barrier()
        return statistics.median(per)

    sizes = []
    b = 128 << 10
    while b < M * row:
        sizes.append(max(b // row, 1))
        b *= 4
    sizes.append(M)
    peer_hs = arena.peer(peer).hidden_states()
    table = {}
    for n in sizes:
        nb = n * row
        rows = {"peer_all_reduce": timed(lambda: arena.peer_all_reduce("hidden_states", tokens=n)),
                "NCCL all_reduce": timed(lambda: dist.all_reduce(hs[:n])),
                "mapped copy of the peer's rows": timed(
                    lambda: drv.cuMemcpyDtoDAsync(live.data_ptr(), peer_hs, nb, stream.cuda_stream))}
        if symm_buf is not None:
            part = symm_buf[:nb // 2]
            for name, fn in symm.items():
                if name == "one_shot_all_reduce":
                    rows["symm-mem one-shot"] = timed(lambda: fn(part, "sum", dist.group.WORLD.group_name))
                else:
                    rows["symm-mem two-shot"] = timed(lambda: fn(part, "sum", dist.group.WORLD.group_name))
        table[n] = rows
        arena.check_peer_reduce()

    # -- one graph at n = 32 against NCCL captured for the whole buffer -------------------
    count.fill_(32)
    whole = torch.cuda.CUDAGraph()
    with torch.cuda.graph(whole):
        dist.all_reduce(hs)
    graphs = {"one graph, tokens_at = 32": timed(graph.replay),
              "NCCL all_reduce captured for all M rows": timed(whole.replay)}
    arena.check_peer_reduce()

    mine = {"rank": rank, "device": torch.cuda.get_device_name(local), "setup_ms": setup_ms,
            "counts": counts, "checks": checks, "table": table, "graphs": graphs, "row": row}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    hs = f32 = count = live = graph = whole = None      # views and graphs before the arena
    torch.cuda.synchronize()
    arena.release()
    if rank == 0:
        report(everyone, args)
    dist.destroy_process_group()
    if not all(all(r["checks"].values()) for r in everyone):
        sys.exit(1)


def report(everyone, args):
    r0 = everyone[0]
    print(f"metrale {metrale.__version__}, torch {torch.__version__}, {r0['device']} x 2, "
          f"{args.preset} at M = {args.tokens}, median of {args.runs} runs (10 back to back)")
    setups = ", ".join(f"{r['setup_ms']:.1f} ms" for r in everyone)
    counts = ", ".join(str(r["counts"]) for r in everyone)
    print(f"setup {setups}; exports / imports / handles {counts}")
    bad = [k for r in everyone for k, v in r["checks"].items() if not v]
    print(f"bit checks against NCCL: {len(r0['checks']) * 2 - len(bad)} of "
          f"{len(r0['checks']) * 2} hold" + (f"; failed: {bad}" if bad else ""))
    print()
    cols = list(r0["table"][next(iter(r0["table"]))])
    copy = "mapped copy of the peer's rows"
    print("| live rows | bytes | " + " | ".join(f"{c} µs" for c in cols) +
          " | / best anchor | / mapped copy |")
    print("|---" * (len(cols) + 4) + "|")
    for n in r0["table"]:
        worst = {c: max(r["table"][n][c] for r in everyone) for c in cols}
        anchors = [worst[c] for c in cols if c not in ("peer_all_reduce", copy)]
        mine = worst["peer_all_reduce"]
        print(f"| {n} | {n * r0['row']:,} | " + " | ".join(f"{worst[c]:.1f}" for c in cols) +
              f" | {mine / min(anchors):.2f}x | {mine / worst[copy]:.2f}x |")
    print()
    g = {k: max(r["graphs"][k] for r in everyone) for k in r0["graphs"]}
    for k, v in g.items():
        print(f"{k}: {v:.1f} µs")
    a, b = g.values()
    print(f"one graph at n = 32 is {b / a:.1f}x faster than NCCL captured for the whole buffer "
          "(goal >= 10x)")


if __name__ == "__main__":
    main()
