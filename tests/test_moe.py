"""The FP8 MoE slab (metrale.moe, ARENA.md §4.9): its layout against the worked
values and golden G, and the addresses an arena gives for it."""

import pytest

from metrale import BufferArena, BufferSizes, MetraleError, ModelConfig
from metrale.moe import moe_fp8_layout

from helpers import NOENV, PRESET, live_counts

MOE_FP8 = PRESET.replace(num_experts=256, num_experts_per_tok=8)


@pytest.mark.parametrize("rows, scale, worklist, counter, small_wl, small_bytes, small_counter, nbytes", [
    (8, 32_768, 33_792, 99_840, 100_096, 65_536, 165_632, 165_636),
    (2176, 8_912_896, 9_191_424, 9_292_032, 9_292_288, 65_536, 9_357_824, 9_357_828),
])
def test_moe_fp8_worked(rows, scale, worklist, counter, small_wl, small_bytes, small_counter, nbytes):
    L = moe_fp8_layout(MOE_FP8, rows)
    assert (L.scale, L.worklist, L.counter, L.small_worklist, L.small_bytes,
            L.small_counter, L.bytes) == (scale, worklist, counter, small_wl, small_bytes,
                                          small_counter, nbytes)


def test_moe_fp8_e128_no_small():
    L = moe_fp8_layout(MOE_FP8.replace(num_experts=128), 8)
    assert L.small_bytes == 0 and L.small_worklist == 0 and L.bytes == L.counter + 4 == 67_076


@pytest.mark.parametrize("Is", [0, 512, 4096])
@pytest.mark.parametrize("rows", [1, 32, 64, 65, 128, 2176])
def test_golden_G_invariants(Is, rows):
    cfg = MOE_FP8.replace(shared_expert_intermediate_size=Is)
    L = moe_fp8_layout(cfg, rows)
    shared_k = max(2048, Is)
    assert L.bytes <= moe_fp8_layout(cfg, 2176).bytes
    assert L.scale >= max(rows * 2048, rows * shared_k, rows * 8 * 512)
    assert L.worklist - L.scale >= max(4 * rows * -(-shared_k // 128), 4 * rows * 8 * 4)
    for width in (512, 2048):
        assert L.counter - L.worklist >= (-(-rows * 8 // 128) + 256 + 1) * -(-width // 64) * 8
    assert L.bytes - L.small_counter == 4
    assert L.counter + 4 <= L.small_worklist
    assert L.small_worklist + L.small_bytes <= L.small_counter
    for off in (L.scale, L.worklist, L.counter, L.small_worklist, L.small_counter):
        assert off % 256 == 0


@pytest.mark.parametrize("width, small", [(2048, 65_536), (4096, 131_072), (4097, 133_120)])
def test_golden_G_small_capacity(width, small):
    cfg = MOE_FP8.replace(hidden_size=width)
    assert moe_fp8_layout(cfg, 8).small_bytes == small


def test_golden_G_small_overflow():
    cfg = MOE_FP8.replace(hidden_size=2 ** 62)
    with pytest.raises(ValueError, match="adaptive FP8 small worklist size overflow"):
        moe_fp8_layout(cfg, 1)


def test_golden_G_budget():
    s = BufferSizes.from_config(MOE_FP8, 2176, 2048, 16, 128, env=NOENV)
    assert s.moe_fp8_scratch == 9_357_828
    assert s.total_bytes() - s.replace(moe_fp8_scratch=0).total_bytes() == 9_357_828
    dense = ModelConfig.preset("gemma-4-dense")
    assert moe_fp8_layout(dense, 2176).bytes == 0
    assert BufferSizes.from_config(dense, 2176, 4096, 16, 32, env=NOENV).moe_fp8_scratch == 0


def test_moe_fp8_scratch_arena(backend):
    gpu = backend
    before = live_counts(gpu)
    arena = BufferArena.new(MOE_FP8, 8, 128, 16, 8, gpu)
    base = arena.view("moe_fp8_scratch", "uint8").ptr
    counts = (gpu.alloc_count, gpu.sync_count)
    x = arena.moe_fp8_scratch(MOE_FP8, 8)
    assert x.small_worklist_bytes == 65_536
    assert x.activation == base and x.scales == base + 32_768 and x.worklist == base + 33_792
    assert x.total_tiles == base + 99_840 and x.worklist_bytes == 99_840 - 33_792
    assert x.small_worklist and x.small_total_tiles
    assert x.total_tiles + 4 <= x.small_worklist
    assert x.small_worklist + 65_536 <= x.small_total_tiles
    assert x.small_total_tiles + 4 <= base + arena.sizes().moe_fp8_scratch
    assert arena.moe_fp8_scratch(MOE_FP8, 8) == x and arena.moe_fp8_scratch(MOE_FP8, 1) != x
    assert (gpu.alloc_count, gpu.sync_count) == counts
    with pytest.raises(AttributeError):
        x.activation = 0
    with pytest.raises(MetraleError, match=r"FP8 MoE scratch.*rows=9.*capacity 165636 bytes"):
        arena.moe_fp8_scratch(MOE_FP8, 9)
    big = MOE_FP8.replace(moe_intermediate_size=51_200)
    with pytest.raises(MetraleError, match=r"FP8 MoE scratch.*6669060 bytes.*capacity 165636"):
        arena.moe_fp8_scratch(big, 8)
    with pytest.raises(TypeError, match="config"):
        arena.moe_fp8_scratch("x", 8)
    with pytest.raises(ValueError, match="rows"):
        arena.moe_fp8_scratch(MOE_FP8, -1)
    arena.moe_fp8_scratch(MOE_FP8, 1)            # cached; True == 1 must not hit it
    with pytest.raises(TypeError, match="rows"):
        arena.moe_fp8_scratch(MOE_FP8, True)
    arena.release(gpu)
    assert live_counts(gpu) == before
    with pytest.raises(MetraleError, match="FP8 MoE scratch.*released"):
        arena.moe_fp8_scratch(MOE_FP8, 8)


def test_moe_fp8_scratch_dense(backend):
    gpu = backend
    before = live_counts(gpu)
    dense = ModelConfig.preset("gemma-4-dense")
    arena = BufferArena.new(dense, 64, 128, 16, 8, gpu)
    assert arena.sizes().moe_fp8_scratch == 0
    with pytest.raises(MetraleError, match="FP8 MoE scratch"):
        arena.moe_fp8_scratch(dense, 8)
    arena.release(gpu)
    assert live_counts(gpu) == before
