"""Capture metrale's zeroing into CUDA graphs with torch, one graph per batch
bucket.  Needs an NVIDIA GPU, `pip install 'metrale[cuda]'` and a CUDA build
of torch.  See docs/streams.md."""

import torch

import metrale
from metrale import BufferArena, ModelConfig

gpu = metrale.CudaBackend(0)              # one backend per device, shared
cfg = ModelConfig.preset("qwen3-next-80b")
arena = BufferArena.new(cfg, 256, 4096, 16, 32, gpu)

# Views are made once, outside the captures; they keep the arena's memory.
hidden = torch.from_dlpack(arena.view("hidden_states", "bfloat16", (256, cfg.hidden_size)))

buckets = [1, 2, 4, 8, 16, 32, 64, 128, 256]
graphs = {}
capture_stream = torch.cuda.Stream()
torch.cuda.synchronize()
for n in buckets:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=capture_stream):
        s = torch.cuda.current_stream()            # the capturing stream: pass it, never 0
        arena.zero_all_rows(stream=s, tokens=n)    # n is baked into this graph
        hidden[:n].add_(1)                         # stands for your kernels on s
    graphs[n] = g


def bucket_for(tokens):
    return next(b for b in buckets if b >= tokens)


# One decode step with 3 live tokens: replay the graph of bucket 4.
hidden.fill_(7)
graphs[bucket_for(3)].replay()
torch.cuda.synchronize()
assert (hidden[:4] == 1).all() and (hidden[4:] == 7).all()

# Teardown: finish the GPU work, drop the graphs and the views, then release.
torch.cuda.synchronize()
graphs.clear()
del hidden
arena.release()
print("ok: replayed the bucket-4 graph; arena released")
