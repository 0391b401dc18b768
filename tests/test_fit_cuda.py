"""fit() and the memory ledger against the device itself (a CUDA GPU).

The host tests check fit and memory_stats against the formulas and the
layout; these check them against what the driver reports: ``cuMemGetInfo``
before and after building, sleeping and releasing real arenas, and a fit with
``budget=None`` (the device's free memory less the margin) whose arena is then
allocated."""

import pytest

from metrale import BufferArena, ModelConfig, fit
from metrale.fitting import FREE_MEMORY_MARGIN

pytestmark = pytest.mark.gpu

CFG = ModelConfig.preset("llama-3.1-8b")
LIMITS = (4096, 16, 64)          # max_seq_len, kv_block_size, max_batch_size
MIB2 = 2 << 20                   # the driver hands out whole 2 MiB pages


def _free(gpu):
    gpu.synchronize()
    return gpu.mem_info()[0]


def _ceil2m(n):
    return -(-n // MIB2) * MIB2


def test_memory_stats_follow_the_driver(gpu):
    """A plain arena takes its slab from the device, rounded to 2 MiB pages; a
    reserved one its committed bytes, which a sleep gives back; the ledger
    (memory_stats, metrale.stats) says the same bytes the driver does."""
    import metrale
    before = _free(gpu)
    with BufferArena.new(CFG, 4096, *LIMITS, gpu, env={}) as arena:
        taken = before - _free(gpu)
        m = arena.memory_stats()
        assert m["slab_bytes"] == m["committed_bytes"] == arena.slab_bytes()
        assert taken == _ceil2m(m["slab_bytes"]), (taken, m["slab_bytes"])
        assert metrale.stats()["committed_bytes"] >= m["committed_bytes"]
    assert _free(gpu) == before
    with BufferArena.new(CFG, 1024, *LIMITS, gpu, env={}, reserve=(8192,) + LIMITS) as arena:
        taken = before - _free(gpu)
        m = arena.memory_stats()
        assert m["committed_bytes"] % MIB2 == 0 and taken == m["committed_bytes"], (taken, m)
        assert m["reserved_bytes"] > m["committed_bytes"]
        arena.sleep()
        assert before - _free(gpu) == 0 == arena.memory_stats()["committed_bytes"]
        arena.wake()
        assert before - _free(gpu) == m["committed_bytes"]
        arena.resize(max_batch_tokens=8192)
        grown = arena.memory_stats()["committed_bytes"]
        assert before - _free(gpu) == grown > m["committed_bytes"]
    assert _free(gpu) == before


def test_fit_with_the_free_memory_allocates(gpu):
    """budget=None: the free memory less the margin.  The arena at the fitted
    M is then built (it fits what is free); the arena at M + 1 exceeds the
    budget fit used; the free memory it saw is what the driver reports."""
    free = _free(gpu)
    f = fit(CFG, None, *LIMITS, gpu=gpu, env={})
    assert f.budget == free - FREE_MEMORY_MARGIN
    assert f.arena_bytes <= f.budget
    assert f.limited_by == "formulas" or f.next_arena_bytes > f.budget
    with BufferArena.new(CFG, f.max_batch_tokens, *LIMITS, gpu, env={}) as arena:
        assert arena.slab_bytes() == f.arena_bytes
        assert free - _free(gpu) == _ceil2m(f.arena_bytes)
    # a budget of what is free now, for an arena with a KV cache beside it
    kv = 2 * CFG.num_key_value_heads * CFG.head_dim * 2 * CFG.num_hidden_layers
    g = fit(CFG, None, *LIMITS, gpu=gpu, env={}, max_batch_tokens=8192, kv_bytes_per_token=kv)
    assert g.arena_bytes + g.kv_bytes <= g.budget < g.arena_bytes + g.kv_bytes + kv


def test_fit_reserved_matches_the_reservation(gpu):
    """reserve=True: the arena fit sizes, with the device's granularity, is
    exactly what a reserved arena maps."""
    f = fit(CFG, "8GiB", *LIMITS, gpu=gpu, env={}, reserve=True)
    before = _free(gpu)
    with BufferArena.new(CFG, f.max_batch_tokens, *LIMITS, gpu, env={},
                         reserve=(f.max_batch_tokens,) + LIMITS) as arena:
        assert arena.committed_bytes() == f.arena_bytes == before - _free(gpu)
