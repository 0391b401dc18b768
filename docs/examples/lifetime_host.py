"""The lifetime rules of docs/lifetime.md, on the host backend (no GPU):
views keep the memory, arguments run before an operation holds the arena,
release waits for an operation on another thread and refuses from inside one,
and what a released arena answers.  tests/test_examples.py runs it."""

import threading

import numpy as np

from metrale import BufferArena, HostBackend, MetraleError, ModelConfig
from metrale.testing import FaultyBackend

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

# 2. Arguments are converted before an operation holds the arena: a stream
#    object's protocol method is your code, and it runs first.  (A release
#    there would free the arena at once, and the operation then refuses.)
class NoisyStream:
    def __cuda_stream__(self):        # runs before zero_all holds the arena
        print("converting the stream; the arena is not held yet")
        return (0, 0)                 # stream 0

arena.zero_all(stream=NoisyStream())
arena.release()

# 3. release() from inside an operation on the same thread is refused: a
#    garbage-collector finalizer could run there.  FaultyBackend.inject_call
#    runs code inside the next memset, where the arena is held.
gpu = FaultyBackend()
arena = BufferArena.new(cfg, 16, 4096, 16, 32, gpu)

def release_inside():
    try:
        arena.release()
    except MetraleError as e:
        print("refused:", e)

gpu.inject_call("memset", release_inside)
arena.zero_all()
assert not arena.is_released()

# 4. release() on another thread waits for an operation in flight, and
#    nothing new starts once it has begun.
inside, go = threading.Event(), threading.Event()

def in_flight():                      # the operation is now "in flight"
    inside.set()
    go.wait()

gpu.inject_call("memset", in_flight)
worker = threading.Thread(target=arena.zero_all)
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

# 5. A released arena: pointers are 0, sizes stay, operations raise.
assert arena.hidden_states() == 0 and arena.qkv_output_bytes() > 0
arena.release()                       # idempotent
print("ok")
