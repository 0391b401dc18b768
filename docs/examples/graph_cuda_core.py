"""Order metrale's zeroing against your own work on a cuda.core stream, and
capture it into a graph through the driver bindings.  Needs an NVIDIA GPU,
`pip install 'metrale[cuda]' cuda-core`.  See docs/streams.md."""

try:
    from cuda.core import Device
except ImportError:                                # older cuda.core releases
    from cuda.core.experimental import Device
from cuda.bindings import driver

import metrale
from metrale import BufferArena, ModelConfig


def check(result):
    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{err!r}")
    return rest[0] if len(rest) == 1 else rest


dev = Device(0)
dev.set_current()                     # the primary context, the one CudaBackend uses too
gpu = metrale.CudaBackend(0)
cfg = ModelConfig.preset("qwen3-next-80b")
arena = BufferArena.new(cfg, 64, 4096, 16, 32, gpu)
stream = dev.create_stream()          # has __cuda_stream__: pass it as is

# Plain use: enqueued on `stream`, in order with the rest of that stream.
arena.zero_all(stream=stream)
stream.sync()

# Capture: begin/end on the same stream object, through the driver bindings.
handle = driver.CUstream(int(stream.handle))
check(driver.cuStreamBeginCapture(handle, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
arena.zero_all_rows(stream=stream, tokens=4)
graph = check(driver.cuStreamEndCapture(handle))
exe = check(driver.cuGraphInstantiate(graph, 0))

gpu.upload(arena.logits(), b"\xff" * 64)
check(driver.cuGraphLaunch(exe, handle))
stream.sync()
assert gpu.download(arena.logits(), 64) == bytes(64)

check(driver.cuGraphExecDestroy(exe))
check(driver.cuGraphDestroy(graph))
arena.release()
print("ok: cuda.core stream, captured and replayed; arena released")
