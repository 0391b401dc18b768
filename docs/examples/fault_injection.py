"""Testing an engine's failure paths with metrale.testing.FaultyBackend
(docs/backends.md).  Run with pytest, or as a script."""

import pytest

from metrale import BufferArena, MetraleError, ModelConfig, OutOfMemoryError
from metrale.testing import FaultyBackend

CFG = ModelConfig.preset("qwen3-next-80b")


class Engine:
    """A stand-in for your engine: builds its arena at start, zeroes per step."""

    def __init__(self, gpu, max_batch_tokens):
        self.gpu = gpu
        self.arena = BufferArena.new(CFG, max_batch_tokens, 4096, 16, 32, gpu)

    def step(self, tokens):
        self.arena.zero_all_rows(tokens=tokens)

    def close(self):
        self.arena.release()


def test_startup_oom_leaves_nothing_allocated():
    gpu = FaultyBackend()
    gpu.inject_fault("alloc")                      # the next allocation fails
    with pytest.raises(OutOfMemoryError):
        Engine(gpu, 64)
    assert gpu.live_alloc_count == 0 and gpu.live_bytes == 0


def test_a_failed_step_does_not_poison_the_engine():
    gpu = FaultyBackend()
    engine = Engine(gpu, 64)
    gpu.inject_fault("memset")                     # the next memset fails
    with pytest.raises(MetraleError, match="HOST_INJECTED_FAULT"):
        engine.step(1)
    engine.step(1)                                 # one armed failure: later calls succeed
    engine.close()
    assert gpu.live_alloc_count == 0


def test_a_failed_free_still_marks_the_arena_released():
    gpu = FaultyBackend()
    engine = Engine(gpu, 64)
    gpu.inject_fault("free")
    with pytest.raises(MetraleError, match="HOST_INJECTED_FAULT"):
        engine.close()
    assert engine.arena.is_released() and engine.arena.hidden_states() == 0
    assert gpu.live_alloc_count == 1               # the slab was not freed: it leaked


def test_disarm():
    gpu = FaultyBackend()
    gpu.inject_fault("alloc")
    gpu.clear_faults()
    Engine(gpu, 16).close()


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
            print("passed", name)
