"""Property-based tests (hypothesis) of arenas and their calls: construction
with injected faults leaves the backend's live counts at their baseline, carves
are disjoint and inside the slab, zero_all_rows writes exactly the byte model
of ARENA.md §5.2, and views, the FP8 MoE scratch, the row-wise carve, the
scratch space and stream objects either succeed within the contract or raise
TypeError / ValueError / MetraleError naming what was wrong.

Profiles (conftest.py): "ci" is deterministic with a bounded example count;
METRALE_HYPOTHESIS_PROFILE=long runs many more examples locally.
"""

import pytest

hypothesis = pytest.importorskip("hypothesis")
np = pytest.importorskip("numpy")
from hypothesis import given, strategies as st  # noqa: E402

from metrale import (BufferArena, BufferSizes, HostBackend, MetraleError, ModelConfig,  # noqa: E402
                     OutOfMemoryError, ScratchSpaceManager)
from metrale.sizes import BUFFER_NAMES  # noqa: E402
from metrale.testing import FaultyBackend  # noqa: E402

from helpers import (COMPACT, PRESET, AttrStream, Mem, ProtoStream, check_placement,  # noqa: E402
                     expected_rows_length, live_counts, ptr_of)
from reference_oracle import NAMES, ROWS, ZERO_ALL  # noqa: E402
from strategies import ARG_ERRORS, _names_argument, anything, int_like, junk  # noqa: E402


# -- arenas: construction with faults, placement ---------------------------------------------

def small_sizes(max_bytes=20_000):
    """One size per buffer, most small, some 0, a few with awkward remainders."""
    one = st.one_of(st.just(0), st.integers(1, max_bytes), st.sampled_from([256, 255, 257, 4096]))
    return st.lists(one, min_size=len(BUFFER_NAMES), max_size=len(BUFFER_NAMES)).map(
        lambda vs: BufferSizes(**dict(zip(BUFFER_NAMES, vs))))


@given(small_sizes(), st.integers(1, 64), st.sampled_from([None, "alloc", "memset", "sync"]),
       st.integers(1, 3))
def test_arena_construction_with_faults(sizes, m, fault, nth):
    gpu = FaultyBackend()
    base = live_counts(gpu)
    if fault:
        gpu.inject_fault(fault, nth)
    try:
        arena = BufferArena.from_sizes(PRESET, sizes, m, 8, gpu)
    except (OutOfMemoryError, MetraleError):
        assert fault is not None and live_counts(gpu) == base
        return
    check_placement(arena, gpu)                      # never smaller than the sizes asked for
    for name in BUFFER_NAMES:
        assert (ptr_of(arena, name) == 0) == (getattr(sizes, name) == 0), name
    arena.release(gpu)
    assert live_counts(gpu) == base


@given(small_sizes(), st.integers(1, 40), st.integers(0, 60))
def test_zero_all_rows_matches_the_byte_model(sizes, m, tokens):
    """zero_all_rows writes exactly the ranges of ARENA.md §5.2 (the model in
    helpers.expected_rows_length), nothing else, for arbitrary sizes."""
    gpu = HostBackend()
    with BufferArena.from_sizes(PRESET, sizes, m, 8, gpu) as arena:
        mem = Mem(arena, gpu)
        for name in NAMES:
            mem.fill(name, 0xAB)
        arena.zero_all_rows(gpu, 0, tokens)
        for name in NAMES:
            n = getattr(sizes, name)
            if name in ROWS:
                k = expected_rows_length(name, n, m, tokens)
            else:
                k = n if name in ZERO_ALL else 0
            data = mem.read(name)
            assert not data[:k].any() and (data[k:] == 0xAB).all(), name


# -- arena calls --------------------------------------------------------------------------

_HOST = {}


def _shared_arena():
    """One small arena for the call-level properties (built once: they only read)."""
    if "arena" not in _HOST:
        gpu = HostBackend()
        cfg = ModelConfig.preset("qwen3-next-80b")
        s = BufferSizes.from_config(cfg, 16, 512, 16, 32, env={})
        _HOST["gpu"], _HOST["cfg"] = gpu, cfg
        _HOST["arena"] = BufferArena.from_sizes(s, gpu)
    return _HOST["arena"], _HOST["gpu"], _HOST["cfg"]


dtypes = st.one_of(st.sampled_from(["uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
                                    "uint64", "float16", "float32", "float64", "bfloat16", "bf16",
                                    "f32", "torch.float16"]),
                   st.sampled_from([np.float32, np.dtype("int16"), np.uint8]), junk)
shapes = st.one_of(st.none(), int_like, st.lists(int_like, max_size=5).map(tuple),
                   st.lists(st.integers(0, 4), min_size=30, max_size=40).map(tuple), junk)


@given(st.one_of(st.sampled_from(BUFFER_NAMES), st.text(max_size=10), junk), dtypes, shapes)
def test_views(name, dtype, shape):
    arena, gpu, _ = _shared_arena()
    try:
        v = arena.view(name, dtype, shape)
    except ARG_ERRORS + (MetraleError,) as e:
        assert _names_argument(e, "name", "dtype", "shape", "buffer", "NULL", "needs"), e
        return
    n = getattr(arena.sizes(), name)
    assert v.nbytes <= n and v.ptr == ptr_of(arena, name)
    if v.dtype != "bfloat16":
        a = np.asarray(v)
        assert a.nbytes == v.nbytes and a.shape == v.shape
        assert a.ctypes.data == v.ptr or a.size == 0


@given(st.one_of(st.integers(-5, 40), int_like, junk))
def test_moe_fp8_scratch(rows):
    arena, gpu, cfg = _shared_arena()
    try:
        m = arena.moe_fp8_scratch(cfg, rows)
    except ARG_ERRORS + (MetraleError,) as e:
        assert "rows" in str(e), e
        return
    base, cap = m.activation, arena.sizes().moe_fp8_scratch
    for addr in (m.scales, m.worklist, m.total_tiles):
        assert base <= addr < base + cap
    assert m.total_tiles + 4 <= base + cap


@given(st.lists(st.one_of(st.integers(0, 3_000_000), st.sampled_from([0, 1, 2**63, 2**64 - 1]),
                          junk), max_size=12))
def test_rowwise_carve_sequences(requests):
    """Against a model: a cursor that saturates at 2^64 - 1 and never rolls back."""
    gpu = HostBackend()
    slab = 6_291_456
    s = BufferSizes.from_config(COMPACT, 64, 4096, 16, 32, env={}).replace(ssm_rowwise_w_bf16=slab)
    with BufferArena.from_sizes(s, gpu) as arena:
        base = ptr_of(arena, "ssm_rowwise_w_bf16")
        cursor, spans = 0, []
        for n in requests:
            try:
                p = arena.take_ssm_rowwise_w_bf16(n)
            except ARG_ERRORS as e:
                assert "bytes" in str(e)
                continue
            except MetraleError as e:
                assert cursor + n > slab and "exhausted" in str(e)
                cursor = min(cursor + n, 2**64 - 1)
                continue
            assert cursor + n <= slab and p == base + cursor
            spans.append((cursor, cursor + n))
            cursor += n
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


@given(st.one_of(st.integers(-3, 4096), int_like, junk), dtypes)
def test_scratch_get(count, dtype):
    m = ScratchSpaceManager(4096, 1)
    s = m.get_scratch()
    s.get(1, "uint8")
    used = s.used()
    try:
        a = s.get(count, dtype)
    except ARG_ERRORS as e:
        assert _names_argument(e, "count", "dtype"), e
        assert s.used() == used
        return
    if a is None:
        assert s.used() == used
        return
    assert a.ctypes.data % 64 == 0 and not a.view(np.uint8).any()
    assert s.used() >= used and s.remaining() == s.capacity() - s.used()


streams = st.one_of(
    anything,
    st.tuples(anything, anything).map(ProtoStream),
    st.lists(anything, max_size=3).map(lambda x: ProtoStream(tuple(x))),
    anything.map(ProtoStream),
    st.builds(lambda name, value: AttrStream(**{name: value}),
              st.sampled_from(["cuda_stream", "ptr", "__cuda_stream__"]), anything))


@given(streams)
def test_stream_objects(stream):
    arena, gpu, _ = _shared_arena()
    before = gpu.memset_count
    try:
        arena.zero_prefill_essentials(gpu, stream)
    except ARG_ERRORS as e:
        assert "stream" in str(e), e
        assert gpu.memset_count == before
        return
    assert gpu.memset_count == before + 1
