"""metrale.fit: the largest max_batch_tokens whose arena fits a budget.

The expectations come from outside the module under test: the arena's bytes
from the layout's contract written out in helpers.arena_bytes (itself checked
here against arenas built on the host backend), the C planner
(`plan_layout`), size strings worked out by hand.  The fit of buffer sets
other than REFERENCE is in test_fit_sets.py; the property tests over presets,
levers, tp_size and random budgets are in test_sizing_properties.py."""

import json
import mmap

import pytest

import metrale
from metrale import ArenaFit, BufferArena, DebugOptions, HostBackend, ModelConfig, Target, fit
from metrale._sizing._layout import plan_layout
from metrale.fitting import FREE_MEMORY_MARGIN, growth, growth_span, parse_size

from helpers import FIT_LIMITS as LIMITS
from helpers import GIB, LLAMA, NOENV, SLAB_ORDER, arena_bytes, run, sizes_at


# -- the oracle: the layout's contract against arenas built on the host backend -----------

def test_slab_order_oracle_is_the_planners_order():
    sizes = sizes_at(ModelConfig.preset("qwen3-next-80b"), 64)
    assert plan_layout(sizes).slab_order == SLAB_ORDER


@pytest.mark.parametrize("name", ModelConfig.presets())
def test_arena_bytes_oracle_matches_built_arenas(name):
    cfg, gpu, page = ModelConfig.preset(name), HostBackend(), mmap.PAGESIZE
    for m in (1, 17, 300):
        sizes = sizes_at(cfg, m, (512, 16, 8))
        for debug, guard in ((None, 0), (True, 4096), (DebugOptions(256), 256)):
            with BufferArena.new(cfg, m, 512, 16, 8, gpu, env=NOENV, debug=debug) as a:
                assert a.summary().slab_bytes == arena_bytes(sizes, guard)
            with BufferArena.new(cfg, m, 512, 16, 8, gpu, env=NOENV, debug=debug,
                                 reserve=(m, 512, 16, 8)) as a:
                # reserved at its own limits: every granule of the reservation is mapped
                assert a.committed_bytes() == a.summary().slab_bytes
                assert a.committed_bytes() == arena_bytes(sizes, guard, page)


# -- monotonicity: what makes the search exact ---------------------------------------------

@pytest.mark.parametrize("name", ModelConfig.presets())
def test_every_size_grows_with_max_batch_tokens(name):
    """Each size, and so each arena, is non-decreasing in M: checked for every
    M up to 1,200 (the floors, the caps at 64, 160 and 2,048 rows, the
    16-row tiles) and at powers of two around large M."""
    cfg = ModelConfig.preset(name)
    ms = list(range(1, 1201)) + [k + d for k in (2**14, 2**17, 2**20) for d in (-1, 0, 1)]
    before = None
    for m in ms:
        s = sizes_at(cfg, m)
        if before is not None and before[0] + 1 == m:
            assert all(a <= b for a, b in zip(before[1].as_tuple(), s.as_tuple())), m
            for kw in ({}, {"guard": 4096}, {"granularity": 2**21}):
                assert arena_bytes(before[1], **kw) <= arena_bytes(s, **kw), (m, kw)
        before = (m, s)


# -- exactness, on fixed cases -------------------------------------------------------------

def test_fit_is_exact_against_the_planner():
    for budget in (5 * 2**20, GIB, 12 * GIB, 80 * GIB):
        r = fit(LLAMA, budget, *LIMITS, env=NOENV)
        m = r.max_batch_tokens
        assert r.limited_by == "budget"
        assert plan_layout(sizes_at(LLAMA, m)).slab_bytes == r.arena_bytes <= budget
        assert plan_layout(sizes_at(LLAMA, m + 1)).slab_bytes == r.next_arena_bytes > budget
        assert r.left_bytes == r.headroom_bytes == budget - r.arena_bytes
        assert r.kv_bytes_per_token is None and r.kv_tokens == r.kv_bytes == 0
        assert r.evaluations <= 24


def test_fit_with_levers_target_and_tp():
    cfg, env = ModelConfig.preset("qwen3-next-80b"), {"METRALE_FP8_ROWWISE": "1"}
    target = Target(132, "auto")
    r = fit(cfg, 40 * GIB, *LIMITS, env=env, target=target, tp_size=2)
    m = r.max_batch_tokens
    s = sizes_at(cfg, m, env=env, tp=2, target=target)
    assert s.ssm_rowwise_w_bf16 > 0 and r.tp_size == 2
    assert arena_bytes(s) == r.arena_bytes <= 40 * GIB
    assert arena_bytes(sizes_at(cfg, m + 1, env=env, tp=2, target=target)) > 40 * GIB


def test_fit_debug_and_reserved_arenas():
    for kw, arena in ((dict(debug=True), dict(guard=4096)),
                      (dict(debug=DebugOptions(1024)), dict(guard=1024)),
                      (dict(reserve=True, granularity="2MiB"), dict(granularity=2**21)),
                      (dict(reserve=True, granularity=65536, debug=True),
                       dict(granularity=65536, guard=4096))):
        r = fit(LLAMA, 3 * GIB, *LIMITS, env=NOENV, **kw)
        m = r.max_batch_tokens
        assert arena_bytes(sizes_at(LLAMA, m), **arena) == r.arena_bytes <= 3 * GIB
        assert arena_bytes(sizes_at(LLAMA, m + 1), **arena) == r.next_arena_bytes > 3 * GIB
        assert r.reserved == kw.get("reserve", False)
        assert r.guard_bytes == arena.get("guard", 0)
        assert r.granularity == arena.get("granularity")


def test_fit_on_the_host_backend_allocates_what_it_says():
    gpu = HostBackend()
    cfg = ModelConfig.preset("qwen3-30b-a3b")
    budget = 24 * 2**20
    r = fit(cfg, budget, *LIMITS, env=NOENV, gpu=gpu)
    m = r.max_batch_tokens
    with BufferArena.new(cfg, m, *LIMITS, gpu, env=NOENV) as a:
        assert a.slab_bytes() == r.arena_bytes <= budget
    with BufferArena.new(cfg, m + 1, *LIMITS, gpu, env=NOENV) as a:
        assert a.slab_bytes() == r.next_arena_bytes > budget


def test_the_formulas_limit():
    r = fit(LLAMA, 2**64 - 1, *LIMITS, env=NOENV)
    m = r.max_batch_tokens
    assert r.limited_by == "formulas" and r.next_arena_bytes is None
    assert plan_layout(sizes_at(LLAMA, m)).slab_bytes == r.arena_bytes
    with pytest.raises(ValueError):         # one more token: past 2**64 - 1 bytes
        plan_layout(sizes_at(LLAMA, m + 1))
    assert "formulas allow" in str(r)


def test_budget_of_exactly_the_smallest_arena():
    smallest = plan_layout(sizes_at(LLAMA, 1)).slab_bytes
    r = fit(LLAMA, smallest, *LIMITS, env=NOENV)
    assert r.max_batch_tokens >= 1 and r.arena_bytes <= smallest
    assert plan_layout(sizes_at(LLAMA, r.max_batch_tokens + 1)).slab_bytes > smallest


# -- the KV question ---------------------------------------------------------------------

def test_kv_tokens_in_what_the_arena_leaves():
    k = 2 * 8 * 128 * 2 * 32                     # Llama-3.1-8B, BF16: 128 KiB per token
    r = fit(LLAMA, 64 * GIB, *LIMITS, env=NOENV, max_batch_tokens=8192, kv_bytes_per_token=k)
    slab = plan_layout(sizes_at(LLAMA, 8192)).slab_bytes
    assert (r.limited_by, r.max_batch_tokens, r.arena_bytes) == ("given", 8192, slab)
    assert r.kv_tokens == (64 * GIB - slab) // k and r.kv_bytes == r.kv_tokens * k
    assert r.arena_bytes + r.kv_bytes + r.headroom_bytes == 64 * GIB
    assert 0 <= r.headroom_bytes < k
    assert r.next_arena_bytes is None and r.evaluations == 1
    text = str(r)
    assert "KV cache" in text and f"{r.kv_tokens:,} tokens" in text


def test_kv_beside_the_largest_arena():
    r = fit(LLAMA, 16 * GIB, *LIMITS, env=NOENV, kv_bytes_per_token=4096)
    assert r.arena_bytes + r.kv_bytes + r.headroom_bytes == 16 * GIB
    assert r.kv_tokens == r.left_bytes // 4096


def test_the_torch_pool_is_set_aside_first():
    # The pool is rounded up to the granularity (as open_pool rounds it) and
    # taken from the budget before the arena is searched for.
    g = 2**21
    pool = 3 * g + 1                              # four granules
    r = fit(LLAMA, 6 * GIB, *LIMITS, env=NOENV, reserve=True, granularity=g,
            torch_pool_bytes=pool, kv_bytes_per_token=4096)
    m = r.max_batch_tokens
    assert r.pool_bytes == 4 * g
    assert arena_bytes(sizes_at(LLAMA, m), granularity=g) == r.arena_bytes <= 6 * GIB - 4 * g
    assert arena_bytes(sizes_at(LLAMA, m + 1), granularity=g) == r.next_arena_bytes \
        > 6 * GIB - 4 * g
    assert r.arena_bytes + r.pool_bytes + r.kv_bytes + r.headroom_bytes == 6 * GIB
    assert r.left_bytes == 6 * GIB - 4 * g - r.arena_bytes
    assert "pool:" in str(r) and f"{4 * g:,} bytes" in str(r)
    assert "pool:" not in str(fit(LLAMA, 6 * GIB, *LIMITS, env=NOENV))
    assert fit(LLAMA, 6 * GIB, *LIMITS, env=NOENV).pool_bytes == 0


def test_the_torch_pool_on_the_host_backend_maps_what_fit_says():
    gpu = HostBackend()
    cfg = ModelConfig.preset("qwen3-30b-a3b")
    g = gpu.allocation_granularity()
    budget = 32 * 2**20
    r = fit(cfg, budget, *LIMITS, env=NOENV, gpu=gpu, reserve=True, torch_pool_bytes="5MiB")
    m = r.max_batch_tokens
    with BufferArena.new(cfg, m, *LIMITS, gpu, env=NOENV, reserve=(m, *LIMITS)) as a:
        pool = a.open_pool(5 * 2**20)
        segs = [pool.alloc(g) for _ in range(5 * 2**20 // g)]     # the pool all mapped
        s = a.memory_stats()
        assert s["committed_bytes"] == r.arena_bytes
        assert s["pool_committed_bytes"] == r.pool_bytes == 5 * 2**20
        assert s["committed_bytes"] + s["pool_committed_bytes"] <= budget
        for p in segs:
            pool.free(p)


def test_the_torch_pool_refusals():
    with pytest.raises(ValueError, match="torch_pool_bytes: .*reserve=True"):
        fit(LLAMA, 6 * GIB, *LIMITS, env=NOENV, torch_pool_bytes=2**21)
    with pytest.raises(ValueError, match="torch_pool_bytes: .*leave nothing"):
        fit(LLAMA, 6 * GIB, *LIMITS, env=NOENV, reserve=True, granularity=2**21,
            torch_pool_bytes=6 * GIB)
    with pytest.raises(ValueError, match="torch_pool_bytes"):
        fit(LLAMA, 6 * GIB, *LIMITS, env=NOENV, reserve=True, granularity=2**21,
            torch_pool_bytes=0)
    with pytest.raises(TypeError, match="torch_pool_bytes"):
        fit(LLAMA, 6 * GIB, *LIMITS, env=NOENV, reserve=True, granularity=2**21,
            torch_pool_bytes=1.5)
    with pytest.raises(ValueError, match="less the pool's"):
        fit(LLAMA, 2**23, *LIMITS, env=NOENV, reserve=True, granularity=2**21,
            torch_pool_bytes=2**21)


# -- the free memory of a device -------------------------------------------------------------

class Device(HostBackend):
    """A host backend that reports free memory as a CudaBackend does."""

    def __init__(self, free):
        self.free = free

    def mem_info(self):
        return (self.free, 2 * self.free)


def test_budget_none_is_the_free_memory_less_the_margin():
    gpu = Device(20 * GIB)
    r = fit(LLAMA, None, *LIMITS, env=NOENV, gpu=gpu)
    assert FREE_MEMORY_MARGIN == 64 * 2**20
    assert (r.budget, r.margin_bytes) == (20 * GIB - FREE_MEMORY_MARGIN, FREE_MEMORY_MARGIN)
    same = fit(LLAMA, r.budget, *LIMITS, env=NOENV)
    assert same.max_batch_tokens == r.max_batch_tokens and same.margin_bytes == 0
    r2 = fit(LLAMA, None, *LIMITS, env=NOENV, gpu=gpu, margin="1GiB")
    assert r2.budget == 19 * GIB and r2.margin_bytes == GIB
    assert "free memory less a margin" in str(r)


def test_budget_none_refusals():
    with pytest.raises(TypeError, match="budget=None"):
        fit(LLAMA, None, *LIMITS)
    with pytest.raises(TypeError, match="HostBackend"):
        fit(LLAMA, None, *LIMITS, gpu=HostBackend())
    with pytest.raises(ValueError, match="budget: the device has 1,000 bytes free"):
        fit(LLAMA, None, *LIMITS, gpu=Device(1000))
    with pytest.raises(ValueError, match="margin"):
        fit(LLAMA, GIB, *LIMITS, margin=0)
    with pytest.raises(ValueError, match="margin"):
        fit(LLAMA, None, *LIMITS, gpu=Device(GIB), margin=0)


def test_gpu_sets_the_target():
    class Hopper(HostBackend):
        def target(self):
            return Target(132, "auto")
    cfg = ModelConfig.preset("qwen3-next-80b")
    r = fit(cfg, 8 * GIB, *LIMITS, env=NOENV, gpu=Hopper())
    assert r == fit(cfg, 8 * GIB, *LIMITS, env=NOENV, target=Target(132, "auto"))
    assert r != fit(cfg, 8 * GIB, *LIMITS, env=NOENV)
    with pytest.raises(ValueError, match="target"):
        fit(cfg, GIB, *LIMITS, gpu=Hopper(), target=Target(132, "auto"))
    with pytest.raises(TypeError, match="gpu"):
        fit(cfg, GIB, *LIMITS, gpu="cuda:0")


# -- sizes and bad input ----------------------------------------------------------------------

@pytest.mark.parametrize("text,nbytes", [
    ("12GiB", 12 * 2**30), ("80 GB", 80 * 10**9), ("1.5 TiB", 3 * 2**39), ("1024", 1024),
    ("  3 KiB ", 3072), ("2kB", 2000), ("2KB", 2000), ("7 MB", 7_000_000), ("1 MiB", 2**20),
    ("0.5 KiB", 512), ("1 PiB", 2**50), ("2 PB", 2 * 10**15), ("141GiB", 141 * 2**30),
    ("16B", 16), ("2.25 GB", 2_250_000_000),
])
def test_size_strings(text, nbytes):
    assert parse_size(text, "budget") == nbytes


@pytest.mark.parametrize("text", ["12Gb", "12 gib", "", "GiB", "-1GiB", "0", "0 GiB", "1e9",
                                  "0.5 B", "1.5", "12 GiB extra", "1,000", "12 GiBs", "0x10",
                                  "16384 PiB", "9" * 5000, "9" * 5000 + " GiB", "1." + "0" * 5000,
                                  " " * 5000 + "1"],
                         ids=lambda t: t if len(t) < 20 else f"{t[:6]}..{len(t)}-chars")
def test_size_strings_refused(text):
    # thousands of digits used to reach the interpreter's own limit on
    # converting them: a ValueError that did not name the argument
    with pytest.raises(ValueError, match="^budget[: ]") as e:
        parse_size(text, "budget")
    assert len(str(e.value)) < 400


@pytest.mark.parametrize("value", [1.5, True, None, b"12GiB", [1]])
def test_size_types_refused(value):
    with pytest.raises(TypeError, match="budget"):
        parse_size(value, "budget")


def test_size_ints():
    np = pytest.importorskip("numpy")
    assert parse_size(np.int64(4096), "budget") == 4096
    assert parse_size(2**64 - 1, "budget") == 2**64 - 1
    for bad in (0, -5, 2**64):
        with pytest.raises(ValueError, match="budget"):
            parse_size(bad, "budget")


def test_bad_arguments_are_named():
    smallest = plan_layout(sizes_at(LLAMA, 1)).slab_bytes
    with pytest.raises(ValueError, match=f"budget: .* smallest arena .*{smallest:,} bytes"):
        fit(LLAMA, smallest - 1, *LIMITS, env=NOENV)
    with pytest.raises(ValueError, match="budget"):
        fit(LLAMA, 0, *LIMITS)
    with pytest.raises(ValueError, match="budget"):
        fit(LLAMA, "lots", *LIMITS)
    with pytest.raises(TypeError, match="budget"):
        fit(LLAMA, 1.5e9, *LIMITS)
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        fit(LLAMA, GIB, *LIMITS, kv_bytes_per_token=0)
    with pytest.raises(TypeError, match="kv_bytes_per_token"):
        fit(LLAMA, GIB, *LIMITS, kv_bytes_per_token=1.0)
    with pytest.raises(TypeError, match="buffers"):
        fit(LLAMA, GIB, *LIMITS, buffers=("logits",))
    with pytest.raises(ValueError, match="granularity"):
        fit(LLAMA, GIB, *LIMITS, reserve=True)
    with pytest.raises(ValueError, match="granularity"):
        fit(LLAMA, GIB, *LIMITS, granularity=4096)
    with pytest.raises(ValueError, match="granularity"):
        fit(LLAMA, GIB, *LIMITS, reserve=True, granularity=3000)
    with pytest.raises(ValueError, match="granularity"):
        fit(LLAMA, GIB, *LIMITS, reserve=True, granularity=128)
    with pytest.raises(TypeError, match="reserve"):
        fit(LLAMA, GIB, *LIMITS, reserve=1)
    with pytest.raises(TypeError, match="debug"):
        fit(LLAMA, GIB, *LIMITS, debug="yes")
    with pytest.raises(ValueError, match="max_batch_tokens"):
        fit(LLAMA, GIB, *LIMITS, max_batch_tokens=0)
    with pytest.raises(ValueError, match="max_batch_tokens=8192 takes .* more than the budget"):
        fit(LLAMA, 100 * 2**20, *LIMITS, max_batch_tokens=8192, env=NOENV)
    with pytest.raises(ValueError, match="tp_size"):
        fit(LLAMA, GIB, *LIMITS, tp_size=0)
    with pytest.raises(ValueError, match="tp_size = 3"):
        fit(LLAMA, GIB, *LIMITS, tp_size=3)
    with pytest.raises(ValueError, match="max_seq_len"):
        fit(LLAMA, GIB, -1, 16, 32)
    with pytest.raises(TypeError, match="config"):
        fit("llama", GIB, *LIMITS)


def test_the_record():
    r = fit(LLAMA, "2GiB", *LIMITS, env=NOENV)
    assert isinstance(r, ArenaFit) and metrale.ArenaFit is ArenaFit
    with pytest.raises(AttributeError):
        r.max_batch_tokens = 1
    assert eval(repr(r), {"ArenaFit": ArenaFit}) == r
    assert r.max_seq_len == 4096 and r.kv_block_size == 16 and r.max_batch_size == 32
    assert (r.reserved, r.granularity, r.guard_bytes, r.margin_bytes) == (False, None, 0, 0)


# -- growth ---------------------------------------------------------------------------------

def test_growth_names_the_fastest_growing_buffers():
    m = 4096
    lo, hi = growth_span(m)
    assert (lo, hi) == (2048, 4096) and growth_span(1) == (1, 2) and growth_span(3) == (1, 3)
    a, b = sizes_at(LLAMA, lo), sizes_at(LLAMA, hi)
    rows = growth(LLAMA, m, *LIMITS, env=NOENV)
    names = list(b)                     # every buffer sized, in canonical order
    expect = sorted((n for n in names if b[n] > a[n]), key=lambda n: (a[n] - b[n], names.index(n)))
    assert [r[0] for r in rows] == expect
    assert rows[0] == ("ffn_act_q8", a.ffn_act_q8, b.ffn_act_q8)
    # 4 M ceil256(max(H, I)) + slack: 4 * 14336 bytes per token
    assert (rows[0][2] - rows[0][1]) == 4 * 14336 * (hi - lo)


# -- the command line ----------------------------------------------------------------------

def test_cli_fit(capsys, monkeypatch):
    for name in ("METRALE_FP8_ROWWISE", "METRALE_GGUF_NATIVE_Q2", "METRALE_GGUF_NATIVE_Q2_MMQ",
                 "METRALE_ATTN_DECODE_SPLITK"):
        monkeypatch.delenv(name, raising=False)
    status, out, err = run(capsys, "fit", "--preset", "llama-3.1-8b", "--budget", "12GiB")
    r = fit(LLAMA, 12 * GIB, *LIMITS, env=NOENV)
    assert status == 0 and err == ""
    assert out.startswith("metrale fit: llama-3.1-8b (llama), target=48 SMs/legacy\n")
    assert f"max_batch_tokens: {r.max_batch_tokens:,} (at {r.max_batch_tokens + 1:,}" in out
    assert str(r) in out
    status, out, _ = run(capsys, "fit", "--preset", "llama-3.1-8b", "--gpu-mem", "80GiB",
                         "--weights", "16GB", "--kv-bytes-per-token", "131072",
                         "--max-batch-tokens", "8192", "--json")
    assert status == 0
    got = json.loads(out)
    r = fit(LLAMA, 80 * GIB - 16 * 10**9, *LIMITS, env=NOENV, max_batch_tokens=8192,
            kv_bytes_per_token=131072)
    assert got["fit"] == {n: getattr(r, n) for n in r.__slots__}
    assert got["budget_from"] == {"gpu_mem": 80 * GIB, "weights": 16 * 10**9}
    assert got["levers"] == {} and got["model_type"] == "llama"


def test_cli_fit_options(capsys):
    status, out, _ = run(capsys, "fit", "--preset", "qwen3-next-80b", "--budget", "4GiB",
                         "--tp", "2", "--sm-count", "132", "--reserve", "--debug", "--json")
    got = json.loads(out)["fit"]
    r = fit(ModelConfig.preset("qwen3-next-80b"), 4 * GIB, *LIMITS, tp_size=2,
            target=Target(132, "auto"), reserve=True, granularity=2**21, debug=True)
    assert status == 0 and got == {n: getattr(r, n) for n in r.__slots__}
    status, out, _ = run(capsys, "fit", "--preset", "llama-3.1-8b", "--budget", "8GiB",
                         "--reserve", "--torch-pool", "3GiB")
    r = fit(LLAMA, 8 * GIB, *LIMITS, reserve=True, granularity=2**21, torch_pool_bytes=3 * GIB)
    assert status == 0 and f"max_batch_tokens: {r.max_batch_tokens:,}" in out
    assert f"pool:     {3 * GIB:,} bytes" in out
    status, out, _ = run(capsys, "fit", "--preset", "llama-3.1-8b", "--budget", "1GiB",
                         "--reserve", "--granularity", "64KiB", "--guard-bytes", "512", "--json")
    got = json.loads(out)["fit"]
    assert status == 0 and (got["granularity"], got["guard_bytes"]) == (65536, 512)


def test_cli_fit_explain(capsys):
    status, out, _ = run(capsys, "fit", "--preset", "llama-3.1-8b", "--budget", "12GiB",
                         "--explain")
    m = fit(LLAMA, 12 * GIB, *LIMITS).max_batch_tokens
    lo = m // 2
    a, b = sizes_at(LLAMA, lo, env=None), sizes_at(LLAMA, m, env=None)
    top = max(b, key=lambda n: b[n] - a[n])
    assert status == 0
    assert f"growth from max_batch_tokens={lo:,} to {m:,}" in out
    assert f"dominant: {top} " in out
    arena = (plan_layout(b).slab_bytes - plan_layout(a).slab_bytes) / (m - lo)
    assert f"the arena {arena:,.1f} bytes per token" in out
    status, out, _ = run(capsys, "fit", "--preset", "llama-3.1-8b", "--budget", "12GiB",
                         "--explain", "--json")
    ex = json.loads(out)["explain"]
    assert ex["buffers"][0]["buffer"] == top and ex["from_max_batch_tokens"] == lo


@pytest.mark.parametrize("argv,names", [
    (["--budget", "12Gb"], "--budget"),
    (["--budget", "0"], "--budget"),
    (["--budget", "1MiB"], "smallest arena"),
    (["--gpu-mem", "80GiB", "--weights", "90GiB"], "--weights"),
    (["--gpu-mem", "lots"], "--gpu-mem"),
    (["--budget", "12GiB", "--weights", "1GiB"], "--weights"),
    (["--budget", "12GiB", "--kv-bytes-per-token", "0"], "kv_bytes_per_token"),
    (["--budget", "12GiB", "--granularity", "2MiB"], "--granularity"),
    (["--budget", "12GiB", "--reserve", "--granularity", "3000"], "granularity"),
    (["--budget", "12GiB", "--guard-bytes", "100"], "guard_bytes"),
    (["--budget", "12GiB", "--tp", "3"], "tp_size = 3"),
    (["--budget", "1GiB", "--max-batch-tokens", "65536"], "max_batch_tokens"),
    ([], "--budget"),
    (["--budget", "1GiB", "--gpu-mem", "2GiB"], "--gpu-mem"),
])
def test_cli_fit_errors(capsys, argv, names):
    status, out, err = run(capsys, "fit", "--preset", "llama-3.1-8b", *argv)
    assert status == 2 and out == ""
    assert err.startswith("metrale: error: ") and err.count("\n") == 1 and names in err, err
