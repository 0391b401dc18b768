"""The slab plan (metrale._sizing._layout): placement of every preset, the row rule of
zero_all_rows in the C core against its worked examples, helper membership,
and the SlabPlan object."""

import pytest

from metrale import BufferSizes, HostBackend, ModelConfig
from metrale._sizing._layout import SlabPlan, plan_layout, zero_rows_ranges
from metrale.sizes import BUFFER_NAMES

from helpers import (COMPACT, NOENV, PRESET, check_placement, expected_rows_length, live_counts,
                     new)
from reference_oracle import (CHECKSUM, NAMES, PREFILL, ROWS, ROWS_BYTES_QWEN3_NEXT_M128,
                              ROWS_BYTES_QWEN3_NEXT_M1000, ZERO_ALL)


@pytest.mark.parametrize("preset", ModelConfig.presets())
@pytest.mark.parametrize("m", [1, 100, 128, 8192])
def test_every_preset_one_slab(preset, m):
    gpu = HostBackend()
    arena = new(gpu, ModelConfig.preset(preset), m=m)
    assert gpu.alloc_count == 1 and gpu.live_alloc_count == 1
    assert gpu.live_bytes == arena.slab_bytes()
    check_placement(arena, gpu)
    # zero_all and zero_prefill_essentials are each one contiguous range.
    layout = plan_layout(arena.sizes())
    za_lo, za_len = layout.zero_all
    zp_lo, zp_len = layout.zero_prefill
    offs = layout.offsets
    z = [(offs[n], offs[n] + getattr(arena.sizes(), n)) for n in ZERO_ALL if offs[n] is not None]
    p = [(offs[n], offs[n] + getattr(arena.sizes(), n)) for n in PREFILL if offs[n] is not None]
    assert (za_lo, za_lo + za_len) == (min(a for a, _ in z), max(b for _, b in z))
    assert (zp_lo, zp_lo + zp_len) == (min(a for a, _ in p), max(b for _, b in p))
    # the step inputs first: token_ids at 0, then scratch, the first of zero_all
    # and right before the zero_prefill_essentials buffers
    assert offs["token_ids"] == 0 and offs["scratch"] == za_lo
    assert za_lo == -(-arena.sizes().token_ids // 256) * 256
    assert zp_lo == -(-(za_lo + arena.sizes().scratch) // 256) * 256
    others = [(offs[n], offs[n] + getattr(arena.sizes(), n)) for n in NAMES
              if n not in ZERO_ALL and offs[n] is not None]
    for a, b in others:
        assert b <= za_lo or a >= za_lo + za_len
    arena.release(gpu)
    assert live_counts(gpu) == (0, 0)


def test_zero_all_rows_worked_m128():
    s = BufferSizes.from_config(PRESET, 128, 4096, 16, 32, env=NOENV)
    full = sum(getattr(s, n) for n in ROWS)
    trimmed = sum(expected_rows_length(n, getattr(s, n), 128, 1) for n in ROWS)
    assert (full, trimmed) == ROWS_BYTES_QWEN3_NEXT_M128
    assert expected_rows_length("hidden_states", s.hidden_states, 128, 1) == 4096 and s.hidden_states == 524_288
    assert expected_rows_length("ssm_ba", s.ssm_ba, 128, 1) == 128 and s.ssm_ba == 16_384
    # the C core clears the same number of bytes (the whole ones, splitk_workspace,
    # logits and scratch, merge into one range)
    whole = sum(getattr(s, n) for n in ZERO_ALL if n not in ROWS)
    got = sum(length for _, length in zero_rows_ranges(s, 128, 1))
    assert got >= trimmed + whole
    assert got - (trimmed + whole) < 3 * 256


def test_zero_all_rows_worked_m1000():
    s = BufferSizes.from_config(PRESET, 1000, 4096, 16, 32, env=NOENV)
    L = {n: expected_rows_length(n, getattr(s, n), 1000, 1) for n in ROWS}
    assert (sum(getattr(s, n) for n in ROWS), sum(L.values())) == ROWS_BYTES_QWEN3_NEXT_M1000
    assert (s.hidden_states, L["hidden_states"]) == (4_096_000, 4_096)
    assert (s.qkv_output, L["qkv_output"]) == (18_579_456, 294_912)
    assert (s.moe_output, L["moe_output"]) == (4_128_768, 65_536)
    assert (s.ssm_qkvz, L["ssm_qkvz"]) == (24_772_608, 393_216)
    assert (s.ssm_deinterleaved, L["ssm_deinterleaved"]) == (24_772_608, 393_216)
    assert (s.expert_gate_out, L["expert_gate_out"]) == (10_321_920, 163_840)
    assert (s.expert_down_out, L["expert_down_out"]) == (41_287_680, 655_360)


# ARENA.md §5.2's worked examples (M = 8193, m16 = 8208, w = 32,768), each in a
# buffer of the row rule it shows: hidden_states rows of M, qkv_output (GEMM-tiled)
# rows of ceil16(M), ssm_qkvz the larger of both.
@pytest.mark.parametrize("name, n, m, tokens, length", [
    ("hidden_states", 8193 * 32768, 8193, 1, 32768),
    ("qkv_output", 8208 * 32768, 8193, 1, 16 * 32768),
    ("qkv_output", 8208 * 32768, 8193, 17, 32 * 32768),
    ("qkv_output", 8208 * 32768, 8193, 8193, 8208 * 32768),
    ("hidden_states", 8208 * 32768, 8193, 1, 8208 * 32768),    # rows of M do not divide
    ("hidden_states", 1_000_003, 8193, 1, 1_000_003),
    ("qkv_output", 1_000_003, 8193, 1, 1_000_003),
    ("hidden_states", 4096 * 32768, 4096, 1, 32768),
    ("qkv_output", 4096 * 32768, 4096, 1, 16 * 32768),         # M = Mp: still 16 rows
    # both: a row of M is ceil(n / 8193) = 32,828 bytes, one of Mp 32,768; the larger
    # of tokens rows of the one and ceil16(tokens) of the other
    ("ssm_qkvz", 8208 * 32768, 8193, 1, 16 * 32768),
    ("ssm_qkvz", 8208 * 32768, 8193, 8000, 8000 * 32828),
    # ceil(1,000,003 / 8193) = 123, ceil(1,000,003 / 8208) = 122: 17 * 123 < 32 * 122
    ("ssm_qkvz", 1_000_003, 8193, 17, 32 * 122),
])
def test_zero_rows_length_rule_in_core(name, n, m, tokens, length):
    zero = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0))
    s = zero.replace(**{name: n})
    assert zero_rows_ranges(s, m, tokens) == [(0, length)]


def test_core_helper_lists_match_the_spec():
    g = plan_layout(BufferSizes.from_config(PRESET, 8, 4096, 16, 32, env=NOENV)).groups
    # zero_all and zero_prefill_essentials are one merged operation each, so only
    # their membership is observable; the checksum's order is its log order.
    assert set(g["zero_all"]) == set(ZERO_ALL) and len(g["zero_all"]) == len(ZERO_ALL)
    assert set(g["prefill"]) == set(PREFILL) and len(g["prefill"]) == len(PREFILL)
    assert g["rows"] == ROWS and g["checksum"] == CHECKSUM


def test_slab_plan_object():
    sizes = BufferSizes.from_config(PRESET, 128, 4096, 16, 32, env=NOENV)
    plan = plan_layout(sizes)
    offsets = plan.offsets
    assert set(offsets) == set(sizes) and plan.max_batch_tokens == 128     # every buffer sized
    assert sorted(plan.slab_order) == sorted(sizes)
    placed = [(offsets[n], n) for n in plan.slab_order if offsets[n] is not None]
    assert placed == sorted(placed)                           # slab order is address order
    assert all(o % 256 == 0 for o, _ in placed)
    last = placed[-1][1]
    assert plan.slab_bytes == -(-(offsets[last] + getattr(sizes, last)) // 256) * 256
    za, zp = plan.zero_all, plan.zero_prefill
    # token_ids first, then zero_all from scratch, the prefill buffers inside it
    assert offsets["token_ids"] == 0 and za[0] == offsets["scratch"] > 0
    assert za[0] < zp[0] and zp[0] + zp[1] <= za[0] + za[1]
    assert plan.rows_ranges(128) == [za] and plan.rows_ranges(1) == zero_rows_ranges(sizes, 128, 1)
    with pytest.raises(TypeError, match="sizes"):
        plan_layout({}, 128)
    # the older plan_layout(sizes, max_batch_tokens), deprecated for these sizes: still checked
    with pytest.raises(ValueError, match="max_batch_tokens"), \
            pytest.warns(DeprecationWarning, match=r"write plan_layout\(sizes\)"):
        plan_layout(sizes, 0)
    with pytest.raises(TypeError):
        SlabPlan()


def test_rows_length_is_the_row_rule_per_buffer():
    for m in (1, 100, 128, 1000):
        sizes = BufferSizes.from_config(PRESET, m, 4096, 16, 32, env=NOENV)
        plan = plan_layout(sizes)
        for tokens in (0, 1, 15, 17, m - 1, m, m + 3):
            for name in NAMES:
                n = getattr(sizes, name)
                want = expected_rows_length(name, n, m, tokens) if name in ROWS else n
                assert plan.rows_length(name, tokens) == want, (m, tokens, name)
    with pytest.raises(KeyError):
        plan.rows_length("nope", 1)
    with pytest.raises(ValueError, match="tokens"):
        plan.rows_length("logits", -1)


def test_plans_of_debug_and_reserved_arenas_are_the_arenas_own():
    """plan_layout(guard_bytes=) and plan_reserved place every buffer where a
    debug or reserved arena built from the same sizes does, and a reserved
    plan's committed_bytes is what that arena maps."""
    import os
    from metrale import BufferArena, DebugOptions, HostBackend
    from metrale._sizing._layout import plan_reserved
    gpu = HostBackend()
    page = os.sysconf("SC_PAGESIZE")
    assert gpu.allocation_granularity() == page
    sizes = BufferSizes.from_config(COMPACT, 64, 512, 16, 8, env=NOENV)
    top = BufferSizes.from_config(COMPACT, 256, 1024, 16, 8, env=NOENV)
    with BufferArena.from_sizes(sizes, gpu, debug=True) as a:
        plan = plan_layout(sizes, guard_bytes=a.debug_options().guard_bytes)
        assert plan.slab_bytes == a.slab_bytes() and not plan.reserved
        assert {n: i.offset for n, i in a.buffers.items()} == plan.offsets
    for guard in (0, 4096):
        with BufferArena.from_sizes(sizes, gpu, reserve_sizes=top,
                                    debug=DebugOptions(guard_bytes=guard) if guard else None) as a:
            plan = plan_reserved(sizes, top, 64, page, guard_bytes=guard)
            assert plan.reserved and plan.slab_bytes == a.slab_bytes()
            assert plan.committed_bytes == a.committed_bytes() == gpu.mapped_bytes
            assert {n: i.offset for n, i in a.buffers.items() if i.nbytes} == \
                {n: o for n, o in plan.offsets.items() if o is not None}
    with pytest.raises(ValueError, match="granularity"):
        plan_reserved(sizes, top, 64, 1000)
    with pytest.raises(ValueError, match="exceed its reserved"):
        plan_reserved(top, sizes, 64, page)
    with pytest.raises(TypeError, match="reserve_sizes"):
        plan_reserved(sizes, {}, 64, page)
