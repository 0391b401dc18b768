"""Capture metrale's zeroing into a CUDA graph with CuPy.  Needs an NVIDIA
GPU, `pip install 'metrale[cuda]'` and CuPy.  See docs/streams.md."""

import cupy

import metrale
from metrale import BufferArena, ModelConfig

gpu = metrale.CudaBackend(0)
cfg = ModelConfig.preset("qwen3-next-80b")
arena = BufferArena.new(cfg, 64, 4096, 16, 32, gpu)
logits = cupy.from_dlpack(arena.view("logits", "float32"))
hidden = cupy.from_dlpack(arena.view("hidden_states", "uint8"))

stream = cupy.cuda.Stream(non_blocking=True)     # capture needs a stream other than the legacy one
with stream:
    stream.begin_capture()
    arena.zero_prefill_essentials(stream=stream)  # one memset node
    arena.zero_all_rows(stream=stream, tokens=8)  # one kernel node, 8 rows baked in
    graph = stream.end_capture()

logits.fill(1.0)
hidden.fill(0xAB)
graph.launch(stream)
stream.synchronize()
assert not logits.any() and not hidden.any()     # logits: cleared whole; hidden_states: by the prefill memset

stream.synchronize()
del graph, logits, hidden
arena.release()
print("ok: graph launched on a CuPy stream; arena released")
