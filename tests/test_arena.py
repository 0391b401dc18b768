"""BufferArena on every backend: construction, zeroing sentinels, checksum, the
FP8 MoE scratch, the row-wise carve, release and construction failures."""

import gc
import logging
import threading
import warnings

import pytest

from metrale import (BufferArena, BufferSizes, HostBackend, MetraleError, ModelConfig,
                     OutOfMemoryError)
from metrale._sizing._layout import plan_layout
from metrale.sizes import BUFFER_NAMES
from metrale.testing import FaultyBackend

from helpers import (COMPACT, NOENV, PRESET, AttrStream, Mem, ProtoStream, check_placement,
                     check_zeroed, fill_all, live_counts, new, ptr_of, rows_expectation)
from reference_oracle import (CHECKSUM, COUNT, LIVE_QWEN3_NEXT_M128, NAMES, POINTER, PREFILL,
                              ZERO_ALL)


# -- construction ----------------------------------------------------------------------

def test_arena_sanity_golden(backend):
    gpu = backend
    before = live_counts(gpu)
    arena = BufferArena.new(PRESET, 128, 4096, 16, 32, gpu)
    try:
        assert arena.max_batch_tokens() == 128 and arena.label() == "buffer arena"
        sizes = arena.sizes()
        nonnull = 0
        for name in NAMES:
            p = ptr_of(arena, name)
            assert (getattr(sizes, name) == 0) == (p == 0), name
            nonnull += p != 0
        if type(gpu) is HostBackend:     # the host target is the reference target
            assert nonnull == LIVE_QWEN3_NEXT_M128
        assert sizes.gdn_fla_scratch and sizes.moe_fp8_scratch
        m = Mem(arena, gpu)
        assert not m.read("norm_unit_w").any()
    finally:
        arena.release(gpu)
    assert live_counts(gpu) == before


def test_zero_size_entries_are_null(backend):
    gpu = backend
    s = BufferSizes.from_config(PRESET, 16, 4096, 16, 32, env=NOENV).replace(
        hidden_states=0, logits=0, o_latent=0)
    with BufferArena.from_sizes(s, gpu) as arena:
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
        assert 1 <= gpu.memset_count - before <= len(ZERO_ALL)


def test_zero_all_rows_skips_empty_ranges():
    gpu = FaultyBackend()
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


def test_backend_and_stream_are_optional(backend):
    """The ecosystem form: no backend (the arena's own) and no stream (the
    default one) give the same work as the reference's (gpu, stream) form."""
    gpu = backend
    with new(gpu, m=100) as arena:
        assert arena.backend() is gpu
        m = fill_all(arena, gpu)
        arena.zero_all()
        check_zeroed(arena, m, {n: getattr(arena.sizes(), n) for n in ZERO_ALL})
        m = fill_all(arena, gpu)
        arena.zero_prefill_essentials(stream=None)
        check_zeroed(arena, m, {n: getattr(arena.sizes(), n) for n in PREFILL})
        m = fill_all(arena, gpu)
        arena.zero_all_rows(tokens=5)
        check_zeroed(arena, m, rows_expectation(arena.sizes(), 100, 5))
        m = fill_all(arena, gpu)
        arena.zero_all_rows(None, None, 7)
        check_zeroed(arena, m, rows_expectation(arena.sizes(), 100, 7))
        with pytest.raises(TypeError, match="tokens"):
            arena.zero_all_rows()
        with pytest.raises(MetraleError, match="not the arena's own"):
            arena.zero_all_rows(HostBackend(), tokens=1)
        with pytest.raises(MetraleError, match="not the arena's own"):
            arena.release(HostBackend())
        assert not arena.is_released()
    assert arena.is_released()
    arena.release()                      # idempotent without arguments too


def test_buffers_mapping(backend):
    """arena.buffers: name -> (pointer, bytes, offset) for every buffer, in
    canonical order; pointers agree with the accessors and offsets with the
    slab plan; after release the pointers read 0."""
    from collections.abc import Mapping
    gpu = backend
    arena = new(gpu, m=64)
    b = arena.buffers
    assert isinstance(b, Mapping) and len(b) == COUNT and list(b) == list(NAMES)
    assert "logits" in b and "nope" not in b and 3 not in b and [] not in b
    with pytest.raises(KeyError):
        b["nope"]
    plan = plan_layout(arena.sizes())
    base = arena.hidden_states() - plan.offsets["hidden_states"]
    for name, info in b.items():
        assert info.name == name and info.nbytes == getattr(arena.sizes(), name)
        assert info.ptr == ptr_of(arena, name)
        assert info.offset == plan.offsets[name]
        assert info.ptr == (base + info.offset if info.nbytes else 0)
    assert b.get("nope") is None and dict(b)["scratch"].nbytes == arena.scratch_bytes()
    assert "ptr=0x" in repr(b["logits"])
    arena.release()
    assert b["logits"].ptr == 0 and b["logits"].nbytes == arena.logits_bytes()


def test_summary(backend):
    gpu = backend
    sizes = BufferSizes.from_config(COMPACT, 32, 4096, 16, 32, target=gpu.target(),
                                    env={"METRALE_FP8_ROWWISE": "1"})
    arena = BufferArena.from_sizes(sizes, gpu)
    s = arena.summary()
    plan = plan_layout(sizes)
    assert s.slab_bytes == plan.slab_bytes == arena.slab_bytes()
    assert s.total_bytes == sizes.total_bytes() and s.max_batch_tokens == 32
    assert s.null_buffers == tuple(n for n in NAMES if getattr(sizes, n) == 0)
    assert s.live_buffers == COUNT - len(s.null_buffers)
    assert s.zero_all == plan.zero_all and s.zero_prefill == plan.zero_prefill
    assert set(s.groups["zero_all"]) == set(ZERO_ALL) and set(s.groups["prefill"]) == set(PREFILL)
    assert s.levers == {"METRALE_FP8_ROWWISE": "1"} and not s.released
    text = str(s)
    for part in (f"{s.slab_bytes:,} bytes", "METRALE_FP8_ROWWISE=1", f"{len(ZERO_ALL)} buffers",
                 f"{len(PREFILL)} buffers", type(gpu).__name__):
        assert part in text, part
    arena.release()
    assert arena.summary().released and "(released)" in str(arena.summary())
    assert "released" in repr(arena) and type(gpu).__name__ in repr(arena)


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
        assert len(recs) == len(CHECKSUM)
        assert [r.split()[1] for r in recs] == list(CHECKSUM)
        assert recs[0] == (f"METRALE_BUF_CKSUM[step0] hidden_states bytes={hs} "
                           "sum=-1.000000 ssq=5.000000 sabs=3.000000")
        assert recs[1].endswith("sum=3.000000 ssq=5.000000 sabs=3.000000")
        assert recs[2].endswith("sum=0.000000 ssq=0.000000 sabs=0.000000")
        assert gpu.sync_count - counts[0] == 1 and gpu.d2h_count - counts[1] == 16


def test_checksum_partial_lane_and_failed_copy(caplog):
    gpu = FaultyBackend()
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


# -- row-wise slab --------------------------------------------------------------------------

def _rowwise_arena(gpu, slab):
    s = BufferSizes.from_config(COMPACT, 64, 4096, 16, 32, env=NOENV)
    return BufferArena.from_sizes(s.replace(ssm_rowwise_w_bf16=slab), gpu)


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
    assert all(getattr(arena, n)() == 0 for n in POINTER)
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
    gpu = FaultyBackend()
    arena = new(gpu, m=16)
    gpu.inject_fault("free")
    with pytest.raises(MetraleError, match="HOST_INJECTED_FAULT"):
        arena.release(gpu)
    assert arena.hidden_states() == 0 and arena.is_released()
    assert gpu.live_alloc_count == 1 and arena.committed_bytes() == arena.slab_bytes()
    frees = gpu.free_count
    arena.release(gpu)                                # a second call frees what is left
    assert gpu.free_count == frees + 1 and gpu.live_alloc_count == 0
    arena.release(gpu)                                # and a third does nothing
    assert gpu.free_count == frees + 1 and arena.committed_bytes() == 0


def test_a_release_whose_free_failed_is_finished_by_the_finalizer():
    gpu = FaultyBackend()
    arena = new(gpu, m=16)
    gpu.inject_fault("free")
    with pytest.raises(MetraleError, match="HOST_INJECTED_FAULT"):
        arena.release(gpu)
    del arena
    gc.collect()
    assert gpu.live_alloc_count == 0


def test_context_manager_and_label():
    gpu = HostBackend()
    with new(gpu, m=4) as arena:
        assert gpu.live_alloc_count == 1
    assert gpu.live_alloc_count == 0 and arena.hidden_states() == 0


def test_finalizer_frees_and_warns():
    gpu = FaultyBackend()
    arena = new(gpu, m=4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        del arena
        gc.collect()
    assert gpu.live_alloc_count == 0 and gpu.live_bytes == 0
    assert any(issubclass(x.category, ResourceWarning) and "buffer arena" in str(x.message) for x in w)


@pytest.mark.parametrize("op", ["alloc", "memset", "sync"])
def test_construction_fault_leaves_nothing(op):
    gpu = FaultyBackend()
    gpu.inject_fault(op)
    exc = OutOfMemoryError if op == "alloc" else MetraleError
    with pytest.raises(exc) as info:
        new(gpu, m=16)
    if op == "alloc":
        slab = plan_layout(BufferSizes.from_config(PRESET, 16, 4096, 16, 32, env=NOENV)).slab_bytes
        assert "slab" in str(info.value) and str(slab) in str(info.value)
        assert isinstance(info.value, MemoryError)
    assert (gpu.live_alloc_count, gpu.live_bytes) == (0, 0)


def test_construction_fault_and_failing_cleanup_free(caplog):
    gpu = FaultyBackend()
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
    # the reference's positional form: checked as the short one
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


def test_the_reference_calls_never_warn():
    """The reference engine's constructors, called as its port calls them, with
    sizes from from_config and sizes built by hand: no warning of any kind
    (the reference API is the contract; the short form sits beside it)."""
    gpu = HostBackend()
    s = BufferSizes.from_config(PRESET, 64, 4096, 16, 32, env=NOENV)
    by_hand = BufferSizes(**s.as_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with BufferArena.new(PRESET, 64, 4096, 16, 32, gpu) as a, \
                BufferArena.from_sizes(PRESET, s, 64, 32, gpu) as b, \
                BufferArena.from_sizes(PRESET, by_hand, 64, 32, gpu) as c, \
                BufferArena.from_sizes(s, gpu) as d:
            assert b.sizes() == c.sizes() == d.sizes() == s and a.max_batch_tokens() == 64
            assert b.max_batch_tokens() == c.max_batch_tokens() == 64
            b.zero_all(gpu, 0)
            b.release(gpu)
    assert gpu.live_alloc_count == 0


def test_info_log(caplog):
    gpu = HostBackend()
    with caplog.at_level(logging.INFO, logger="metrale"):
        with new(gpu, m=128):
            pass
    msg = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO][0]
    slab = plan_layout(BufferSizes.from_config(PRESET, 128, 4096, 16, 32, env=NOENV)).slab_bytes
    assert msg.startswith(f"buffer arena for max_batch_tokens=128: {slab / 2**20:.1f} MiB in "
                          "one slab (total_bytes() ") and "kv_lora_rank 0)" in msg


# -- views ----------------------------------------------------------------------------------




# -- limits: derived from the sizes, never silently disagreeing ----------------------------

def test_from_sizes_refuses_limits_the_sizes_were_not_computed_for():
    """Sizes for M = 512 with max_batch_tokens = 1024 would make
    zero_all_rows(tokens=10) leave rows 5..9 of every row-trimmed buffer: the
    sizes record their limits, so a disagreement is refused, naming both."""
    gpu = HostBackend()
    s = BufferSizes.from_config(PRESET, 512, 4096, 16, 32, env=NOENV)
    # the limits can only be given in the reference's form
    with pytest.raises(ValueError, match="max_batch_tokens=1024 .*max_batch_tokens=512"):
        BufferArena.from_sizes(PRESET, s, 1024, 32, gpu)
    with pytest.raises(ValueError, match="max_batch_size=8 .*max_batch_size=32"):
        BufferArena.from_sizes(PRESET, s, 512, 8, gpu)
    assert gpu.alloc_count == 0
    a = BufferArena.from_sizes(PRESET, s, None, None, gpu)
    with a:
        assert (a.max_batch_tokens(), a.max_seq_len(), a.kv_block_size(), a.max_batch_size(),
                a.tp_size()) == (512, 4096, 16, 32, 1)
    by_hand = BufferSizes(**s.as_dict())                # records no limits
    for mbt, mbs, name in ((None, 32, "max_batch_tokens"), (512, None, "max_batch_size")):
        with pytest.raises(TypeError, match=f"{name} is required"):
            BufferArena.from_sizes(PRESET, by_hand, mbt, mbs, gpu)
    with BufferArena.from_sizes(PRESET, by_hand, 512, 32, gpu) as a:
        assert a.max_seq_len() is None and a.kv_block_size() is None and a.max_batch_size() == 32
        assert "max_seq_len=None" in str(a.summary())
    assert gpu.live_alloc_count == 0


def test_limit_accessors_and_summary():
    gpu = HostBackend()
    with BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, env=NOENV) as a:
        assert (a.max_batch_tokens(), a.max_seq_len(), a.kv_block_size(), a.max_batch_size(),
                a.tp_size()) == (64, 512, 16, 8, 1)
        s = a.summary()
        assert (s.max_batch_tokens, s.max_seq_len, s.kv_block_size, s.max_batch_size,
                s.tp_size) == (64, 512, 16, 8, 1)
        assert "max_batch_tokens=64, max_seq_len=512, kv_block_size=16, max_batch_size=8" in str(s)


def test_new_reads_the_levers_where_it_is_told(monkeypatch):
    """env= isolates an arena from the process environment, as it does sizes."""
    monkeypatch.setenv("METRALE_FP8_ROWWISE", "1")
    gpu = HostBackend()
    lever_on = BufferSizes.from_config(PRESET, 64, 4096, 16, 32, env={"METRALE_FP8_ROWWISE": "1"})
    assert lever_on.ssm_rowwise_w_bf16 > 0
    with BufferArena.new(PRESET, 64, 4096, 16, 32, gpu, env={}) as a:
        assert a.buffers["ssm_rowwise_w_bf16"].nbytes == 0 and a.sizes().levers() == {}
    with BufferArena.new(PRESET, 64, 4096, 16, 32, gpu) as a:           # os.environ
        assert a.sizes() == lever_on
    with BufferArena.new(PRESET, 64, 4096, 16, 32, gpu, env={"METRALE_FP8_ROWWISE": "1"},
                         reserve=(128, 4096, 16, 32)) as a:
        assert a.sizes() == lever_on
        a.resize(max_batch_tokens=128)                  # re-sized with the same levers
        assert a.sizes().ssm_rowwise_w_bf16 == lever_on.ssm_rowwise_w_bf16
    with pytest.raises(TypeError, match="env"):
        BufferArena.new(PRESET, 64, 4096, 16, 32, gpu, env=5)


def test_new_sizes_one_rank_with_tp_size():
    """tp_size= sizes what one rank holds (the sharding is tests/test_shard.py's
    to check against hand-divided configs); the arena keeps it through resize."""
    gpu = HostBackend()
    cfg = ModelConfig.preset("llama-3.1-8b")
    per_rank = BufferSizes.from_config(cfg.shard(2), 64, 4096, 16, 32, env=NOENV)
    with BufferArena.new(cfg, 64, 4096, 16, 32, gpu, tp_size=2, env=NOENV,
                         reserve=(128, 4096, 16, 32)) as a:
        assert a.sizes() == per_rank and a.tp_size() == 2 and a.sizes().limits.tp_size == 2
        assert a.summary().tp_size == 2 and "tp_size=2" in str(a.summary())
        assert a.view("logits").shape[1] == cfg.vocab_size // 2
        a.resize(max_batch_tokens=128)
        assert a.sizes() == BufferSizes.from_config(cfg, 128, 4096, 16, 32, env=NOENV, tp_size=2)
        assert a.sizes().limits.tp_size == 2
        with pytest.raises(ValueError, match="tp_size"):
            a.resize(sizes=BufferSizes.from_config(cfg, 64, 4096, 16, 32, env=NOENV))
    with pytest.raises(ValueError, match="num_attention_heads"):
        BufferArena.new(cfg, 64, 4096, 16, 32, gpu, tp_size=3, env=NOENV)
    assert gpu.live_alloc_count == 0 and gpu.reserved_bytes == 0


def test_view_without_a_dtype_is_the_buffers_own_type_and_shape():
    """The element type and shape docs/buffers.md gives each buffer, written
    out here for the preset (H = 2048, M = 64): a dtype or shape given
    overrides; a buffer of raw bytes needs a dtype."""
    np = pytest.importorskip("numpy")
    gpu = HostBackend()
    with BufferArena.new(PRESET, 64, 4096, 16, 32, gpu, env=NOENV) as a:
        v = a.view("hidden_states")
        assert (v.dtype, v.shape, v.nbytes) == ("bfloat16", (64, 2048), 2 * 64 * 2048)
        v = a.view("token_ids")
        assert (v.dtype, v.shape) == ("uint32", (64,))
        v = a.view("gate_logits_f32")                   # [M, E + Ez] float32, 512 experts
        assert (v.dtype, v.shape) == ("float32", (64, 512))
        v = a.view("logits")                            # [min(M, max(160, R + 1)), V]
        assert (v.dtype, v.shape) == ("bfloat16", (64, 151936))
        assert a.view("hidden_states", "uint8").shape == (2 * 64 * 2048,)
        assert a.view("hidden_states", shape=(2, 2048)).dtype == "bfloat16"
        with pytest.raises(TypeError, match="scratch .*give a dtype"):
            a.view("scratch")
        width = {"bfloat16": 2, "float32": 4, "int32": 4, "uint32": 4, "int8": 1,
                 "float8_e4m3fn": 1}
        for name, info in a.buffers.items():            # every typed buffer fits its shape
            if info.dtype is not None and info.nbytes:
                w = a.view(name)
                assert w.dtype == info.dtype, name
                assert w.nbytes == int(np.prod(w.shape)) * width[w.dtype] <= info.nbytes, name
        del v, w


def test_buffers_lookups_follow_the_arena():
    gpu = HostBackend()
    a = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, env=NOENV, reserve=(128, 512, 16, 8))
    b = a.buffers
    n64 = b["hidden_states"].nbytes
    a.resize(max_batch_tokens=128)
    assert a.buffers["hidden_states"].nbytes == b["hidden_states"].nbytes == 2 * n64
    assert dict(b) == dict(a.buffers) and b == a.buffers and len(b) == COUNT
    assert b.get("nope") is None and "nope" not in b and b.get("logits").name == "logits"
    with pytest.raises(KeyError):
        b[["unhashable"]]
    a.release()
    assert b["hidden_states"].ptr == 0


# -- the memory ledger (issue 24): memory_stats and metrale.stats -------------------------

def test_memory_stats_follow_the_backend():
    """Every counter against the backend's own (HostBackend counts what it
    maps, reserves and holds) through construction, growth, sleep and wake."""
    import metrale
    gpu = HostBackend()
    plain = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, env=NOENV)
    m = plain.memory_stats()
    assert m["slab_bytes"] == m["committed_bytes"] == m["peak_committed_bytes"] == gpu.live_bytes
    assert m["reserved_bytes"] == m["physical_handles"] == m["kept_bytes"] == 0
    assert m["buffer_bytes"] == plain.sizes().as_dict()
    assert (m["reserved"], m["sleeping"], m["released"], m["max_batch_tokens"],
            m["tp_size"]) == (False, False, False, 64, 1)
    v = plain.view("hidden_states")
    assert plain.memory_stats()["live_views"] == 1
    del v
    a = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, env=NOENV, reserve=(512, 1024, 16, 16))
    m0 = a.memory_stats()
    assert m0["reserved_bytes"] == m0["slab_bytes"] == gpu.reserved_bytes
    assert m0["committed_bytes"] == gpu.mapped_bytes and m0["physical_handles"] == gpu.handle_count
    a.resize(*(512, 1024, 16, 16))
    m1 = a.memory_stats()
    assert m1["committed_bytes"] == gpu.mapped_bytes > m0["committed_bytes"]
    assert m1["peak_committed_bytes"] == m1["committed_bytes"]
    a.resize(64, 512, 16, 8)
    a.sleep(keep=("hidden_states",))
    m2 = a.memory_stats()
    assert m2["committed_bytes"] == gpu.mapped_bytes == 0 and m2["sleeping"]
    assert m2["kept_bytes"] == a.sizes().hidden_states and m2["peak_committed_bytes"] == \
        m1["peak_committed_bytes"]
    s = metrale.stats()
    assert s["arenas"] >= 2 and s["sleeping"] >= 1
    a.wake()
    assert a.memory_stats()["committed_bytes"] == gpu.mapped_bytes
    before = metrale.stats()
    plain.release()
    after = metrale.stats()
    assert after["arenas"] == before["arenas"] - 1
    assert after["slab_bytes"] == before["slab_bytes"] - m["slab_bytes"]
    assert plain.memory_stats()["released"] and plain.memory_stats()["committed_bytes"] == 0
    a.release()
    m3 = a.memory_stats()
    assert m3["released"] and m3["reserved_bytes"] == gpu.reserved_bytes == 0     # freed
    assert m3["slab_bytes"] == m0["slab_bytes"]


def test_checksum_records_at_the_level_asked(caplog):
    gpu = HostBackend()
    with new(gpu, m=16) as arena:
        with caplog.at_level(logging.DEBUG, logger="metrale"):
            arena.debug_buffer_checksum(tag="d", level=logging.DEBUG)
            arena.debug_buffer_checksum(tag="w")
        levels = {r.getMessage().split("]")[0]: r.levelno for r in caplog.records
                  if r.getMessage().startswith("METRALE_BUF_CKSUM")}
        assert levels == {"METRALE_BUF_CKSUM[d": logging.DEBUG, "METRALE_BUF_CKSUM[w": logging.WARNING}
        for bad, exc in ((True, TypeError), ("DEBUG", TypeError), (-1, ValueError)):
            with pytest.raises(exc, match="level"):
                arena.debug_buffer_checksum(level=bad)
