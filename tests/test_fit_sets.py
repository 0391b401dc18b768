"""metrale.fit over buffer sets (issue 23): the largest max_batch_tokens
whose arena of an engine's own set fits a budget, and the proof that the
search is exact for an engine's own formulas.

The expectations come from outside the module under test: the arena's bytes
from the placement rule of docs/buffer-sets.md written out here (checked
against the C planner and arenas built on the host backend) and sizes worked
out by hand.  The fit of REFERENCE is in test_fit.py."""

import json
import mmap

import pytest

import metrale
from metrale import BufferArena, BufferSizes, DebugOptions, HostBackend, ModelConfig, Target, fit
from metrale._sizing._layout import plan_layout
from metrale.fitting import growth

from helpers import FIT_LIMITS as LIMITS
from helpers import GIB, LLAMA, NOENV, TIGHT_PARTS, run, spec_part


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
        end = _up(start + span, 256 if spec_part(spec) in TIGHT_PARTS else granularity)
        need = end - start if spec_part(spec) in TIGHT_PARTS else span
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
            rows = rng.choice(["whole", "M", "Mp", "M|Mp"]) if z and shape[0] in (
                "M", "Mp", "max_batch_tokens") else "whole"
            if rows == "Mp" and shape[0] != "Mp":
                rows = "M|Mp"
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
    from metrale._sizing._layout import plan_reserved
    gpu, page = HostBackend(), mmap.PAGESIZE
    cfg = ModelConfig.preset("qwen3-30b-a3b")
    for buffers in SETS:
        for m in (1, 37, 300):
            sizes = set_sizes(cfg, m, buffers, (512, 16, 8))
            for guard in (0, 4096):
                assert plan_layout(sizes, guard_bytes=guard).slab_bytes == \
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
    from metrale.formulas import Growth as _Growth
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
    from metrale.fitting import _Sizer
    from metrale.formulas import first_shrinking as _shrinking
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
