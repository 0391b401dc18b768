"""The lifetime rules of docs/lifetime.md, on the host backend (no GPU):
views keep the memory, release waits for an operation on another thread and
refuses from inside one, and what a released arena answers."""

import threading

import numpy as np

import metrale
from metrale import BufferArena, HostBackend, MetraleError, ModelConfig

cfg = ModelConfig.preset("qwen3-next-80b")
gpu = HostBackend()
arena = BufferArena.new(cfg, 16, 4096, 16, 32, gpu)

# 1. A view, and every array made from it, keeps the arena's memory.
hidden = np.asarray(arena.view("hidden_states", "float32"))
try:
    arena.release()
except BufferError as e:
    print("refused:", e)
assert not arena.is_released() and gpu.live_alloc_count == 1
hidden[:] = 1.0                       # still valid: nothing was freed
del hidden                            # the last array made from the view

# 2. release() from inside an operation on the same thread is refused.
class StreamThatReleases:
    def __cuda_stream__(self):        # runs inside zero_all, which holds the arena
        try:
            arena.release()
        except MetraleError as e:
            print("refused:", e)
        return (0, 0)                 # stream 0

arena.zero_all(stream=StreamThatReleases())
assert not arena.is_released()

# 3. release() on another thread waits for an operation in flight, and
#    nothing new starts once it has begun.
inside, go = threading.Event(), threading.Event()

class SlowStream:
    def __cuda_stream__(self):
        inside.set()
        go.wait()                     # the operation is now "in flight"
        return (0, 0)

worker = threading.Thread(target=lambda: arena.zero_all(stream=SlowStream()))
worker.start()
inside.wait()
releaser = threading.Thread(target=arena.release)
releaser.start()
while not arena.is_released():        # release has begun: it marks first, then waits
    pass
try:
    arena.zero_prefill_essentials()
except MetraleError as e:
    print("refused:", e)
assert gpu.live_alloc_count == 1      # not freed under the running zero_all
go.set()
worker.join()
releaser.join()
assert gpu.live_alloc_count == 0

# 4. A released arena: pointers are 0, sizes stay, operations raise.
assert arena.hidden_states() == 0 and arena.qkv_output_bytes() > 0
arena.release()                       # idempotent
print("ok")
