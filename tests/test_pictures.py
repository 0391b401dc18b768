"""metrale.picture's pictures of a budget and of live arenas: fit_svg (the
split of a device's memory), states_svg (the states and which pins refuse
which change), offload_svg (what backs a reserved arena's addresses asleep)
and tp_svg (which rank's slab each process maps).  Each drawing is parsed and
checked against figures the test computes from the inputs, and against what a
live arena on the host backend does: the pin table's every cell is tried."""

import re
import threading
import xml.etree.ElementTree as ET

import pytest

import metrale
from metrale import BufferArena, BufferSizes, MetraleError, ModelConfig, Target
from metrale._arena._summary import Pin
from metrale._sizing._layout import plan_layout, plan_reserved
from metrale.picture import fit_svg, offload_svg, states_svg, tp_svg

from helpers import COMPACT, FileGroup, run_ranks

NS = "{http://www.w3.org/2000/svg}"
TOL = 1e-4                  # coordinates are written rounded to 1e-4 units
BAR_X, BAR_W = 20, 860      # the bars' place, as the docstrings give it
GiB = 2**30
HOPPER = Target(132, "auto")


def parse(svg):
    root = ET.fromstring(svg)
    assert root.tag == NS + "svg"
    return root


def rects(root, **attrs):
    """The <rect>s whose data-* attributes have the given values."""
    want = {"data-" + k.replace("_", "-"): str(v) for k, v in attrs.items()}
    return [r for r in root.iter(NS + "rect")
            if all(r.get(k) == v for k, v in want.items())]


def renders(svg):
    cairosvg = pytest.importorskip("cairosvg")
    png = cairosvg.svg2png(bytestring=svg.encode("utf-8"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


# -- fit_svg ----------------------------------------------------------------------

def _kv_bytes_per_token(cfg, tp):
    full = cfg.num_hidden_layers - cfg.num_ssm_layers()
    return 2 * (cfg.num_key_value_heads // tp) * cfg.head_dim * 2 * full


# (fit's arguments, weights, the parts the test expects, computed from the inputs)
def _case_search():
    cfg = ModelConfig.preset("llama-3.1-8b")
    r = metrale.fit(cfg, "12GiB", 4096, 16, 32, env={})
    m = r.max_batch_tokens
    arena = plan_layout(BufferSizes.from_config(cfg, m, 4096, 16, 32, env={})).slab_bytes
    return r, 0, [("arena", arena), ("headroom", 12 * GiB - arena)]


def _case_weights_kv():
    cfg = ModelConfig.preset("qwen3-next-80b")
    weights, kv = 41_000_000_000, _kv_bytes_per_token(cfg, 2)
    budget = 80 * GiB - weights
    r = metrale.fit(cfg, budget, 32768, 16, 64, tp_size=2, target=HOPPER, env={},
                    max_batch_tokens=8192, kv_bytes_per_token=kv)
    sizes = BufferSizes.from_config(cfg, 8192, 32768, 16, 64, tp_size=2, target=HOPPER, env={})
    arena = plan_layout(sizes).slab_bytes
    tokens = (budget - arena) // kv
    return r, weights, [("weights", weights), ("arena", arena), ("kv", tokens * kv),
                        ("headroom", budget - arena - tokens * kv)]


def _case_reserved_pool():
    cfg = ModelConfig.preset("llama-3.1-8b")
    gran, pool = 2 * 2**20, 3 * 2**20 + 1            # the pool rounds up to 4 MiB
    r = metrale.fit(cfg, "20GiB", 4096, 16, 32, env={}, reserve=True, granularity=gran,
                    max_batch_tokens=4096, kv_bytes_per_token=131072, torch_pool_bytes=pool)
    sizes = BufferSizes.from_config(cfg, 4096, 4096, 16, 32, env={})
    arena = plan_reserved(sizes, sizes, 4096, gran).committed_bytes
    pool = 4 * 2**20
    left = 20 * GiB - pool - arena
    return r, 7 * GiB, [("weights", 7 * GiB), ("arena", arena), ("pool", pool),
                        ("kv", left // 131072 * 131072), ("headroom", left % 131072)]


class _FreeMemory(metrale.HostBackend):
    """A host backend that reports free device memory, for budget=None."""

    def mem_info(self):
        return 10 * GiB + 12345, 16 * GiB


def _case_margin():
    cfg = ModelConfig.preset("llama-3.1-8b")
    r = metrale.fit(cfg, None, 4096, 16, 32, env={}, gpu=_FreeMemory(), margin="1GiB",
                    max_batch_tokens=2048)
    sizes = BufferSizes.from_config(cfg, 2048, 4096, 16, 32, env={},
                                    target=metrale.HostBackend().target())
    arena = plan_layout(sizes).slab_bytes
    return r, 0, [("arena", arena), ("headroom", 9 * GiB + 12345 - arena), ("margin", GiB)]


CASES = {"search": _case_search, "weights-kv": _case_weights_kv,
         "reserved-pool": _case_reserved_pool, "margin": _case_margin}


@pytest.mark.parametrize("case", CASES)
def test_fit_bar_is_the_budget_to_scale(case):
    r, weights, parts = CASES[case]()
    parts = [(p, n) for p, n in parts if n]         # a part of 0 bytes is not drawn
    svg = fit_svg(r, weights=weights, model="a model")
    assert svg == fit_svg(r, weights=weights, model="a model")      # deterministic
    root = parse(svg)
    total = sum(n for _, n in parts)
    (bar,) = rects(root, part="total")
    assert (float(bar.get("x")), float(bar.get("width"))) == (BAR_X, BAR_W)
    assert int(bar.get("data-bytes")) == total
    drawn = [r for r in root.iter(NS + "rect") if r.get("data-part") not in (None, "total")]
    assert [(d.get("data-part"), int(d.get("data-bytes"))) for d in drawn] == parts
    x = BAR_X
    for d, (_, n) in zip(drawn, parts):
        assert abs(float(d.get("x")) - x) <= 2 * TOL
        assert abs(float(d.get("width")) - n * BAR_W / total) <= TOL
        x += n * BAR_W / total
    assert abs(x - (BAR_X + BAR_W)) <= 1e-9
    # the legend names each part once; the bracket spans the budget
    assert [t.get("data-legend") for t in root.iter(NS + "text") if t.get("data-legend")] == \
        [p for p, _ in parts]
    budget = total - weights - dict(parts).get("margin", 0)
    (bracket,) = [p for p in root.iter(NS + "path") if p.get("data-bracket") == "budget"]
    x0, x1 = (float(v) for v in re.findall(r"M([\d.]+) .*H([\d.]+)", bracket.get("d"))[0])
    assert abs(x0 - (BAR_X + weights * BAR_W / total)) <= TOL
    assert abs(x1 - x0 - budget * BAR_W / total) <= 2 * TOL
    renders(svg)


def test_fit_svg_refuses_what_is_not_an_answer():
    r, _, _ = _case_search()
    with pytest.raises(TypeError, match="ArenaFit"):
        fit_svg({"budget": 1})
    with pytest.raises(ValueError, match="weights"):
        fit_svg(r, weights=-1)
    with pytest.raises(TypeError, match="weights"):
        fit_svg(r, weights=1.5)
    forged = type(r)(**{**{k: getattr(r, k) for k in r.__slots__},
                        "headroom_bytes": r.headroom_bytes + 1})
    with pytest.raises(ValueError, match="budget"):
        fit_svg(forged)


def test_fit_svg_escapes_the_model_name():
    r, _, _ = _case_search()
    svg = fit_svg(r, model='<a & "b">')
    assert '<a & "b">' in parse(svg).find(NS + "title").text


# -- states_svg: every cell of the pin table, tried on a live arena ------------------

def _reserved():
    return BufferArena.new(COMPACT, 64, 512, 16, 8, metrale.HostBackend(),
                           reserve=(128, 512, 16, 8))


def _outcome(call):
    """'allowed', or the exception type's name."""
    try:
        call()
    except (BufferError, MetraleError) as e:
        return type(e).__name__
    return "allowed"


class ThreadGroup:
    """Ranks on threads of this process: all_gather_object through a dict."""

    def __init__(self, shared, rank, size):
        self.shared, self._rank, self._size = shared, rank, size
        self.round = 0

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def all_gather_object(self, out, obj):
        cv, data = self.shared
        k = self.round
        self.round += 1
        with cv:
            data.setdefault(k, {})[self._rank] = obj
            cv.notify_all()
            assert cv.wait_for(lambda: len(data[k]) == self._size, timeout=30)
            out[:] = [data[k][r] for r in range(self._size)]


def shared_arenas(n=2):
    """A shared arena per rank of a group of `n`, its ranks on threads."""
    shared = (threading.Condition(), {})
    arenas, errors = [None] * n, []

    def build(r):
        try:
            arenas[r] = BufferArena.new(COMPACT, 64, 512, 16, 8, metrale.HostBackend(),
                                        group=ThreadGroup(shared, r, n))
        except BaseException as e:          # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=build, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and all(arenas), errors
    return arenas


def _tried():
    """{(kind, transition): the outcomes seen} on live arenas, each pin made for real."""
    seen = {}

    def note(kind, t, outcome):
        seen.setdefault((kind, t), set()).add(outcome)

    # views: of a buffer offloaded, discarded, kept; grown, shrunk
    a = _reserved()
    v = a.view("hidden_states", "uint8")
    note("view", "sleep", _outcome(lambda: a.sleep()))
    note("view", "sleep", _outcome(lambda: a.sleep(keep=["hidden_states"])))
    note("view", "sleep", _outcome(lambda: a.sleep(offload=["hidden_states"])))
    assert a.is_sleeping() and [(p.kind, p.name, p.count) for p in a.pins()] == \
        [("view", "hidden_states", 1)]
    note("view", "wake", _outcome(a.wake))
    note("view", "resize", _outcome(lambda: a.resize(max_batch_tokens=128)))   # grows it
    note("view", "resize", _outcome(lambda: a.resize(max_batch_tokens=64)))    # shrinks it
    note("view", "trim", _outcome(a.trim))
    note("view", "release", _outcome(a.release))
    del v
    a.release()
    # the pool's segments
    a = _reserved()
    pool = a.open_pool(8 << 20)
    seg = pool.alloc(2 << 20)
    assert [p.kind for p in a.pins()] == ["pool"]
    for t, call in (("resize", lambda: a.resize(max_batch_tokens=128)), ("trim", a.trim),
                    ("sleep", a.sleep), ("wake", a.wake), ("release", a.release)):
        note("pool", t, _outcome(call))
    pool.free(seg)
    a.release()
    # a shared arena: both peer pins, from construction to release
    arenas = shared_arenas()
    for a in arenas:
        kinds = {p.kind for p in a.pins()}
        assert kinds == {"peer_export", "peer_import"}
        for t, call in (("sleep", a.sleep), ("wake", a.wake), ("trim", a.trim),
                        ("resize", lambda: a.resize(max_batch_tokens=32))):
            for kind in kinds:
                note(kind, t, _outcome(call))
    for a in arenas:
        for kind in ("peer_export", "peer_import"):
            note(kind, "release", _outcome(a.release))
    return seen


# How a cell's outcome reads in behaviour: "depends" was refused once and allowed once.
_SEEN = {"refused": [{"BufferError"}, {"MetraleError"}], "allowed": [{"allowed"}],
         "depends": [{"BufferError", "allowed"}]}


def test_the_pin_table_is_what_a_live_arena_does():
    root = parse(states_svg())
    cells = {(r.get("data-pin"), r.get("data-transition")): r.get("data-outcome")
             for r in rects(root) if r.get("data-pin")}
    seen = _tried()
    assert set(cells) == set(seen)
    for key, outcome in cells.items():
        assert seen[key] in _SEEN[outcome], (key, outcome, seen[key])


def test_the_pin_kinds_are_pins_own():
    # The kinds drawn are those Pin's docstring defines, in its order.
    doc = Pin.__doc__.split("kind : str", 1)[1].split("name :", 1)[0]
    kinds = re.findall(r'``"(\w+)"``', doc)
    root = parse(states_svg())
    drawn = [t.get("data-pin-kind") for t in root.iter(NS + "text") if t.get("data-pin-kind")]
    assert drawn == kinds == ["view", "peer_export", "peer_import", "pool"]


def test_states_svg_marks_the_arena_state_and_counts_its_pins():
    a = _reserved()

    def now():
        root = parse(states_svg(a))
        marked = [r.get("data-state") for r in rects(root, now="true")]
        held = {t.get("data-pin-kind"): t.text for t in root.iter(NS + "text")
                if t.get("data-pin-kind")}
        return marked, held

    assert now() == (["awake"], {k: f"{k}: 0" for k in ("view", "peer_export",
                                                          "peer_import", "pool")})
    v1, v2 = a.view("hidden_states", "uint8"), a.view("residual", "uint8")
    assert now()[1]["view"] == "view: 2"
    del v1, v2
    a.sleep()
    assert now()[0] == ["asleep"]
    a.release()
    assert now()[0] == ["released"]
    assert states_svg() == states_svg() and not rects(parse(states_svg()), now="true")
    renders(states_svg(a))
    plain = BufferArena.new(COMPACT, 64, 512, 16, 8, metrale.HostBackend())
    with pytest.raises(ValueError, match="not reserved"):
        states_svg(plain)
    plain.release()


# -- offload_svg --------------------------------------------------------------------

def test_offload_svg_draws_every_buffer_where_it_is_and_what_backs_it():
    a = _reserved()
    live = {b.name: (b.offset, b.nbytes) for b in a.buffers.values() if b.nbytes}
    slab = a.slab_bytes()
    scale = BAR_W / slab
    awake = offload_svg(a)
    assert {r.get("data-row") for r in rects(parse(awake)) if r.get("data-row")} == {"awake"}
    offload, keep = ["hidden_states", "logits"], ["residual"]
    a.sleep(offload=offload, keep=keep)
    svg = offload_svg(a, offload=offload, keep=keep)
    assert svg == offload_svg(a, offload=tuple(offload), keep=tuple(keep))
    root = parse(svg)
    for row in ("awake", "asleep"):
        drawn = {r.get("data-buffer"): r for r in rects(root, row=row)}
        assert set(drawn) == set(live)
        for name, (off, n) in live.items():
            r = drawn[name]
            assert (int(r.get("data-offset")), int(r.get("data-bytes"))) == (off, n)
            assert abs(float(r.get("x")) - (BAR_X + off * scale)) <= TOL
            assert abs(float(r.get("width")) - n * scale) <= TOL
            if row == "asleep":
                want = ("offloaded" if name in offload else "kept" if name in keep
                        else "discarded")
                assert r.get("data-fate") == want
    host = {r.get("data-buffer"): int(r.get("data-offset")) for r in rects(root, row="host")}
    assert host == {n: live[n][0] for n in offload}
    # the awake bar's figure is what wake maps again
    figure = int(re.search(r"device memory under every buffer: ([\d,]+) bytes", svg)
                 .group(1).replace(",", ""))
    a.wake()
    assert figure == a.committed_bytes()
    renders(svg)
    a.release()


def test_offload_svg_checks_the_names_against_the_arena():
    a = _reserved()
    with pytest.raises(ValueError, match="awake"):
        offload_svg(a, offload=["hidden_states"])
    a.sleep(offload=["hidden_states"], keep=["residual"])
    with pytest.raises(ValueError, match="offload"):
        offload_svg(a, offload=["logits"], keep=["residual"])       # not what it moved
    with pytest.raises(ValueError, match="keep"):
        offload_svg(a, offload=["hidden_states"])
    with pytest.raises(ValueError, match="no buffer"):
        offload_svg(a, offload=["nope"])
    with pytest.raises(ValueError, match="both"):
        offload_svg(a, offload=["hidden_states"], keep=["hidden_states"])
    assert offload_svg(a, offload="hidden_states", keep="residual")
    a.release()
    with pytest.raises(ValueError, match="released"):
        offload_svg(a)
    plain = BufferArena.new(COMPACT, 64, 512, 16, 8, metrale.HostBackend())
    with pytest.raises(ValueError, match="not reserved"):
        offload_svg(plain)
    plain.release()


# -- tp_svg ------------------------------------------------------------------------

def test_tp_svg_maps_every_rank_in_every_process(n=2):
    # Ranks on threads share one pid, which the exchange tells peers apart by:
    # two, no more (three ranks: processes, below).
    arenas = shared_arenas(n)
    try:
        own = {b.name: (b.offset, b.nbytes) for b in arenas[0].buffers.values() if b.nbytes}
        svg = tp_svg(list(reversed(arenas)))               # any order: rows by rank
        assert svg == tp_svg(arenas)
        root = parse(svg)
        assert [t.get("data-process") for t in root.iter(NS + "text")
                if t.get("data-process")] == [str(r) for r in range(n)]
        for me in range(n):
            slabs = {int(r.get("data-owner")): r for r in rects(root, rank=me)
                     if r.get("data-slab")}
            assert set(slabs) == set(range(n))
            for q, box in slabs.items():
                assert box.get("data-slab") == ("own" if q == me else "imported")
                assert int(box.get("data-bytes")) == arenas[q].slab_bytes()
                drawn = {r.get("data-buffer"): (int(r.get("data-offset")),
                                                int(r.get("data-bytes")))
                         for r in rects(root, rank=me, owner=q) if r.get("data-buffer")}
                assert drawn == own                  # the same offsets on every rank
        exports = {(int(p.get("data-export")), int(p.get("data-to")))
                   for p in root.iter(NS + "path") if p.get("data-export")}
        assert exports == {(q, r) for q in range(n) for r in range(n) if q != r}
        # one process alone: its own row
        one = parse(tp_svg(arenas[1]))
        assert [t.get("data-process") for t in one.iter(NS + "text")
                if t.get("data-process")] == ["1"]
        renders(svg)
        with pytest.raises(ValueError, match="one group"):
            tp_svg([arenas[0], arenas[0]])
    finally:
        for a in arenas:
            a.release()


def test_tp_svg_needs_a_shared_arena():
    a = _reserved()
    with pytest.raises(ValueError, match="not shared"):
        tp_svg(a)
    a.release()
    with pytest.raises(ValueError, match="no arena"):
        tp_svg([])


def rank_draws(rank, size, path):
    """A rank of a real group (processes): its own row of the peer map."""
    with BufferArena.new(COMPACT, 64, 512, 16, 8, metrale.HostBackend(),
                         group=FileGroup(path, rank, size, timeout=60)) as a:
        return tp_svg(a), {b.name: (b.offset, b.nbytes) for b in a.buffers.values() if b.nbytes}


def test_tp_svg_in_each_process_of_three(tmp_path):
    outs = run_ranks(rank_draws, 3, args=(str(tmp_path),), timeout=120)
    own = outs[0][1]
    for me, (svg, offsets) in enumerate(outs):
        assert offsets == own
        root = parse(svg)
        assert [t.get("data-process") for t in root.iter(NS + "text")
                if t.get("data-process")] == [str(me)]
        kinds = {int(r.get("data-owner")): r.get("data-slab") for r in rects(root, rank=me)
                 if r.get("data-slab")}
        assert kinds == {q: "own" if q == me else "imported" for q in range(3)}
        for q in range(3):
            drawn = {r.get("data-buffer"): (int(r.get("data-offset")), int(r.get("data-bytes")))
                     for r in rects(root, rank=me, owner=q) if r.get("data-buffer")}
            assert drawn == own
