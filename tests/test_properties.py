"""Property-based tests (hypothesis) over every public entry point.

Invariants: a call either succeeds with a result that satisfies the contract
or raises TypeError / ValueError / MetraleError (BufferError where the
lifetime rules say so) naming what was wrong; after any failure the
backend's live counts are back to their baseline; allocations are never
smaller than the formulas; carves are disjoint and inside the slab.

Profiles (conftest.py): "ci" is deterministic with a bounded example count;
METRALE_HYPOTHESIS_PROFILE=long runs many more examples locally.
"""

import contextlib
import io
import json
import os
import tempfile
import warnings

import pytest

hypothesis = pytest.importorskip("hypothesis")
np = pytest.importorskip("numpy")
from hypothesis import assume, given, strategies as st  # noqa: E402

from metrale import (BufferArena, BufferSizes, ConfigWarning, HostBackend,  # noqa: E402
                     MetraleError, ModelConfig, OutOfMemoryError, ScratchSpaceManager, Target)
from metrale.cli import main  # noqa: E402
from metrale.config import FIELDS  # noqa: E402
from metrale.sizes import BUFFER_NAMES  # noqa: E402
from metrale.testing import FaultyBackend  # noqa: E402

from helpers import (COMPACT, PRESET, AttrStream, Mem, ProtoStream, check_placement,  # noqa: E402
                     expected_rows_length, live_counts, ptr_of, vm_counts)
from reference_oracle import NAMES, NOT_IN_TOTAL, ROWS, ZERO_ALL  # noqa: E402

ARG_ERRORS = (TypeError, ValueError)

# -- value strategies -------------------------------------------------------------------------

wide_ints = st.one_of(
    st.integers(0, 5000), st.integers(-2**70, 2**70),
    st.sampled_from([0, 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1]))
int_like = st.one_of(wide_ints, wide_ints.filter(lambda v: -2**63 <= v < 2**63).map(np.int64),
                     st.integers(0, 2**64 - 1).map(np.uint64))
junk = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=8),
                 st.binary(max_size=4), st.lists(st.integers(), max_size=2), st.just(np.float32(1)),
                 st.just(np.True_))
anything = st.one_of(int_like, junk)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
HF_KEYS = sorted(set(FIELDS) | {"n_embd", "n_embed", "n_layer", "n_head", "n_inner",
                                "num_kv_heads", "ffn_hidden_size", "multi_query", "text_config",
                                "n_routed_experts", "num_local_experts", "attn_output_gate",
                                "hybrid_override_pattern", "moe_shared_expert_intermediate_size",
                                "qk_nope_head_dim", "v_head_dim", "n_shared_experts",
                                "layers_block_type", "rope_scaling", "padded_vocab_size",
                                "multi_query_attention", "multi_query_group_num",
                                "mamba_d_state", "max_position_embeddings", "pad_token_id"})
SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
         "intermediate_size": 256}


def _names_argument(e, *names):
    msg = str(e)
    return any(n in msg for n in names)


# -- ModelConfig, presets, from_hf_config -----------------------------------------------------

@given(st.dictionaries(st.sampled_from(FIELDS), anything, max_size=6))
def test_model_config_fields(fields):
    try:
        c = ModelConfig(**fields)
    except ARG_ERRORS as e:
        assert _names_argument(e, *fields), e
        return
    for k, v in fields.items():
        got = getattr(c, k)
        if k in ("attn_gated", "mrope_interleaved", "model_type"):
            assert got == v
        elif k == "layer_types":
            assert got == tuple(v)
        else:
            assert type(got) is int and got == int(v) and 0 <= got < 2**64


@given(st.one_of(st.sampled_from(ModelConfig.presets()), st.text(max_size=12), junk))
def test_presets(name):
    try:
        c = ModelConfig.preset(name)
    except ARG_ERRORS as e:
        assert "name" in str(e) or "preset" in str(e)
        return
    assert isinstance(c, ModelConfig) and name in ModelConfig.presets()


@given(st.dictionaries(st.sampled_from(HF_KEYS), st.one_of(json_values, wide_ints), max_size=8),
       st.booleans())
def test_from_hf_config_dicts(data, with_shape):
    if with_shape:
        data = {**SHAPE, **data}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c = ModelConfig.from_hf_config(data)
    except ARG_ERRORS as e:
        assert str(e).startswith("path_or_dict") or "ModelConfig field" in str(e), e
        return
    assert c.hidden_size == data.get("hidden_size", data.get("n_embd", data.get("n_embed", c.hidden_size)))
    # every warning names a key of the config (or its model_type); strict refuses
    # exactly when something was warned about, naming the same keys
    keys = [w.message.key for w in caught if issubclass(w.category, ConfigWarning)]
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
    assert all(k == "model_type" or k in data or k in text for k in keys), keys
    from metrale.config import _FAMILY_OF
    family = text.get("model_type") if isinstance(text.get("model_type"), str) and \
        text.get("model_type") else data.get("model_type")
    if not isinstance(family, str) or family not in _FAMILY_OF:
        assert "model_type" in keys
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf_config(data, strict=True)
    assert all(repr(k) in str(e.value) for k in keys)


@given(st.one_of(json_values.map(json.dumps),
                 st.dictionaries(st.sampled_from(HF_KEYS), json_values).map(
                     lambda d: json.dumps({**SHAPE, **d})),
                 st.text(max_size=40), st.binary(max_size=40)))
def test_from_hf_config_files(text):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.json")
        with open(path, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        for arg in (path, d):                       # the file, or its directory
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConfigWarning)   # test_hf.py checks them
                    ModelConfig.from_hf_config(arg)
            except ARG_ERRORS as e:
                assert path in str(e) or "ModelConfig field" in str(e), e


@given(st.text(max_size=300))
def test_from_hf_config_path_strings(path):
    try:
        ModelConfig.from_hf_config(path)
    except ARG_ERRORS:
        pass
    except OSError:
        assert not os.path.isfile(path)             # only a path that names no file


# -- sizing ------------------------------------------------------------------------------

configs = st.builds(
    lambda base, h, layers, e: base.replace(hidden_size=h, num_hidden_layers=layers, num_experts=e),
    st.sampled_from([PRESET, COMPACT] + [ModelConfig.preset(n) for n in ModelConfig.presets()]),
    st.integers(0, 8192), st.integers(0, 64), st.sampled_from([0, 8, 128, 256, 512]))
limits = st.tuples(st.one_of(st.integers(1, 4096), int_like), st.one_of(st.integers(0, 65536), int_like),
                   st.one_of(st.integers(0, 64), int_like), st.one_of(st.integers(0, 256), int_like))
levers = st.dictionaries(st.sampled_from(["METRALE_FP8_ROWWISE", "METRALE_GGUF_NATIVE_Q2",
                                          "METRALE_GGUF_NATIVE_Q2_MMQ", "METRALE_ATTN_DECODE_SPLITK"]),
                         st.sampled_from(["1", "0", "auto", "legacy", "16", "", "x"]))


@given(configs, limits, st.one_of(st.none(), st.builds(Target, st.integers(0, 200),
                                                       st.sampled_from(["legacy", "auto", "4"]))),
       levers)
def test_buffer_sizes_from_config(cfg, lim, target, env):
    try:
        s = BufferSizes.from_config(cfg, *lim, target=target, env=env)
    except ARG_ERRORS as e:
        assert _names_argument(e, "max_batch_tokens", "max_seq_len", "kv_block_size",
                               "max_batch_size"), e
        return
    d = s.as_dict()
    assert list(d) == list(NAMES)
    assert all(type(v) is int and 0 <= v < 2**64 for v in d.values())
    assert s.total_bytes() == sum(d.values()) - sum(d[n] for n in NOT_IN_TOTAL)
    assert d["hidden_states"] == 2 * int(lim[0]) * cfg.hidden_size      # one formula, checked


# -- fit: the largest max_batch_tokens in a budget ---------------------------------------------

import mmap  # noqa: E402

from metrale import DebugOptions, fit  # noqa: E402

from helpers import arena_bytes  # noqa: E402

fit_levers = st.dictionaries(st.sampled_from(["METRALE_FP8_ROWWISE", "METRALE_GGUF_NATIVE_Q2",
                                              "METRALE_GGUF_NATIVE_Q2_MMQ",
                                              "METRALE_ATTN_DECODE_SPLITK"]),
                             st.sampled_from(["1", "auto", "legacy", "4", "16"]))
fit_limits = st.tuples(st.integers(1, 65536), st.integers(0, 64), st.integers(0, 256))
# (fit's options, the oracle's): plain, debug, reserved (CUDA's 2 MiB, 64 KiB), both
fit_kinds = st.sampled_from([
    ({}, {}), ({"debug": True}, {"guard": 4096}),
    ({"debug": DebugOptions(256)}, {"guard": 256}),
    ({"reserve": True, "granularity": 2**21}, {"granularity": 2**21}),
    ({"reserve": True, "granularity": 65536}, {"granularity": 65536}),
    ({"reserve": True, "granularity": 65536, "debug": True}, {"granularity": 65536, "guard": 4096}),
])
budgets = st.one_of(st.integers(1, 2**28), st.integers(2**28, 2**38), st.integers(1, 2**44),
                    st.integers(2**44, 2**64 - 1), st.just(2**64 - 1))


def _oracle(cfg, lim, env, tp, arena):
    """The arena's bytes at max_batch_tokens k, from the sizes and the layout's
    contract (helpers.arena_bytes); None where the sizes exceed 2**64 - 1."""
    def at(k):
        try:
            s = BufferSizes.from_config(cfg, k, *lim, env=env, tp_size=tp)
        except ValueError:
            return None
        return arena_bytes(s, **arena)
    return at


@given(st.sampled_from(ModelConfig.presets()), st.sampled_from([1, 2, 4, 8]), fit_levers,
       fit_kinds, fit_limits, budgets, st.one_of(st.none(), st.integers(1, 2**20)))
def test_fit_is_exact(name, tp, env, kind, lim, budget, kv):
    cfg, (opts, arena) = ModelConfig.preset(name), kind
    at = _oracle(cfg, lim, env, tp, arena)
    try:
        smallest = arena_bytes(BufferSizes.from_config(cfg, 1, *lim, env=env, tp_size=tp), **arena)
    except ValueError:                      # a width tp_size does not divide
        with pytest.raises(ValueError, match=f"tp_size = {tp}"):
            fit(cfg, budget, *lim, env=env, tp_size=tp, **opts)
        return
    if budget < smallest:
        with pytest.raises(ValueError, match=f"budget: .*smallest arena.* {smallest:,} bytes"):
            fit(cfg, budget, *lim, env=env, tp_size=tp, **opts)
        return
    r = fit(cfg, budget, *lim, env=env, tp_size=tp, kv_bytes_per_token=kv, **opts)
    m = r.max_batch_tokens
    assert at(m) == r.arena_bytes <= budget
    if r.limited_by == "budget":
        assert at(m + 1) == r.next_arena_bytes > budget
    else:                                   # one more token is past 2**64 - 1 bytes
        assert r.limited_by == "formulas" and r.next_arena_bytes is None
        assert at(m + 1) is None or at(m + 1) > 2**64 - 1
    assert r.evaluations <= 48
    assert r.arena_bytes + r.kv_bytes + r.headroom_bytes == budget
    assert r.left_bytes == budget - r.arena_bytes
    if kv is None:
        assert r.kv_tokens == r.kv_bytes == 0
    else:
        assert r.kv_tokens == (budget - r.arena_bytes) // kv and 0 <= r.headroom_bytes < kv


@given(st.sampled_from(ModelConfig.presets()), st.sampled_from([1, 2, 4, 8]), fit_levers,
       fit_kinds, fit_limits, budgets, st.integers(1, 2**20), st.integers(1, 2**17))
def test_fit_kv_at_a_given_max_batch_tokens(name, tp, env, kind, lim, budget, kv, m):
    cfg, (opts, arena) = ModelConfig.preset(name), kind
    nbytes = _oracle(cfg, lim, env, tp, arena)(m)
    assume(nbytes is not None)              # None: a width tp_size does not divide
    if nbytes > budget:
        with pytest.raises(ValueError, match=f"max_batch_tokens={m} takes {nbytes:,} bytes"):
            fit(cfg, budget, *lim, env=env, tp_size=tp, max_batch_tokens=m,
                kv_bytes_per_token=kv, **opts)
        return
    r = fit(cfg, budget, *lim, env=env, tp_size=tp, max_batch_tokens=m, kv_bytes_per_token=kv,
            **opts)
    assert (r.max_batch_tokens, r.arena_bytes, r.limited_by) == (m, nbytes, "given")
    assert r.kv_tokens * kv + r.headroom_bytes + nbytes == budget
    assert r.kv_bytes == r.kv_tokens * kv and 0 <= r.headroom_bytes < kv


@given(st.sampled_from(ModelConfig.presets()),
       st.sampled_from([({}, {}), ({"debug": True}, {"debug": True}),
                        ({"reserve": True}, {}), ({"reserve": True, "debug": True},
                                                  {"debug": True})]),
       st.dictionaries(st.sampled_from(["METRALE_GGUF_NATIVE_Q2", "METRALE_ATTN_DECODE_SPLITK"]),
                       st.sampled_from(["1", "auto", "4"])),
       st.tuples(st.integers(1, 8192), st.integers(0, 32), st.integers(0, 64)),
       st.integers(0, 16 * 2**20))
def test_fit_allocates_on_the_host(name, kind, env, lim, extra):
    """Small budgets: the arena BufferArena.new builds at the returned M fits,
    the one at M + 1 does not."""
    cfg, gpu, page = ModelConfig.preset(name), HostBackend(), mmap.PAGESIZE
    (opts, debug), reserve = kind, kind[0].get("reserve", False)
    if reserve:
        opts = dict(opts, granularity=page)
    smallest = arena_bytes(BufferSizes.from_config(cfg, 1, *lim, env=env),
                           guard=4096 if debug else 0, granularity=page if reserve else None)
    assume(smallest <= 32 * 2**20)
    budget = smallest + extra
    r = fit(cfg, budget, *lim, env=env, gpu=gpu, **opts)
    for m, nbytes in ((r.max_batch_tokens, r.arena_bytes),
                      (r.max_batch_tokens + 1, r.next_arena_bytes)):
        kw = dict(debug, reserve=(m, *lim)) if reserve else debug
        with BufferArena.new(cfg, m, *lim, gpu, env=env, **kw) as a:
            used = a.committed_bytes() if reserve else a.slab_bytes()
        assert used == nbytes
    assert r.arena_bytes <= budget < r.next_arena_bytes


@given(st.sampled_from(ModelConfig.presets()), st.sampled_from([1, 2, 8]), fit_levers,
       fit_limits, st.one_of(st.integers(1, 4096), st.integers(1, 2**24), st.integers(1, 2**40)))
def test_sizes_never_shrink_as_max_batch_tokens_grows(name, tp, env, lim, m):
    """What makes fit's search exact: each size at M + 1 (and at 2M) is at
    least its size at M, and so is the arena's every kind of layout."""
    cfg = ModelConfig.preset(name)
    try:
        a, b, c = (BufferSizes.from_config(cfg, k, *lim, env=env, tp_size=tp)
                   for k in (m, m + 1, 2 * m))
    except ValueError:
        return                              # a width tp_size does not divide
    assert all(x <= y <= z for x, y, z in zip(a.as_tuple(), b.as_tuple(), c.as_tuple()))
    for kw in ({}, {"guard": 256}, {"granularity": 2**21}, {"granularity": 4096, "guard": 4096}):
        assert arena_bytes(a, **kw) <= arena_bytes(b, **kw) <= arena_bytes(c, **kw)


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
                k = expected_rows_length(n, m, tokens)
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
        _HOST["arena"] = BufferArena.from_sizes(cfg, s, 16, 32, gpu)
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
    with BufferArena.from_sizes(COMPACT, s, 64, 32, gpu) as arena:
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


# -- CLI ------------------------------------------------------------------------------------

flag_values = {
    "--preset": st.one_of(st.sampled_from(ModelConfig.presets()), st.text(max_size=5)),
    "--max-batch-tokens": st.one_of(st.sampled_from(["1", "16", "100", "-1", "0", "x", "",
                                                     str(2**36), str(2**64)])),
    "--max-seq-len": st.sampled_from(["0", "4096", "-3", "1e3", str(2**64)]),
    "--kv-block-size": st.sampled_from(["0", "16", "-1", "z"]),
    "--max-batch-size": st.sampled_from(["0", "32", "200", "-2"]),
    "--sm-count": st.sampled_from(["0", "132", "-1", "x"]),
    "--splitk": st.sampled_from(["legacy", "auto", "1", "16", "17", "", "0"]),
    "--config": st.sampled_from(["/nonexistent/config.json", "", "{}"]),
}
switches = ["--json", "--allocate", "--bogus"]


@given(st.lists(st.one_of(st.sampled_from(sorted(flag_values)).flatmap(
                    lambda f: flag_values[f].map(lambda v: [f, v])),
                st.sampled_from(switches).map(lambda s: [s])), max_size=5),
       st.sampled_from([["plan"], [], ["nope"]]))
def test_cli(parts, head):
    argv = head + [x for p in parts for x in p]
    if "--allocate" in argv:          # keep real allocations small (the default M is 8192)
        mbt = [p[1] for p in parts if p[0] == "--max-batch-tokens"]
        assume(mbt and mbt[-1] in ("1", "16", "100", str(2**36)))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    assert status in (0, 1, 2)
    if status:
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith("metrale: error: "), err.getvalue()
    else:
        assert out.getvalue() and not err.getvalue()


# -- a stateful test over the whole lifetime of a reserved arena -------------------------------
#
# hypothesis drives any sequence of construction, resize, sleep, wake, views,
# step inputs, zeroing, debug operations, injected faults and release.  Each
# call either succeeds or raises one of the exceptions its docstring lists for
# the state the model says the arena is in; the invariants hold after every
# step; after release nothing is reserved, mapped, allocated or open.

from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant,  # noqa: E402
                                 precondition, rule)

TOP = (96, 1024, 16, 16)
SM_NAMES = ("hidden_states", "logits", "scratch", "token_ids", "ssm_qkvz", "norm_unit_w")


def _resources():
    from helpers import process_resources
    fds, _maps, memfds = process_resources()
    return fds, memfds


class ArenaMachine(RuleBasedStateMachine):

    def __init__(self):
        super().__init__()
        self.gpu = FaultyBackend()
        self.base = _resources()
        self.arena = None
        self.views = []
        self.steps = None
        self.step_views = []
        self.step_pending = False       # a release of the step inputs was refused
        self.sleeping = False
        self.released = False
        self.pending = False            # a release was refused: no new view

    @initialize(m=st.sampled_from([1, 16, 40, 96]), debug=st.booleans())
    def build(self, m, debug):
        self.arena = BufferArena.new(COMPACT, m, 512, 16, 8, self.gpu, reserve=TOP, debug=debug)
        self.ptrs = {n: self.arena.buffers[n].ptr for n in BUFFER_NAMES}
        self.m = m
        self.debug = debug

    def _alive(self):
        return not self.released and not self.sleeping

    def _views_alive(self):
        return bool(self.views)

    def _views_shrunk_by(self, m):
        """Whether a live view is of a buffer the limits at `m` shrink (the
        views a resize refuses for; docs/stable-addresses.md)."""
        cur = self.arena.sizes()
        new = BufferSizes.from_config(COMPACT, m, 512, 16, 8, target=self.gpu.target(),
                                      env=cur.levers())
        return any(getattr(new, v.name) < getattr(cur, v.name) for v in self.views)

    # -- reshapes ----------------------------------------------------------------------------
    @rule(m=st.sampled_from([1, 16, 17, 40, 96, 97]),
          fault=st.sampled_from([None, "map", "create", "unmap", "release_handle", "sync"]))
    def resize(self, m, fault):
        shrunk = m <= TOP[0] and not self.released and self._views_shrunk_by(m)
        if fault:
            self.gpu.inject_fault(fault)
        try:
            self.arena.resize(max_batch_tokens=m)
        except BufferError:
            assert shrunk
        except ValueError:
            assert m > TOP[0]
        except OutOfMemoryError:
            assert fault in ("map", "create")
        except MetraleError as e:
            assert self.released or fault is not None, e
            if fault in ("unmap", "release_handle"):     # the new limits hold; the rest later
                self.m = m
        else:
            assert not shrunk and not self.released
            self.m = m
        finally:
            self.gpu.clear_faults()

    @rule(keep=st.lists(st.sampled_from(SM_NAMES), max_size=2),
          fault=st.sampled_from([None, "host_alloc", "copy", "unmap", "release_handle"]))
    def sleep(self, keep, fault):
        if fault:
            self.gpu.inject_fault(fault)
        try:
            self.arena.sleep(keep=keep)
        except BufferError:
            assert self._views_alive()
        except OutOfMemoryError:
            assert fault == "host_alloc" and keep
        except MetraleError as e:
            assert self.released or self.sleeping or fault is not None, e
            self.sleeping = self.arena.is_sleeping()
        else:
            assert not self.sleeping and not self.released
            self.sleeping = True
        finally:
            self.gpu.clear_faults()

    @rule(fault=st.sampled_from([None, "map", "create", "h2d"]))
    def wake(self, fault):
        if fault:
            self.gpu.inject_fault(fault)
        try:
            self.arena.wake()
        except OutOfMemoryError:
            assert fault in ("map", "create")
        except MetraleError as e:
            assert self.released or not self.sleeping or fault is not None, e
        else:
            assert self.sleeping and not self.released
            self.sleeping = False
        finally:
            self.gpu.clear_faults()
        assert self.arena.is_sleeping() == self.sleeping

    # -- views ----------------------------------------------------------------------------
    @rule(name=st.sampled_from(SM_NAMES), dtype=st.sampled_from(["uint8", "float32", "bfloat16"]))
    def view(self, name, dtype):
        try:
            v = self.arena.view(name, dtype)
        except MetraleError as e:
            assert self.released or self.sleeping or self.pending, e
        except ValueError:
            assert self.arena.buffers[name].nbytes % 4 and dtype == "float32"
        else:
            assert self._alive() and not self.pending
            assert v.ptr == self.ptrs[name] and v.nbytes <= self.arena.buffers[name].nbytes
            self.views.append(v)

    @precondition(lambda self: self.views)
    @rule(data=st.data())
    def drop_view(self, data):
        self.views.pop(data.draw(st.integers(0, len(self.views) - 1)))

    # -- step inputs ----------------------------------------------------------------------------
    @precondition(lambda self: self.steps is None)
    @rule()
    def step_inputs(self):
        try:
            self.steps = self.arena.step_inputs()
        except MetraleError:
            assert not self._alive()

    @precondition(lambda self: self.steps is not None)
    @rule(n=st.integers(0, 100), keep_view=st.booleans())
    def step_fill_upload(self, n, keep_view):
        st_ = self.steps
        try:
            st_.fill(np.arange(min(n, st_.max_batch_tokens)), tokens=n)
        except MetraleError as e:
            assert self.step_pending and "pending" in str(e), e
            return
        if keep_view:
            self.step_views.append(st_.positions)
        try:
            st_.upload()
        except MetraleError as e:
            assert not self._alive() or "resized" in str(e), e

    @precondition(lambda self: self.steps is not None)
    @rule(drop_views=st.booleans())
    def step_release(self, drop_views):
        if drop_views:
            self.step_views.clear()
        try:
            self.steps.release()
        except BufferError:
            assert self.step_views
            self.step_pending = True
        else:
            self.steps = None
            self.step_views.clear()
            self.step_pending = False

    # -- operations ----------------------------------------------------------------------------
    @rule(tokens=st.integers(0, 120))
    def zero_all_rows(self, tokens):
        try:
            self.arena.zero_all_rows(tokens=tokens)
        except MetraleError:
            assert not self._alive()
            return
        from helpers import expected_rows_length
        for name in ROWS[:3]:
            n = self.arena.buffers[name].nbytes
            k = expected_rows_length(n, self.m, tokens)
            if k and not self.pending:
                v = self.arena.view(name, "uint8", (k,))
                assert not np.asarray(v).any(), name
                del v

    @rule()
    def zero_all(self):
        try:
            self.arena.zero_all()
        except MetraleError:
            assert not self._alive()
            return
        if not self.pending:
            for name in ZERO_ALL[:4]:
                v = self.arena.view(name, "uint8")
                assert not np.asarray(v).any(), name
                del v

    @rule(op=st.sampled_from(["fingerprint", "poison", "nonfinite"]), tokens=st.integers(0, 100))
    def debug_operation(self, op, tokens):
        try:
            if op == "fingerprint":
                got = self.arena.fingerprint(names=["hidden_states", "logits"])
                assert set(got) == {"hidden_states", "logits"}
            elif op == "poison":
                self.arena.poison_rows(tokens=tokens)
            else:
                self.arena.find_nonfinite(tokens=tokens)
        except MetraleError:
            assert not self._alive()

    # -- release ------------------------------------------------------------------------------
    @rule(fault=st.sampled_from([None, None, "unmap", "release_handle"]))
    def release(self, fault):
        if fault:
            self.gpu.inject_fault(fault)
        try:
            self.arena.release()
        except BufferError:
            assert self._views_alive()
            self.pending = True
        except MetraleError:
            assert fault is not None
            self.released = True
        else:
            assert not self._views_alive() or self.released
            self.released = True
        finally:
            self.gpu.clear_faults()

    # -- invariants ------------------------------------------------------------------------------
    @invariant()
    def pointers_never_move(self):
        if self.arena is None:
            return
        for n in BUFFER_NAMES:
            got = self.arena.buffers[n].ptr
            assert got == (0 if self.released else self.ptrs[n]), n

    @invariant()
    def buffers_are_disjoint_and_inside_the_reservation(self):
        if self.arena is None or self.released:
            return
        spans = sorted((self.ptrs[n], self.ptrs[n] + self.arena.buffers[n].nbytes, n)
                       for n in BUFFER_NAMES if self.ptrs[n] and self.arena.buffers[n].nbytes)
        lo = min(self.ptrs[n] for n in BUFFER_NAMES if self.ptrs[n])
        for (a0, a1, an), (b0, _b1, bn) in zip(spans, spans[1:]):
            assert a1 <= b0, f"{an} overlaps {bn}"
        assert spans[-1][1] - lo <= self.arena.slab_bytes()

    @invariant()
    def mapped_memory_is_what_the_arena_says(self):
        if self.arena is None:
            return
        reserved, mapped, _handles = vm_counts(self.gpu)
        if not self.released:
            assert mapped == self.arena.committed_bytes()
            assert reserved == self.arena.slab_bytes()
            assert self.arena.is_sleeping() == self.sleeping

    @invariant()
    def guard_bands_are_intact(self):
        if self.arena is not None and self.debug and self._alive():
            assert self.arena.check_guards() == []

    def teardown(self):
        if self.arena is None:
            return
        self.views.clear()
        self.step_views.clear()
        if self.steps is not None:
            self.steps.release()
        self.arena.release()            # again, if a fault interrupted it: retried
        self.steps = self.arena = None
        import gc
        gc.collect()
        assert vm_counts(self.gpu) == (0, 0, 0)
        assert self.gpu.live_alloc_count == 0 and self.gpu.live_host_alloc_count == 0
        assert _resources() == self.base


ArenaMachine.TestCase.settings = hypothesis.settings(hypothesis.settings.default,
                                                     stateful_step_count=30)
test_arena_state_machine = ArenaMachine.TestCase
