"""BufferArena on every backend: placement, zeroing, checksum, carve, release."""

import gc
import logging
import threading
import warnings

import pytest

from metrale import (BufferArena, BufferSizes, HostBackend, MetraleError, ModelConfig,
                     OutOfMemoryError)
from metrale._layout import plan_layout, zero_rows_ranges
from metrale.sizes import BUFFER_NAMES

from helpers import (CHECKSUM, COMPACT, NOENV, POINTER_NAMES, PREFILL, PRESET, ROWS, ZERO_ALL,
                     AttrStream, Mem, ProtoStream, check_placement, check_zeroed, expected_rows_length, fill_all,
                     live_counts, new, ptr_of, rows_expectation)

# -- placement -------------------------------------------------------------------------

def test_arena_sanity_golden(backend):
    gpu = backend
    before = live_counts(gpu)
    arena = BufferArena.new(PRESET, 128, 4096, 16, 32, gpu)
    try:
        assert arena.max_batch_tokens() == 128 and arena.label() == "buffer arena"
        sizes = arena.sizes()
        nonnull = 0
        for name in BUFFER_NAMES:
            p = ptr_of(arena, name)
            assert (getattr(sizes, name) == 0) == (p == 0), name
            nonnull += p != 0
        if type(gpu) is HostBackend:     # the host target is the reference target
            assert nonnull == 33
        assert sizes.gdn_fla_scratch and sizes.moe_fp8_scratch
        m = Mem(arena, gpu)
        assert not m.read("norm_unit_w").any()
    finally:
        arena.release(gpu)
    assert live_counts(gpu) == before


@pytest.mark.parametrize("preset", ModelConfig.presets())
@pytest.mark.parametrize("m", [1, 100, 128, 8192])
def test_every_preset_one_slab(preset, m):
    gpu = HostBackend()
    arena = new(gpu, ModelConfig.preset(preset), m=m)
    assert gpu.alloc_count == 1 and gpu.live_alloc_count == 1
    assert gpu.live_bytes == arena.slab_bytes()
    check_placement(arena, gpu)
    # zero_all and zero_prefill_essentials are each one contiguous range.
    layout = plan_layout(arena.sizes(), m)
    za_lo, za_len = layout.zero_all
    zp_lo, zp_len = layout.zero_prefill
    offs = layout.offsets
    z = [(offs[n], offs[n] + getattr(arena.sizes(), n)) for n in ZERO_ALL if offs[n] is not None]
    p = [(offs[n], offs[n] + getattr(arena.sizes(), n)) for n in PREFILL if offs[n] is not None]
    assert (za_lo, za_lo + za_len) == (min(a for a, _ in z), max(b for _, b in z))
    assert (zp_lo, zp_lo + zp_len) == (min(a for a, _ in p), max(b for _, b in p))
    assert zp_lo == za_lo
    others = [(offs[n], offs[n] + getattr(arena.sizes(), n)) for n in BUFFER_NAMES
              if n not in ZERO_ALL and offs[n] is not None]
    for a, b in others:
        assert b <= za_lo or a >= za_lo + za_len
    arena.release(gpu)
    assert live_counts(gpu) == (0, 0)


def test_zero_size_entries_are_null(backend):
    gpu = backend
    s = BufferSizes.from_config(PRESET, 16, 4096, 16, 32, env=NOENV).replace(
        hidden_states=0, logits=0, o_latent=0)
    with BufferArena.from_sizes(PRESET, s, 16, 32, gpu) as arena:
        assert arena.hidden_states() == 0 and arena.logits() == 0 and arena.o_latent() == 0
        assert arena.residual() != 0
        check_placement(arena, gpu)
        arena.zero_all(gpu, 0)
        arena.zero_all_rows(gpu, 0, 1)


# -- zeroing sentinels ------------------------------------------------------------------

@pytest.mark.parametrize("helper, group, m_tokens", [
    ("zero_all", ZERO_ALL, 100), ("zero_all", ZERO_ALL, 128),
    ("zero_prefill_essentials", PREFILL, 100),
])
def test_whole_helpers_exact(backend, helper, group, m_tokens):
    """zero_all and zero_prefill_essentials: one operation, exactly their buffers."""
    gpu = backend
    with new(gpu, m=m_tokens) as arena:
        m = fill_all(arena, gpu)
        before = gpu.memset_count
        getattr(arena, helper)(gpu, 0)
        assert gpu.memset_count - before == 1
        check_zeroed(arena, m, {n: getattr(arena.sizes(), n) for n in group})


@pytest.mark.parametrize("m_tokens, tokens", [
    (100, 0), (100, 1), (100, 5), (100, 16), (100, 17), (100, 99), (100, 100), (100, 500),
    (128, 1), (128, 127), (128, 128), (1, 0), (1, 1), (3, 2),
])
def test_zero_all_rows_exact(backend, m_tokens, tokens):
    gpu = backend
    with new(gpu, m=m_tokens) as arena:
        m = fill_all(arena, gpu)
        arena.zero_all_rows(gpu, 0, tokens)
        check_zeroed(arena, m, rows_expectation(arena.sizes(), m_tokens, tokens))


def test_zero_all_rows_ops_count():
    gpu = HostBackend()
    with new(gpu, m=128) as arena:
        before = gpu.memset_count
        arena.zero_all_rows(gpu, 0, 128)
        assert gpu.memset_count - before == 1           # tokens >= m: the zero_all range
        before = gpu.memset_count
        arena.zero_all_rows(gpu, 0, 1)
        # at most one per non-skipped range: 15 trimmed + 3 whole
        assert 1 <= gpu.memset_count - before <= 18


def test_zero_all_rows_worked_m128():
    s = BufferSizes.from_config(PRESET, 128, 4096, 16, 32, env=NOENV)
    full = sum(getattr(s, n) for n in ROWS)
    trimmed = sum(expected_rows_length(getattr(s, n), 128, 1) for n in ROWS)
    assert (full, trimmed) == (26_132_480, 204_160)
    assert expected_rows_length(s.hidden_states, 128, 1) == 4096 and s.hidden_states == 524_288
    assert expected_rows_length(s.ssm_ba, 128, 1) == 128 and s.ssm_ba == 16_384
    # the C core clears the same number of bytes (the whole ones merge into one range)
    got = sum(length for _, length in zero_rows_ranges(s, 128, 1))
    assert got >= trimmed + s.splitk_workspace + s.logits + s.scratch
    assert got - (trimmed + s.splitk_workspace + s.logits + s.scratch) < 3 * 256


def test_zero_all_rows_worked_m1000():
    s = BufferSizes.from_config(PRESET, 1000, 4096, 16, 32, env=NOENV)
    L = {n: expected_rows_length(getattr(s, n), 1000, 1) for n in ROWS}
    assert sum(getattr(s, n) for n in ROWS) == 205_224_960
    assert sum(L.values()) == 2_200_960
    assert (s.hidden_states, L["hidden_states"]) == (4_096_000, 4_096)
    assert (s.qkv_output, L["qkv_output"]) == (18_579_456, 294_912)
    assert (s.moe_output, L["moe_output"]) == (4_128_768, 65_536)
    assert (s.ssm_qkvz, L["ssm_qkvz"]) == (24_772_608, 393_216)
    assert (s.ssm_deinterleaved, L["ssm_deinterleaved"]) == (24_772_608, 393_216)
    assert (s.expert_gate_out, L["expert_gate_out"]) == (10_321_920, 163_840)
    assert (s.expert_down_out, L["expert_down_out"]) == (41_287_680, 655_360)


@pytest.mark.parametrize("n, m, tokens, length", [
    (8193 * 32768, 8193, 1, 32768),
    (8208 * 32768, 8193, 1, 16 * 32768),
    (8208 * 32768, 8193, 17, 32 * 32768),
    (8208 * 32768, 8193, 8193, 8208 * 32768),
    (1_000_003, 8193, 1, 1_000_003),
    (4096 * 32768, 4096, 1, 32768),
])
def test_zero_rows_length_rule_in_core(n, m, tokens, length):
    zero = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0))
    s = zero.replace(hidden_states=n)
    assert zero_rows_ranges(s, m, tokens) == [(0, length)]


def test_zero_all_rows_skips_empty_ranges():
    gpu = HostBackend()
    zero = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0))
    with BufferArena.from_sizes(PRESET, zero.replace(hidden_states=4096, o_latent=256), 16, 0, gpu) as a:
        before = gpu.memset_count
        a.zero_all_rows(gpu, 0, 0)
        assert gpu.memset_count == before            # tokens = 0 trims to nothing
        a.zero_all_rows(gpu, 0, 1)
        assert gpu.memset_count == before + 1
    with BufferArena.from_sizes(PRESET, zero.replace(o_latent=256), 16, 0, gpu) as a:
        before = gpu.memset_count
        a.zero_all(gpu, 0)
        a.zero_prefill_essentials(gpu, 0)
        a.zero_all_rows(gpu, 0, 3)
        assert gpu.memset_count == before


def test_zeroing_argument_errors(backend):
    gpu = backend
    with new(gpu, m=16) as arena:
        with pytest.raises(TypeError, match="tokens"):
            arena.zero_all_rows(gpu, 0, 1.0)
        with pytest.raises(ValueError, match="tokens"):
            arena.zero_all_rows(gpu, 0, -1)
        with pytest.raises(TypeError, match="stream"):
            arena.zero_all(gpu, "s")
        with pytest.raises(MetraleError, match="not the arena's own"):
            arena.zero_all(HostBackend(), 0)


def _random_ranges(rnd, n):
    """2..18 disjoint ranges inside [0, n): 16-byte aligned starts, lengths that
    include 1..15, odd and multi-block sizes."""
    k = rnd.randint(2, 18)
    starts = sorted(rnd.sample(range(0, n // 16), k))
    out = []
    for i, a in enumerate(starts):
        gap = (starts[i + 1] if i + 1 < k else n // 16) * 16 - a * 16
        length = min(gap, rnd.choice([1, 7, 15, 16, 17, 4095, 8192, 8193, rnd.randint(1, 300_000)]))
        out.append((a * 16, length))
    rnd.shuffle(out)          # the call takes them in any order
    return out


@pytest.mark.parametrize("seed", range(6))
def test_clear_ranges_random(backend, seed):
    """Backend.clear_ranges, the operation behind zero_all_rows, against a numpy
    model: exactly the listed bytes become zero, in one launch on CUDA."""
    import random

    import numpy as np
    gpu = backend
    rnd = random.Random(seed)
    with new(gpu, m=128) as arena:
        mem = Mem(arena, gpu)
        mem.fill("logits", 0xA5)
        n = arena.sizes().logits
        base = ptr_of(arena, "logits")
        ranges = _random_ranges(rnd, n)
        expect = np.full(n, 0xA5, dtype=np.uint8)
        for off, length in ranges:
            expect[off:off + length] = 0
        launches = getattr(gpu, "launch_count", None)
        gpu.clear_ranges([(base + off, length) for off, length in ranges], 0)
        got = mem.read("logits")
        bad = np.flatnonzero(got != expect)
        assert bad.size == 0, f"{bad.size} bytes differ, first at {bad[:5]}"
        if launches is not None:
            assert gpu.launch_count - launches == 1


def test_clear_ranges_errors():
    gpu = HostBackend()
    with new(gpu, m=16) as arena:
        p = arena.hidden_states()
        with pytest.raises(TypeError, match="ranges"):
            gpu.clear_ranges(p)
        with pytest.raises(TypeError, match="address"):
            gpu.clear_ranges([(float(p), 16)])
        with pytest.raises(TypeError, match="tuple"):
            gpu.clear_ranges([[p, 16]])
        with pytest.raises(ValueError, match="aligned"):
            gpu.clear_ranges([(p + 8, 16)])
        with pytest.raises(ValueError, match="nbytes"):
            gpu.clear_ranges([(p, -1)])
        with pytest.raises(ValueError, match="at most 18"):
            gpu.clear_ranges([(p + 16 * i, 16) for i in range(19)])
        before = gpu.memset_count
        gpu.clear_ranges([(p, 0), (0, 0)])        # empty ranges: nothing to do
        assert gpu.memset_count == before


@pytest.mark.parametrize("stream", [0, ProtoStream(), AttrStream(cuda_stream=0), AttrStream(ptr=0)])
def test_stream_objects(backend, stream):
    gpu = backend
    with new(gpu, m=16) as arena:
        m = Mem(arena, gpu)
        m.fill("hidden_states", 0xAB)
        arena.zero_prefill_essentials(gpu, stream)
        assert not m.read("hidden_states").any()


# -- checksum --------------------------------------------------------------------------

def test_checksum_records(backend, caplog):
    import numpy as np
    gpu = backend
    with new(gpu, m=16) as arena:
        m = Mem(arena, gpu)
        arena.zero_all(gpu, 0)
        lanes = np.array([1.0, -2.0], dtype="<f4").tobytes()
        hs = arena.sizes().hidden_states
        data = np.zeros(hs, dtype=np.uint8)
        data[:8] = np.frombuffer(lanes, dtype=np.uint8)
        m.write("hidden_states", data)
        lanes2 = np.array([1.0, np.nan, np.inf, 2.0, -np.inf], dtype="<f4")
        data = np.zeros(arena.sizes().residual, dtype=np.uint8)
        data[:20] = np.frombuffer(lanes2.tobytes(), dtype=np.uint8)
        m.write("residual", data)
        counts = (gpu.sync_count, gpu.d2h_count)
        with caplog.at_level(logging.WARNING, logger="metrale"):
            assert arena.debug_buffer_checksum(gpu, 0, "step0") is None
        recs = [r.getMessage() for r in caplog.records if r.name == "metrale"]
        assert len(recs) == 16
        assert [r.split()[1] for r in recs] == list(CHECKSUM)
        assert recs[0] == (f"METRALE_BUF_CKSUM[step0] hidden_states bytes={hs} "
                           "sum=-1.000000 ssq=5.000000 sabs=3.000000")
        assert recs[1].endswith("sum=3.000000 ssq=5.000000 sabs=3.000000")
        assert recs[2].endswith("sum=0.000000 ssq=0.000000 sabs=0.000000")
        assert gpu.sync_count - counts[0] == 1 and gpu.d2h_count - counts[1] == 16


def test_checksum_partial_lane_and_failed_copy(caplog):
    gpu = HostBackend()
    zero = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0))
    s = zero.replace(hidden_states=6, residual=8, norm_output=8, logits=4)
    import numpy as np
    with BufferArena.from_sizes(PRESET, s, 1, 0, gpu) as a:
        np.asarray(a.view("hidden_states", "uint8"))[:] = \
            np.frombuffer(np.array([1.5], "<f4").tobytes() + b"\x00\x00", np.uint8)
        np.asarray(a.view("residual", "uint8"))[:] = 0
        np.asarray(a.view("norm_output", "uint8"))[:] = 0
        gpu.inject_fault("d2h", 2)          # the residual copy fails: skipped silently
        gpu.inject_fault("sync", 1)         # a failed synchronize is ignored
        with caplog.at_level(logging.WARNING, logger="metrale"):
            a.debug_buffer_checksum(gpu, 0, "t")
        recs = [r.getMessage() for r in caplog.records if r.name == "metrale"]
        assert recs == ["METRALE_BUF_CKSUM[t] hidden_states bytes=6 sum=1.500000 ssq=2.250000 sabs=1.500000",
                        "METRALE_BUF_CKSUM[t] norm_output bytes=8 sum=0.000000 ssq=0.000000 sabs=0.000000"]
        with pytest.raises(TypeError, match="tag"):
            a.debug_buffer_checksum(gpu, 0, 3)


# -- FP8 MoE scratch -----------------------------------------------------------------------

MOE_FP8 = PRESET.replace(num_experts=256, num_experts_per_tok=8)


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


# -- row-wise slab --------------------------------------------------------------------------

def _rowwise_arena(gpu, slab):
    s = BufferSizes.from_config(COMPACT, 64, 4096, 16, 32, env=NOENV)
    return BufferArena.from_sizes(COMPACT, s.replace(ssm_rowwise_w_bf16=slab), 64, 32, gpu)


def test_rowwise_carves(backend):
    gpu = backend
    per_layer = 2 * 1536 * 512 + 2 * 512 * 512
    assert per_layer == 2_097_152 and COMPACT.num_ssm_layers() == 3
    arena = _rowwise_arena(gpu, 3 * per_layer)
    assert arena.ssm_rowwise_w_bf16_bytes() == 6_291_456
    base = arena.view("ssm_rowwise_w_bf16", "uint8").ptr
    counts = live_counts(gpu)
    out_proj = arena.take_ssm_rowwise_w_bf16(524_288)
    qkvz = arena.take_ssm_rowwise_w_bf16(1_572_864)
    assert out_proj == base and qkvz == out_proj + 524_288
    for _ in range(2):
        arena.take_ssm_rowwise_w_bf16(524_288)
        arena.take_ssm_rowwise_w_bf16(1_572_864)
    assert live_counts(gpu) == counts
    with pytest.raises(MetraleError, match=r"exhausted.*1 bytes.*offset 6291456.*6291456-byte"):
        arena.take_ssm_rowwise_w_bf16(1)
    with pytest.raises(MetraleError, match=r"exhausted.*offset 6291457"):   # no rollback
        arena.take_ssm_rowwise_w_bf16(0)
    arena.release(gpu)
    with pytest.raises(MetraleError, match="row-wise.*slab is absent"):
        arena.take_ssm_rowwise_w_bf16(1)


def test_rowwise_absent(backend):
    gpu = backend
    with _rowwise_arena(gpu, 0) as arena:
        counts = live_counts(gpu)
        with pytest.raises(MetraleError, match=r"row-wise.*slab is absent.*4096 bytes.*METRALE_FP8_ROWWISE=1"):
            arena.take_ssm_rowwise_w_bf16(4096)
        assert live_counts(gpu) == counts
        with pytest.raises(TypeError, match="bytes"):
            arena.take_ssm_rowwise_w_bf16("1")
        with pytest.raises(ValueError, match="bytes"):
            arena.take_ssm_rowwise_w_bf16(-1)


def test_rowwise_concurrent_disjoint():
    gpu = HostBackend()
    n_threads, per_thread, chunk = 8, 500, 64
    with _rowwise_arena(gpu, n_threads * per_thread * chunk) as arena:
        got = [[] for _ in range(n_threads)]
        barrier = threading.Barrier(n_threads)

        def work(i):
            barrier.wait()
            for _ in range(per_thread):
                got[i].append(arena.take_ssm_rowwise_w_bf16(chunk))

        ts = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        base = arena.view("ssm_rowwise_w_bf16", "uint8").ptr
        allp = sorted(p for g in got for p in g)
        assert allp == [base + i * chunk for i in range(n_threads * per_thread)]
        with pytest.raises(MetraleError, match="exhausted"):
            arena.take_ssm_rowwise_w_bf16(1)


SLAB = 6_291_456      # the compact config's row-wise slab (ARENA.md §6.1)


@pytest.mark.parametrize("first", [SLAB - 1, SLAB, SLAB + 1, 2**63, 2**64 - 4096, 2**64 - 1])
def test_rowwise_cursor_at_its_limits(first):
    """One byte under, at and past the slab, 2^63, 2^64 - 4096 and 2^64 - 1: a
    carve that fits succeeds once; after the first that does not, every carve
    fails, whatever its size (the cursor saturates instead of wrapping)."""
    gpu = HostBackend()
    with _rowwise_arena(gpu, SLAB) as arena:
        base = arena.view("ssm_rowwise_w_bf16", "uint8").ptr
        if first <= SLAB:
            assert arena.take_ssm_rowwise_w_bf16(first) == base
            rest = SLAB - first
            assert arena.take_ssm_rowwise_w_bf16(rest) == base + first
            assert arena.take_ssm_rowwise_w_bf16(0) == base + SLAB      # empty, at the end
        with pytest.raises(MetraleError, match="exhausted"):
            arena.take_ssm_rowwise_w_bf16(first if first > SLAB else 1)
        for n in (0, 1, 4096, 2**63, 2**64 - 4096, 2**64 - 1, 0):
            with pytest.raises(MetraleError, match="exhausted"):
                arena.take_ssm_rowwise_w_bf16(n)


def test_rowwise_cursor_saturates_under_threads():
    """Concurrent carves of sizes up to 2^64 - 1: successes are disjoint and
    inside the slab, and none follows an observed exhaustion."""
    import random
    gpu = HostBackend()
    sizes = [0, 1, 64, 4096, 65_536, 2**63, 2**64 - 4096, 2**64 - 1]
    with _rowwise_arena(gpu, SLAB) as arena:
        base = arena.view("ssm_rowwise_w_bf16", "uint8").ptr
        failed = threading.Event()
        got, errors = [], []
        barrier = threading.Barrier(4)

        def work(seed):
            rnd = random.Random(seed)
            barrier.wait()
            for _ in range(3000):
                n = rnd.choice(sizes[:5]) if rnd.random() < 0.995 else rnd.choice(sizes)
                after_failure = failed.is_set()
                try:
                    p = arena.take_ssm_rowwise_w_bf16(n)
                except MetraleError:
                    failed.set()
                    continue
                if after_failure:
                    errors.append(("carved after exhaustion", n))
                got.append((p - base, n))

        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert not errors
        spans = sorted((o, o + n) for o, n in got if n)
        assert all(0 <= a and b <= SLAB for a, b in spans)
        assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))


# -- release, errors, faults ---------------------------------------------------------------

def test_release_behaviour(backend):
    gpu = backend
    before = live_counts(gpu)
    arena = new(gpu, m=16)
    sizes, dm = arena.sizes(), arena.decode_meta()
    nbytes = arena.qkv_output_bytes()
    with pytest.raises(MetraleError, match="not the arena's own"):
        arena.release(HostBackend())
    assert arena.hidden_states() != 0
    arena.release(gpu)
    assert live_counts(gpu) == before
    assert all(getattr(arena, n)() == 0 for n in POINTER_NAMES)
    assert arena.sizes() is sizes and arena.decode_meta() == dm and arena.max_batch_tokens() == 16
    assert arena.qkv_output_bytes() == nbytes and arena.label() == "buffer arena"
    for call in (lambda: arena.zero_all(gpu, 0), lambda: arena.zero_prefill_essentials(gpu, 0),
                 lambda: arena.zero_all_rows(gpu, 0, 1),
                 lambda: arena.debug_buffer_checksum(gpu, 0, "x"),
                 lambda: arena.view("hidden_states", "uint8")):
        with pytest.raises(MetraleError, match="released"):
            call()
    assert arena.release(gpu) is None              # idempotent
    assert live_counts(gpu) == before


def test_release_failing_free():
    gpu = HostBackend()
    arena = new(gpu, m=16)
    gpu.inject_fault("free")
    with pytest.raises(MetraleError, match="HOST_INJECTED_FAULT"):
        arena.release(gpu)
    assert arena.hidden_states() == 0 and arena.is_released()
    frees = gpu.free_count
    arena.release(gpu)                                # a second call does nothing
    assert gpu.free_count == frees


def test_context_manager_and_label():
    gpu = HostBackend()
    with new(gpu, m=4) as arena:
        assert gpu.live_alloc_count == 1
    assert gpu.live_alloc_count == 0 and arena.hidden_states() == 0


def test_finalizer_frees_and_warns():
    gpu = HostBackend()
    arena = new(gpu, m=4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        del arena
        gc.collect()
    assert gpu.live_alloc_count == 0 and gpu.live_bytes == 0
    assert any(issubclass(x.category, ResourceWarning) and "buffer arena" in str(x.message) for x in w)


@pytest.mark.parametrize("op", ["alloc", "memset", "sync"])
def test_construction_fault_leaves_nothing(op):
    gpu = HostBackend()
    gpu.inject_fault(op)
    exc = OutOfMemoryError if op == "alloc" else MetraleError
    with pytest.raises(exc) as info:
        new(gpu, m=16)
    if op == "alloc":
        slab = plan_layout(BufferSizes.from_config(PRESET, 16, 4096, 16, 32, env=NOENV), 16).slab_bytes
        assert "slab" in str(info.value) and str(slab) in str(info.value)
        assert isinstance(info.value, MemoryError)
    assert (gpu.live_alloc_count, gpu.live_bytes) == (0, 0)


def test_construction_fault_and_failing_cleanup_free(caplog):
    gpu = HostBackend()
    gpu.inject_fault("memset")
    gpu.inject_fault("free")
    with caplog.at_level(logging.WARNING, logger="metrale"):
        with pytest.raises(MetraleError, match="memset"):   # the original error wins
            new(gpu, m=16)
    assert any("failed construction" in r.getMessage() for r in caplog.records)


def test_real_oom_is_clean():
    gpu = HostBackend()
    s = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0)).replace(o_latent=2 ** 62)
    with pytest.raises(OutOfMemoryError, match=str(2 ** 62)):
        BufferArena.from_sizes(PRESET, s, 1, 0, gpu)
    assert (gpu.live_alloc_count, gpu.live_bytes) == (0, 0)


@pytest.mark.parametrize("args, exc, word", [
    ((PRESET, 0, 4096, 16, 32), ValueError, "max_batch_tokens"),
    ((PRESET, 1, 4096, 16, -1), ValueError, "max_batch_size"),
    ((PRESET, "1", 4096, 16, 32), TypeError, "max_batch_tokens"),
    ((None, 1, 4096, 16, 32), TypeError, "config"),
    ((PRESET, 2 ** 60, 4096, 16, 32), ValueError, "max_batch_tokens"),
])
def test_new_bad_inputs_allocate_nothing(args, exc, word):
    gpu = HostBackend()
    with pytest.raises(exc, match=word):
        BufferArena.new(*args, gpu)
    assert gpu.alloc_count == 0


def test_from_sizes_bad_inputs():
    gpu = HostBackend()
    s = BufferSizes.from_config(PRESET, 4, 4096, 16, 32, env=NOENV)
    with pytest.raises(TypeError, match="sizes"):
        BufferArena.from_sizes(PRESET, s.as_dict(), 4, 32, gpu)
    with pytest.raises(TypeError, match="gpu"):
        BufferArena.from_sizes(PRESET, s, 4, 32, object())
    with pytest.raises(ValueError, match="max_batch_tokens"):
        BufferArena.from_sizes(PRESET, s, 0, 32, gpu)
    with pytest.raises(TypeError):
        BufferArena()
    huge = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 2 ** 63))
    with pytest.raises(ValueError, match="max_batch_tokens"):
        BufferArena.from_sizes(PRESET, huge, 4, 32, gpu)
    assert gpu.alloc_count == 0


def test_info_log(caplog):
    gpu = HostBackend()
    with caplog.at_level(logging.INFO, logger="metrale"):
        with new(gpu, m=128):
            pass
    msg = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO][0]
    assert msg.startswith("Buffer arena: 128 tokens x ") and "kv_lora_rank=0" in msg


# -- views ----------------------------------------------------------------------------------

def test_host_views_zero_copy():
    import numpy as np
    gpu = HostBackend()
    with new(gpu, m=16) as arena:
        v = arena.view("hidden_states", "float32", (16, 1024))
        a = np.asarray(v)
        b = np.from_dlpack(arena.view("hidden_states", np.float32))
        assert a.ctypes.data == arena.hidden_states() == b.ctypes.data
        assert a.shape == (16, 1024) and b.shape == (arena.sizes().hidden_states // 4,)
        a[0, 0] = 3.5
        assert b[0] == 3.5
        bf = arena.view("hidden_states", "bfloat16")
        assert bf.__dlpack_device__() == (1, 0) and bf.shape == (16 * 2048,)
        with pytest.raises(ValueError, match="needs"):
            arena.view("hidden_states", "float32", (17, 1024))
        with pytest.raises(ValueError, match="dtype"):
            arena.view("hidden_states", "complex64")
        with pytest.raises(ValueError, match="unknown buffer"):
            arena.view("nope", "uint8")
        with pytest.raises(AttributeError):
            v.__cuda_array_interface__
        del a, b, v, bf          # views alive at release would make it refuse


def test_core_helper_lists_match_the_spec():
    g = plan_layout(BufferSizes.from_config(PRESET, 8, 4096, 16, 32, env=NOENV), 8).groups
    # zero_all and zero_prefill_essentials are one merged operation each, so only
    # their membership is observable; the checksum's order is its log order.
    assert set(g["zero_all"]) == set(ZERO_ALL) and len(g["zero_all"]) == 18
    assert set(g["prefill"]) == set(PREFILL) and len(g["prefill"]) == 7
    assert g["rows"] == ROWS and g["checksum"] == CHECKSUM


def test_view_shapes_are_checked_when_made():
    import itertools

    import numpy as np
    gpu = HostBackend()
    with new(gpu, m=16) as arena:
        n = arena.sizes().hidden_states
        for shape, exc, word in [
            ((0, 2**63), ValueError, "shape"),                       # past numpy's int64 dims
            ((2**62, 0, 3), ValueError, "more elements than an array can index"),
            ((1,) * 33, ValueError, "more than 32 dimensions"),
            (itertools.repeat(1), ValueError, "more than 32 dimensions"),
            ((2, -1), ValueError, "shape must be >= 0"),
            ((2, True), TypeError, "shape"),
            ((2.0,), TypeError, "shape"),
            ("12", TypeError, "shape"),
            (1.5, TypeError, "shape"),
            ((n + 1,), ValueError, "needs"),
        ]:
            with pytest.raises(exc, match=word):
                arena.view("hidden_states", "uint8", shape)
        assert arena.view("hidden_states", "uint8", (0, 2**63 - 1)).shape == (0, 2**63 - 1)
        assert np.asarray(arena.view("hidden_states", "uint8", (0, 2**63 - 1))).shape == (0, 2**63 - 1)
        assert arena.view("hidden_states", "uint8", (1,) * 32).shape == (1,) * 32
        assert np.asarray(arena.view("hidden_states", "float32", ())).shape == ()
        assert arena.view("hidden_states", "uint8", np.int64(8)).shape == (8,)
        assert arena.view("hidden_states", "uint8", (x for x in (2, 4))).shape == (2, 4)
        with pytest.raises(TypeError, match="name"):
            arena.view(b"hidden_states", "uint8")


def test_objects_are_made_only_by_their_factories():
    from metrale._view import ArenaView
    from metrale._backend import Backend
    from metrale._scratch import ScratchSpace, _Lease, _Region
    for cls in (BufferArena, ArenaView, ScratchSpace, _Lease, _Region):
        with pytest.raises(TypeError):
            cls()
        with pytest.raises(TypeError):
            cls.__new__(cls)
    sizes = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0)).replace(logits=256)
    with pytest.raises(TypeError, match="gpu: Backend does not implement"):
        BufferArena.from_sizes(PRESET, sizes, 1, 0, Backend())
    with pytest.raises(TypeError, match="gpu"):
        BufferArena.new(PRESET, 1, 16, 16, 1, Backend())


def test_clear_ranges_only_in_backend_memory():
    import numpy as np
    gpu = HostBackend()
    other = np.zeros(4096, dtype=np.uint8)
    with new(gpu, m=16) as arena:
        slab_end = arena.hidden_states() + arena.slab_bytes()
        for bad in [(other.ctypes.data // 16 * 16 + 16, 16), (16, 16), (2**64 - 16, 16),
                    (slab_end - 16, 32), (arena.hidden_states(), arena.slab_bytes() + 16)]:
            with pytest.raises(ValueError, match="not inside memory this HostBackend allocated"):
                gpu.clear_ranges([bad])
        gpu.clear_ranges([(slab_end - 16, 16)])
        p = arena.hidden_states()
    with pytest.raises(ValueError, match="not inside"):
        gpu.clear_ranges([(p, 16)])                      # released: no longer the backend's
