"""Property-based tests (hypothesis) of the sizing and of fit: sizes are
never smaller than the formulas and never shrink as max_batch_tokens grows,
and fit finds exactly the largest max_batch_tokens whose arena fits a budget.

Profiles (conftest.py): "ci" is deterministic with a bounded example count;
METRALE_HYPOTHESIS_PROFILE=long runs many more examples locally.
"""

import mmap

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, strategies as st  # noqa: E402

from metrale import (BufferArena, BufferSizes, DebugOptions, HostBackend, ModelConfig,  # noqa: E402
                     Target, fit)

from helpers import COMPACT, PRESET, arena_bytes  # noqa: E402
from reference_oracle import NAMES, NOT_IN_TOTAL  # noqa: E402
from strategies import ARG_ERRORS, _names_argument, int_like  # noqa: E402


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
