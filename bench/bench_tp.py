"""Two-GPU benchmark of tensor-parallel arenas: a peer-read reduction of
hidden_states through arena.peer(r), checked against NCCL all_reduce and
timed against it and against a peer copy of the same bytes.

Run on a machine with two GPUs (NVLink) under torchrun:

    torchrun --nproc-per-node 2 bench/bench_tp.py [--tokens 8192] [--runs 50]

Each rank (one process per GPU, torch.distributed with NCCL):

1. builds the Qwen3-Next-80B arena at max_batch_tokens M (max_seq_len 4096,
   kv_block_size 16, max_batch_size 32) with group=WORLD: the layouts are
   checked collectively, each rank exports its slab once and maps its
   peer's once.  Printed: setup time, exports and imports counted by the
   backend (expected: one export and one import per rank, for one chunk);
2. writes a known pattern (small integers, exact in bf16) into its own
   hidden_states (bf16, M x hidden);
3. runs a small kernel (NVRTC through CuPy; in this file, not in metrale)
   that reads the peer's hidden_states through arena.peer(peer) and writes
   own + peer into a local output tensor.  Out of place: an in-place add
   would race with the peer reading the same buffer;
4. checks the output bit for bit against torch.distributed.all_reduce of a
   copy of hidden_states (for two ranks, one rounding of a + b both ways);
5. captures that kernel in a CUDA graph, lets each rank rewrite its
   hidden_states with a second pattern, replays the graph and checks again;
6. times, with CUDA events, median of --runs (each run: ranks aligned by a
   barrier, then k = 10 operations back to back between two events):
   the peer-read reduction, NCCL all_reduce of the same tensor, a driver
   copy of the peer's hidden_states through the mapping into a local
   tensor, and a torch peer copy of the same bytes (a tensor on the peer's
   device copied to this device, the link's limit);
7. rank 0 prints a table of both ranks' figures and the ratio
   reduction / all_reduce (goal: <= 0.6).

Needs torch (CUDA, NCCL), CuPy (for NVRTC) and metrale built with CUDA.
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

# bf16 pairs in 32-bit words: widen to float (a bf16 is the high half of a
# float), add, round to nearest even (what __float2bfloat16_rn does for finite
# values): no header needed, so NVRTC compiles it as is.
KERNEL = r"""
__device__ __forceinline__ unsigned int add_bf16x2(unsigned int a, unsigned int b) {
    float a0 = __uint_as_float(a << 16), a1 = __uint_as_float(a & 0xffff0000u);
    float b0 = __uint_as_float(b << 16), b1 = __uint_as_float(b & 0xffff0000u);
    unsigned int s0 = __float_as_uint(a0 + b0), s1 = __float_as_uint(a1 + b1);
    s0 += 0x7fffu + ((s0 >> 16) & 1u);
    s1 += 0x7fffu + ((s1 >> 16) & 1u);
    return (s0 >> 16) | (s1 & 0xffff0000u);
}

// out[i] = own[i] + peer[i], 8 bf16 (16 bytes) per step, grid-stride.
extern "C" __global__ void peer_add_bf16(uint4 *out, const uint4 *own, const uint4 *peer,
                                         unsigned long long n16) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n16; i += stride) {
        uint4 a = own[i];
        uint4 b = peer[i];
        uint4 s;
        s.x = add_bf16x2(a.x, b.x);
        s.y = add_bf16x2(a.y, b.y);
        s.z = add_bf16x2(a.z, b.z);
        s.w = add_bf16x2(a.w, b.w);
        out[i] = s;
    }
}
"""


def pattern(n, rank, salt):
    """Small integers (|x| <= 48): exact in bf16, and so is any sum of two."""
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    return (((i * 7 + rank * 13 + salt * 29) % 97) - 48).to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192, help="max_batch_tokens M (default 8192)")
    ap.add_argument("--runs", type=int, default=50, help="timed runs per row (default 50)")
    ap.add_argument("--preset", default="qwen3-next-80b")
    args = ap.parse_args()

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        sys.exit("bench_tp.py runs with exactly two ranks (torchrun --nproc-per-node 2)")
    peer = 1 - rank
    import cupy

    gpu = metrale.CudaBackend(local)
    cfg = ModelConfig.preset(args.preset)
    dist.barrier()
    t0 = time.perf_counter()
    arena = BufferArena.new(cfg, args.tokens, *LIMITS_REST, gpu, group=dist.group.WORLD)
    setup_ms = (time.perf_counter() - t0) * 1e3
    counts = (gpu.export_count, gpu.import_count, gpu.handle_count)

    nbytes = arena.sizes().hidden_states
    n = nbytes // 2
    assert nbytes % 16 == 0, nbytes
    hs = torch.from_dlpack(arena.view("hidden_states", torch.bfloat16, (n,)))
    peer_ptr = arena.peer(peer).hidden_states()
    out = torch.empty_like(hs)
    stream = torch.cuda.current_stream()

    kern = cupy.RawKernel(KERNEL, "peer_add_bf16")
    n16 = nbytes // 16
    block = 512
    grid = min((n16 + block - 1) // block, 132 * 16)

    def reduce_peer():
        with cupy.cuda.ExternalStream(stream.cuda_stream):
            kern((grid,), (block,), (out.data_ptr(), hs.data_ptr(), peer_ptr,
                                     cupy.uint64(n16)))

    def check(salt, what):
        expect = hs.clone()
        dist.all_reduce(expect)
        torch.cuda.synchronize()
        same = torch.equal(out.view(torch.int16), expect.view(torch.int16))
        oracle = torch.equal(expect, pattern(n, 0, salt) + pattern(n, 1, salt))
        return {f"{what}: equals all_reduce": same, f"{what}: all_reduce is p0 + p1": oracle}

    # -- correctness, eager ---------------------------------------------------------
    hs.copy_(pattern(n, rank, 1))
    torch.cuda.synchronize()
    dist.barrier()
    reduce_peer()
    torch.cuda.synchronize()
    dist.barrier()                  # the peer's kernel read our buffer: done before we move on
    checks = check(1, "eager")

    # -- the same kernel in a CUDA graph, replayed after the peers rewrote -----------
    graph = torch.cuda.CUDAGraph()
    reduce_peer()                   # warm (module load) outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kern((grid,), (block,), (out.data_ptr(), hs.data_ptr(), peer_ptr, cupy.uint64(n16)))
    out.zero_()
    hs.copy_(pattern(n, rank, 2))   # each rank rewrites its own hidden_states
    torch.cuda.synchronize()
    dist.barrier()
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    checks.update(check(2, "graph replay after the peer rewrote"))
    counts_after = (gpu.export_count, gpu.import_count, gpu.handle_count)

    # -- timings --------------------------------------------------------------------
    ar_buf = hs.clone()
    local_copy = torch.empty_like(hs)
    on_peer = torch.empty(n, dtype=torch.bfloat16, device=f"cuda:{peer}")

    def nccl():
        dist.all_reduce(ar_buf)

    def mapped_copy():
        cupy.cuda.runtime.memcpyAsync(local_copy.data_ptr(), peer_ptr, nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToDevice, stream.cuda_stream)

    def torch_peer_copy():
        local_copy.copy_(on_peer, non_blocking=True)

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

    rows = {
        "peer-read reduction (kernel, arena.peer)": timed(reduce_peer),
        "NCCL all_reduce": timed(nccl),
        "copy of the peer's bytes through the mapping": timed(mapped_copy),
        "torch peer copy (cuda:peer -> this device)": timed(torch_peer_copy),
    }
    mine = {"rank": rank, "device": torch.cuda.get_device_name(local), "setup_ms": setup_ms,
            "counts": counts, "counts_after": counts_after, "checks": checks, "rows": rows}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    hs = None                       # the view: released before the arena
    arena.release()
    if rank == 0:
        report(everyone, args, nbytes)
    dist.destroy_process_group()
    if not all(all(r["checks"].values()) for r in everyone):
        sys.exit(1)


def report(everyone, args, nbytes):
    print(f"metrale {metrale.__version__}, torch {torch.__version__}, {everyone[0]['device']} x 2, "
          f"{args.preset} at M = {args.tokens}: hidden_states {nbytes} bytes "
          f"({nbytes / 1e6:.1f} MB), median of {args.runs} runs (10 back to back each)")
    print()
    print("| rank | setup | exports / imports / handles | same after graph, steps |")
    print("|---|---|---|---|")
    for r in everyone:
        print(f"| {r['rank']} | {r['setup_ms']:.1f} ms | {' / '.join(map(str, r['counts']))} "
              f"| {' / '.join(map(str, r['counts_after']))} |")
    print()
    print("| check | rank 0 | rank 1 |")
    print("|---|---|---|")
    for k in everyone[0]["checks"]:
        print(f"| {k} | {everyone[0]['checks'][k]} | {everyone[1]['checks'][k]} |")
    print()
    print("| operation on 2 x hidden_states | rank 0 µs | rank 1 µs | GB/s (rank 0) |")
    print("|---|---|---|---|")
    for k in everyone[0]["rows"]:
        a, b = everyone[0]["rows"][k], everyone[1]["rows"][k]
        print(f"| {k} | {a:.1f} | {b:.1f} | {nbytes / a / 1e3:.0f} |")
    red = max(r["rows"]["peer-read reduction (kernel, arena.peer)"] for r in everyone)
    nccl = max(r["rows"]["NCCL all_reduce"] for r in everyone)
    print()
    print(f"peer-read reduction / NCCL all_reduce: {red / nccl:.2f}x (goal <= 0.6x)")


if __name__ == "__main__":
    main()
