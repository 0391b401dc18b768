"""metrale.fit: the largest max_batch_tokens whose arena fits a budget.

The expectations come from outside the module under test: the arena's bytes
from the layout's contract written out in helpers.arena_bytes (itself checked
here against arenas built on the host backend), the C planner
(`plan_layout`), size strings worked out by hand.  The property tests over
presets, levers, tp_size and random budgets are in test_sizing_properties.py."""

import json
import mmap

import pytest

import metrale
from metrale import (ArenaFit, BufferArena, BufferSizes, DebugOptions, HostBackend, ModelConfig,
                     Target, fit)
from metrale._layout import plan_layout
from metrale.cli import main
from metrale.fitting import FREE_MEMORY_MARGIN, growth, growth_span, parse_size

from helpers import NOENV, SLAB_ORDER, arena_bytes, spec_part

LLAMA = ModelConfig.preset("llama-3.1-8b")
LIMITS = (4096, 16, 32)
GIB = 2**30


def sizes_at(cfg, m, lim=LIMITS, env=NOENV, tp=1, target=None):
    return BufferSizes.from_config(cfg, m, *lim, env=env, tp_size=tp, target=target)


# -- the oracle: the layout's contract against arenas built on the host backend -----------

def test_slab_order_oracle_is_the_planners_order():
    sizes = sizes_at(ModelConfig.preset("qwen3-next-80b"), 64)
    assert plan_layout(sizes, 64).slab_order == SLAB_ORDER


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
        assert plan_layout(sizes_at(LLAMA, m), m).slab_bytes == r.arena_bytes <= budget
        assert plan_layout(sizes_at(LLAMA, m + 1), m + 1).slab_bytes == r.next_arena_bytes > budget
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
    assert plan_layout(sizes_at(LLAMA, m), m).slab_bytes == r.arena_bytes
    with pytest.raises(ValueError):         # one more token: past 2**64 - 1 bytes
        plan_layout(sizes_at(LLAMA, m + 1), m + 1)
    assert "formulas allow" in str(r)


def test_budget_of_exactly_the_smallest_arena():
    smallest = plan_layout(sizes_at(LLAMA, 1), 1).slab_bytes
    r = fit(LLAMA, smallest, *LIMITS, env=NOENV)
    assert r.max_batch_tokens >= 1 and r.arena_bytes <= smallest
    assert plan_layout(sizes_at(LLAMA, r.max_batch_tokens + 1), r.max_batch_tokens + 1) \
        .slab_bytes > smallest


# -- the KV question ---------------------------------------------------------------------

def test_kv_tokens_in_what_the_arena_leaves():
    k = 2 * 8 * 128 * 2 * 32                     # Llama-3.1-8B, BF16: 128 KiB per token
    r = fit(LLAMA, 64 * GIB, *LIMITS, env=NOENV, max_batch_tokens=8192, kv_bytes_per_token=k)
    slab = plan_layout(sizes_at(LLAMA, 8192), 8192).slab_bytes
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
    smallest = plan_layout(sizes_at(LLAMA, 1), 1).slab_bytes
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

def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


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
    arena = (plan_layout(b, m).slab_bytes - plan_layout(a, lo).slab_bytes) / (m - lo)
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


# -- buffer sets (issue 23) --------------------------------------------------------------------
#
# The oracle below is the layout's contract for any set, written out from
# docs/buffer-sets.md ("Where the buffers go"), independently of layout.c: the
# slab places token_ids, scratch, the prefill buffers, the other row-trimmed
# ones, the rest of zero_all, then everything else, each part in the set's
# order; each live buffer starts at the next multiple of its spec's `align`
# and ends padded to 256 bytes (plus a debug arena's guard).  A reserved arena
# (reserved at its own limits) ends each sub-range on a granule instead
# (token_ids on 256 bytes: scratch shares its granule) and maps the granules
# its live buffers touch.

def _up(x, g):
    return -(-x // g) * g


def set_order(buffers):
    specs = list(buffers)
    return sorted(specs, key=lambda s: (spec_part(s), specs.index(s)))


def set_arena_bytes(sizes, guard=0, granularity=None):
    """Device bytes of an arena of `sizes` (any set), from the contract above."""
    cur, touched, most = 0, [], 256
    for spec in set_order(sizes.buffers):
        n = sizes[spec.name]
        if n == 0:
            continue
        most = max(most, spec.align)
        start = _up(cur, spec.align)
        if granularity is None:
            cur = _up(start + n, 256) + guard
            continue
        span = n if not guard else _up(n, 256) + guard
        end = _up(start + span, 256 if spec_part(spec) == 0 else granularity)
        need = end - start if spec_part(spec) == 0 else span
        touched.append((start // granularity * granularity, _up(start + need, granularity)))
        cur = end
    if granularity is None:
        # an allocation is aligned to 256 bytes only: room to move the base up
        # to the largest alignment a placed buffer asks for
        return cur + most - 256 if cur else 0
    total, last = 0, 0            # the union of the granules touched, in slab order
    for lo, hi in touched:
        lo = max(lo, last)
        if hi > lo:
            total += hi - lo
        last = max(last, hi)
    return total


def _random_set(rng, i):
    """A set of the sort an engine declares: some reference buffers dropped,
    new ones with shapes, formulas, helpers and alignments up to 2**30."""
    base = metrale.REFERENCE if i % 3 else metrale.BufferSet()
    keep = [n for n in base.names if rng.random() < 0.8 or n in ("token_ids", "scratch")]
    specs = [base[n] for n in keep]
    zero_all = sum(s.zero_all for s in specs)
    shapes = [["M", "H"], ["Mp", "V"], ["max_batch_size", "vocab_size"], ["M", 3, "Hq"],
              ["max_batch_tokens", "hidden_size"], [rng.randrange(1, 5000)], ["M"]]
    sizes = ["max(33554432, 256 * M)", "cdiv(M, 7) * H", "ceil256(M * 3) + 5", "M * M",
             "4096", "H // cdiv(8192, M)", "2*Lr*V", "max(0, 4096 - H) * M"]
    for j in range(rng.randrange(1, 12)):
        align = rng.choice([256, 256, 512, 4096, 65536, 2**21, 2**24, 2**30])
        z = zero_all < 30 and rng.random() < 0.5
        zero_all += z
        if rng.random() < 0.6:
            shape = rng.choice(shapes)
            rows = rng.choice(["whole", "M", "Mp", "auto"]) if z and shape[0] in (
                "M", "Mp", "max_batch_tokens") else "whole"
            if rows == "Mp" and shape[0] != "Mp":
                rows = "auto"
            specs.append(metrale.BufferSpec(f"own{j}", rng.choice(["bfloat16", "float32", "int8"]),
                                            shape, zero_all=z, rows=rows, align=align,
                                            prefill=z and rng.random() < 0.3))
        else:
            specs.append(metrale.BufferSpec(f"own{j}", size=rng.choice(sizes), zero_all=z,
                                            align=align))
    # (the step inputs' buffers stay at 256: a set refuses another alignment for them)
    specs = [s if rng.random() < 0.9 or s.name in ("token_ids", "scratch")
             else s.replace(align=rng.choice([512, 8192, 2**20])) for s in specs]
    rng.shuffle(specs)
    return metrale.BufferSet(specs)


SETS = [_random_set(__import__("random").Random(23 * 1000 + i), i) for i in range(24)]


def set_sizes(cfg, m, buffers, lim=LIMITS, **kw):
    return BufferSizes.from_config(cfg, m, *lim, env=NOENV, buffers=buffers, **kw)


def test_set_oracle_matches_the_planner_and_built_arenas():
    """The contract above against plan_layout / plan_reserved and against
    arenas built on the host backend, for every random set."""
    from metrale._layout import plan_reserved
    gpu, page = HostBackend(), mmap.PAGESIZE
    cfg = ModelConfig.preset("qwen3-30b-a3b")
    for buffers in SETS:
        for m in (1, 37, 300):
            sizes = set_sizes(cfg, m, buffers, (512, 16, 8))
            for guard in (0, 4096):
                assert plan_layout(sizes, m, guard_bytes=guard).slab_bytes == \
                    set_arena_bytes(sizes, guard)
                for gran in (page, 2**21):
                    assert plan_reserved(sizes, sizes, m, gran, guard_bytes=guard) \
                        .committed_bytes == set_arena_bytes(sizes, guard, gran), (m, gran)
        if max(s.align for s in buffers) <= 2**21:     # keep the host's memory small
            with BufferArena.new(cfg, 37, 512, 16, 8, gpu, env=NOENV, buffers=buffers) as a:
                assert a.slab_bytes() == gpu.live_bytes == \
                    set_arena_bytes(set_sizes(cfg, 37, buffers, (512, 16, 8)))
            with BufferArena.new(cfg, 37, 512, 16, 8, gpu, env=NOENV, buffers=buffers,
                                 reserve=(37, 512, 16, 8)) as a:
                assert a.committed_bytes() == gpu.mapped_bytes == \
                    set_arena_bytes(set_sizes(cfg, 37, buffers, (512, 16, 8)), 0, page)


def test_random_sets_grow_with_max_batch_tokens():
    """What makes the search exact, for the sets the fit tests use: every
    size non-decreasing in M, so every arena is too."""
    cfg = ModelConfig.preset("llama-3.1-8b")
    for buffers in SETS[:8]:
        before = None
        for m in list(range(1, 400)) + [4095, 4096, 4097]:
            s = set_sizes(cfg, m, buffers)
            if before is not None and before[0] + 1 == m:
                assert all(a <= b for a, b in zip(before[1].as_tuple(), s.as_tuple())), m
            before = (m, s)


@pytest.mark.parametrize("i", range(len(SETS)))
def test_fit_of_a_set_is_exact(i):
    import random
    buffers, rng = SETS[i], random.Random(i)
    cfg = ModelConfig.preset(("llama-3.1-8b", "qwen3-next-80b", "gemma-4-dense")[i % 3])
    smallest = set_arena_bytes(set_sizes(cfg, 1, buffers))
    kinds = [({}, 0, None), (dict(debug=True), 4096, None),
             (dict(reserve=True, granularity=2**21), 0, 2**21),
             (dict(reserve=True, granularity=65536, debug=DebugOptions(512)), 512, 65536)]
    for kind, guard, gran in kinds:
        for budget in (smallest + rng.randrange(1, 2**30), rng.randrange(2**30, 2**40)):
            try:
                r = fit(cfg, budget, *LIMITS, env=NOENV, buffers=buffers, **kind)
            except ValueError as e:             # only a debug/reserved smallest arena
                assert "smallest arena" in str(e) and kind
                continue
            m = r.max_batch_tokens
            assert r.limited_by == "budget"
            assert set_arena_bytes(set_sizes(cfg, m, buffers), guard, gran) == r.arena_bytes \
                <= budget, (kind, budget)
            assert set_arena_bytes(set_sizes(cfg, m + 1, buffers), guard, gran) == \
                r.next_arena_bytes > budget
            # logarithmic, but more than the reference's (at most 34): a large
            # alignment makes the arena grow in big steps that a line predicts badly
            assert r.evaluations <= 128


def test_fit_of_a_set_on_the_host_backend_allocates_what_it_says():
    gpu = HostBackend()
    cfg = ModelConfig.preset("llama-3.1-8b")
    buffers = metrale.REFERENCE.without(["ffn_act_q8", "fp8_act", "ffn_act_a"]).with_([
        metrale.BufferSpec("staging", "bfloat16", ["M", "H"], zero_all=True, rows="M",
                           align=65536),
        metrale.BufferSpec("sampler", "float32", ["max_batch_size", "V"], align=4096)])
    budget = 40 * 2**20
    r = fit(cfg, budget, *LIMITS, env=NOENV, gpu=gpu, buffers=buffers)
    m = r.max_batch_tokens
    with BufferArena.new(cfg, m, *LIMITS, gpu, env=NOENV, buffers=buffers) as a:
        assert a.slab_bytes() == gpu.live_bytes == r.arena_bytes <= budget
    with BufferArena.new(cfg, m + 1, *LIMITS, gpu, env=NOENV, buffers=buffers) as a:
        assert a.slab_bytes() == r.next_arena_bytes > budget
    page = gpu.allocation_granularity()
    r = fit(cfg, budget, *LIMITS, env=NOENV, gpu=gpu, buffers=buffers, reserve=True)
    m = r.max_batch_tokens
    assert r.granularity == page
    with BufferArena.new(cfg, m, *LIMITS, gpu, env=NOENV, buffers=buffers,
                         reserve=(m, *LIMITS)) as a:
        assert a.committed_bytes() == gpu.mapped_bytes == r.arena_bytes <= budget
    with BufferArena.new(cfg, m + 1, *LIMITS, gpu, env=NOENV, buffers=buffers,
                         reserve=(m + 1, *LIMITS)) as a:
        assert a.committed_bytes() == r.next_arena_bytes > budget


def test_fit_of_a_set_from_the_sizes_by_hand():
    """A small set whose arena is written out from its formulas: with every
    alignment 256, the slab is the sum of the sizes rounded up to 256."""
    cfg = ModelConfig.preset("llama-3.1-8b")            # H 4096, V 128256
    H, V = 4096, 128256
    buffers = metrale.BufferSet([
        metrale.BufferSpec("token_ids", "int32", ["M"]),
        metrale.BufferSpec("hidden", "bfloat16", ["M", "H"], zero_all=True, rows="M"),
        metrale.BufferSpec("logits", "float32", ["max_batch_size", "V"]),
        metrale.BufferSpec("flags", size=1000)])

    def slab(m):
        return sum(_up(n, 256) for n in (4 * m, 2 * m * H, 4 * 32 * V, 1000))

    budget = 3 * 2**30
    r = fit(cfg, budget, *LIMITS, env=NOENV, buffers=buffers)
    m = r.max_batch_tokens
    assert slab(m) == r.arena_bytes <= budget < slab(m + 1) == r.next_arena_bytes
    # the same M by hand: the slab grows by 4 + 2H bytes a token, in 256-byte steps
    assert m == max(k for k in range(m - 100, m + 100) if slab(k) <= budget)
    assert fit(cfg, budget, *LIMITS, env=NOENV, buffers=buffers,
               max_batch_tokens=1000).arena_bytes == slab(1000)


def test_growth_of_a_set():
    cfg = ModelConfig.preset("llama-3.1-8b")
    wide = metrale.BufferSpec("wide", size="1000000 * M")
    rows = growth(cfg, 4096, *LIMITS, env=NOENV, buffers=metrale.REFERENCE.with_(wide))
    assert rows[0] == ("wide", 1000000 * 2048, 1000000 * 4096)
    rows = growth(cfg, 4096, *LIMITS, env=NOENV,
                  buffers=metrale.REFERENCE.without(["ffn_act_q8"]))
    assert "ffn_act_q8" not in [r[0] for r in rows] and rows


# -- monotonicity of an engine's own formulas -------------------------------------------------

SHRINKING = ["M % 7 + 100", "max(0, 4096 - M)", "4*M*H if M > 16 else 64*H",
             "H // (M // 4 + 1)", "max(M, 100 - M)", "M * (100 - M // 2) + 100000",
             "4096 - min(M, 4000)", "(M > 8) * 4096", "-M + 10000000"]
GROWING = ["max(33554432, 256 * M)", "cdiv(M, 7) * H", "M * (H - 1)", "(4096 - H) * M + 256",
           "ceil256(M*3) + 5 if E == 0 else 0", "M*M", "H // cdiv(8192, M) + 1",
           "min(M, 160) * V", "2*Lr*V", "max(Mp, Kx) * I", "16 + M // 3",
           "H // max(1, 1000 - M)", "4*M*H if H > 16 else 64*H", "0 * (M % 7)"]


@pytest.mark.parametrize("formula", SHRINKING)
def test_fit_refuses_a_size_not_seen_to_grow(formula):
    cfg = ModelConfig.preset("llama-3.1-8b")
    buffers = metrale.REFERENCE.with_(metrale.BufferSpec("mine", size=formula))
    with pytest.raises(ValueError, match="buffer spec 'mine': size: .* not seen to grow "
                       "with max_batch_tokens"):
        fit(cfg, GIB, *LIMITS, env=NOENV, buffers=buffers)
    # a given max_batch_tokens needs no search
    r = fit(cfg, GIB, *LIMITS, env=NOENV, buffers=buffers, max_batch_tokens=64)
    assert r.arena_bytes == set_arena_bytes(set_sizes(cfg, 64, buffers))


@pytest.mark.parametrize("formula", GROWING)
def test_fit_searches_sizes_that_grow(formula):
    cfg = ModelConfig.preset("llama-3.1-8b")
    buffers = metrale.REFERENCE.with_(metrale.BufferSpec("mine", size=formula))
    values = [set_sizes(cfg, m, buffers)["mine"] for m in range(1, 1300)]
    assert values == sorted(values)                  # it does grow: the premise
    r = fit(cfg, 2 * GIB, *LIMITS, env=NOENV, buffers=buffers)
    m = r.max_batch_tokens
    assert set_arena_bytes(set_sizes(cfg, m, buffers)) == r.arena_bytes <= 2 * GIB
    assert set_arena_bytes(set_sizes(cfg, m + 1, buffers)) > 2 * GIB


def test_the_proof_is_sound_on_random_formulas():
    """Whatever the analysis calls non-decreasing is, at every M tried."""
    import random
    from metrale.fitting import _Growth
    from metrale.formulas import evaluate, values
    rng = random.Random(2323)
    cfg = ModelConfig.preset("qwen3-next-80b")
    base = values(cfg, 1, 4096, 16, 32, Target.reference(), {})
    leaves = ["M", "M", "H", "V", "Hq", "max_batch_size", "1", "3", "16", "4096", "Mp", "Lr",
              "max_batch_tokens", "0"]

    def expr(depth):
        if depth == 0 or rng.random() < 0.25:
            return rng.choice(leaves)
        k = rng.randrange(9)
        a, b = expr(depth - 1), expr(depth - 1)
        if k < 5:
            return f"({a} {'+-*/%'[k].replace('/', '//')} {b})"
        if k == 5:
            return f"{rng.choice(['max', 'min', 'cdiv'])}({a}, {b})"
        if k == 6:
            return f"ceil16({a})"
        if k == 7:
            return f"(-{a})"
        return f"({a} if {b} {rng.choice(['>', '<=', '=='])} {rng.choice(leaves)} " \
               f"else {expr(depth - 1)})"

    proved = 0
    for _ in range(3000):
        e = expr(4)
        verdict = _Growth(base).of(e)
        if verdict is None or (verdict[0] == "v" and verdict[1] != 1):
            continue
        proved += 1
        seen = []
        for m in list(range(1, 70)) + [255, 256, 257, 1000, 4096, 65537]:
            sym = values(cfg, m, 4096, 16, 32, Target.reference(), {})
            try:
                seen.append(evaluate(e, sym))
            except ArithmeticError:
                seen.append(None)
        got = [v for v in seen if v is not None]
        assert got == sorted(got), e
        if verdict[0] == "c":
            assert len(set(got)) <= 1, e
        elif verdict[2]:
            assert all(v >= 0 for v in got), e
    assert proved > 600                  # not a vacuous check


@pytest.mark.parametrize("name", ModelConfig.presets())
def test_fit_never_refuses_the_reference(name):
    from metrale.fitting import _shrinking, _Sizer
    cfg = ModelConfig.preset(name)
    for env in (NOENV, {"METRALE_FP8_ROWWISE": "1"}, {"METRALE_ATTN_DECODE_SPLITK": "4"},
                {"METRALE_GGUF_NATIVE_Q2": "1", "METRALE_GGUF_NATIVE_Q2_MMQ": "1"}):
        for lim in ((4096, 16, 32), (512, 0, 1), (32768, 16, 256)):
            for target in (None, Target(132, "auto")):
                sizer = _Sizer(cfg, lim, target, env, 1, 0, None, metrale.REFERENCE)
                assert _shrinking(metrale.REFERENCE, sizer.symbols(1)) is None, (env, lim)


def test_a_size_that_fails_at_a_probe_is_raised():
    """A formula the proof accepts but that divides by zero at M = 1000: the
    search reaches it and says so, instead of taking it for the formulas' limit."""
    cfg = ModelConfig.preset("llama-3.1-8b")
    buffers = metrale.REFERENCE.with_(metrale.BufferSpec("mine", size="H // max(0, 1000 - M)"))
    assert fit(cfg, GIB, *LIMITS, env=NOENV, buffers=buffers, max_batch_tokens=999)
    with pytest.raises(ValueError, match="buffer spec 'mine': size: .* fails at max_batch_tokens="):
        fit(cfg, 8 * GIB, *LIMITS, env=NOENV, buffers=buffers)


def test_the_formulas_limit_of_a_set():
    cfg = ModelConfig.preset("llama-3.1-8b")
    buffers = metrale.BufferSet([metrale.BufferSpec("huge", size="M * 1099511627776",
                                                    align=2**30)])
    r = fit(cfg, 2**64 - 1, *LIMITS, env=NOENV, buffers=buffers)
    m = r.max_batch_tokens
    assert r.limited_by == "formulas" and r.next_arena_bytes is None
    pad = 2**30 - 256             # room to align the base of a 256-byte aligned allocation
    assert r.arena_bytes == _up(m * 2**40, 256) + pad
    assert _up((m + 1) * 2**40, 256) + pad > 2**64 - 1


def test_fit_refuses_what_is_not_a_set():
    for bad in (("logits",), "REFERENCE", metrale.REFERENCE.names):
        with pytest.raises(TypeError, match="buffers must be a BufferSet"):
            fit(LLAMA, GIB, *LIMITS, buffers=bad)


def test_pointers_are_aligned_as_the_spec_says():
    cfg, gpu = ModelConfig.preset("llama-3.1-8b"), HostBackend()
    buffers = metrale.REFERENCE.with_([
        metrale.BufferSpec("big", "float32", ["M", "H"], align=2**20),
        metrale.BufferSpec("page", "uint8", [5000], align=2**22)])
    bad = []
    for reserve in (None, (64, *LIMITS)):
        with BufferArena.new(cfg, 64, *LIMITS, gpu, env=NOENV, buffers=buffers,
                             reserve=reserve) as a:
            bad += [(n, reserve) for n in ("big", "page") if a.ptr(n) % buffers[n].align]
    assert bad == []


def test_cli_fit_buffers(capsys, tmp_path, monkeypatch):
    for name in ("METRALE_FP8_ROWWISE", "METRALE_GGUF_NATIVE_Q2", "METRALE_GGUF_NATIVE_Q2_MMQ",
                 "METRALE_ATTN_DECODE_SPLITK"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "engine.json"
    path.write_text(json.dumps({
        "drop": ["ffn_act_q8", "ffn_act_a"],
        "buffer": [{"name": "staging", "dtype": "bfloat16", "shape": ["M", "H"],
                    "zero_all": True, "rows": "M", "align": 65536},
                   {"name": "wide", "size": "100000 * max_batch_tokens"}]}))
    want = metrale.REFERENCE.without(["ffn_act_q8", "ffn_act_a", "fp8_act"]).with_([
        metrale.BufferSpec("staging", "bfloat16", ["M", "H"], zero_all=True, rows="M",
                           align=65536),
        metrale.BufferSpec("wide", size="100000 * max_batch_tokens")])
    argv = ("fit", "--preset", "llama-3.1-8b", "--budget", "12GiB", "--buffers", str(path),
            "--drop", "fp8_act")
    status, out, err = run(capsys, *argv, "--json")
    got = json.loads(out)
    r = fit(LLAMA, 12 * GIB, *LIMITS, env=NOENV, buffers=want)
    assert status == 0 and err == ""
    assert got["fit"] == {n: getattr(r, n) for n in r.__slots__}
    assert got["buffer_set"] == {"reference": False, "file": str(path), "dropped": ["fp8_act"],
                                 "fingerprint": want.fingerprint(), "count": len(want),
                                 "names": list(want.names)}
    # the arena written out: every size by its formula, the layout's contract
    assert r.arena_bytes == set_arena_bytes(set_sizes(LLAMA, r.max_batch_tokens, want))
    status, out, _ = run(capsys, *argv, "--explain")
    assert status == 0
    assert f"buffers: {len(want)} (from {path} without fp8_act), fingerprint " \
        f"{want.fingerprint()}\n" in out
    assert "dominant: wide " in out
    status, out, _ = run(capsys, "fit", "--preset", "llama-3.1-8b", "--budget", "12GiB", "--json")
    assert json.loads(out)["buffer_set"]["reference"] is True
    assert json.loads(out)["buffer_set"]["fingerprint"] == metrale.REFERENCE.fingerprint()
    status, out, _ = run(capsys, "fit", "--preset", "llama-3.1-8b", "--budget", "12GiB")
    assert "buffers:" not in out                   # the reference's answer as before


def test_cli_fit_buffers_errors(capsys, tmp_path):
    shrinks = tmp_path / "shrinks.toml"
    shrinks.write_text('[[buffer]]\nname = "mine"\nsize = "max(0, 4096 - M) * H"\n')
    bad = tmp_path / "bad.json"
    bad.write_text('{"buffer": [{"name": "x", "shape": ["M", 0]}]}')
    fit_ = ("fit", "--preset", "llama-3.1-8b", "--budget", "12GiB")
    for argv, words in [
            (("--buffers", str(tmp_path / "absent.toml")), ("--buffers", "absent.toml")),
            (("--buffers", str(bad)), ("bad.json", "buffer spec 'x'", "shape[1]")),
            (("--drop", "ffn_act_q"), ("--drop", "'ffn_act_q'", "did you mean ffn_act_q8")),
            (("--buffers", str(shrinks)), ("shrinks.toml", "buffer spec 'mine'", "grow")),
    ]:
        status, out, err = run(capsys, *fit_, *argv)
        assert status == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith("metrale: error: ") and all(w in err for w in words), err
    status, out, _ = run(capsys, *fit_, "--buffers", str(shrinks), "--max-batch-tokens", "512")
    assert status == 0 and "(as given)" in out
