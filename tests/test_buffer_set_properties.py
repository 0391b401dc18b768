"""Property-based tests over random buffer sets (issue 23, docs/buffer-sets.md).

A set is a random subset of REFERENCE (some specs given another alignment or
other helpers) in a random order, plus random new specs: shapes over the
symbols, size formulas, every row rule, random alignments.  Over random
configs and limits:

- the sizes are the specs evaluated by the test itself (each drawn formula
  comes with its value as a Python function; REFERENCE's from
  tests/reference_sizes.py, the second implementation);
- the layout is the placement rule of docs/buffer-sets.md, written out here
  (each part in set order, each buffer at its alignment, ends padded to 256),
  so buffers are disjoint, inside the slab, aligned; zero_all and
  zero_prefill_essentials are one span covering exactly their members with
  only padding between;
- zero_all_rows(tokens) is the rule of ARENA.md §5.2 per buffer's row rule,
  with the padding kernels/zero_ranges.h says a cleared buffer takes along;
- on a backend, after filling the whole slab with a sentinel, each zeroing
  helper (and zero_all_rows with the count read from memory) turns exactly
  the expected bytes to 0 and leaves every other byte alone; reserved arenas
  too, before and after a resize.

Profiles (conftest.py): "ci" is deterministic and bounded;
METRALE_HYPOTHESIS_PROFILE=long runs many more examples.  The sentinel test
runs on the host here and, marked gpu, on a CudaBackend (uploads and
downloads through the backend's own copies)."""

import ctypes
import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
np = pytest.importorskip("numpy")
from hypothesis import HealthCheck, assume, given, settings, strategies as st  # noqa: E402

from metrale import (REFERENCE, BufferArena, BufferSet, BufferSizes, BufferSpec,  # noqa: E402
                     HostBackend, ModelConfig)
from metrale._sizing._layout import plan_layout, plan_reserved  # noqa: E402
from metrale.debug import DebugOptions  # noqa: E402

from helpers import TIGHT_PARTS, cuda_backend, live_counts, rows_live, spec_part, vm_counts  # noqa: E402
from reference_oracle import NAMES  # noqa: E402
from reference_sizes import reference_sizes  # noqa: E402

NOENV = {}
ALIGN = 256
SENTINEL = 0xA5


def _ceil(x, n):
    return -(-x // n) * n


def _floor(x, n):
    return x // n * n


# -- configs, limits and the symbols' values (from the docs, by hand) --------------------------

@st.composite
def configs(draw):
    """A small dense or MoE model: every size stays in KiB to a few MiB."""
    hq = draw(st.sampled_from([2, 4]))
    fields = dict(hidden_size=draw(st.sampled_from([32, 48, 64])),
                  intermediate_size=draw(st.sampled_from([64, 96])),
                  vocab_size=draw(st.sampled_from([50, 77, 100])), num_hidden_layers=2,
                  num_attention_heads=hq, num_key_value_heads=draw(st.sampled_from([1, hq])),
                  head_dim=draw(st.sampled_from([8, 16])))
    if draw(st.booleans()):
        return ModelConfig.preset("llama-3.1-8b").replace(**fields)
    return ModelConfig.preset("qwen3-30b-a3b").replace(
        num_experts=draw(st.sampled_from([4, 8])), num_experts_per_tok=2,
        moe_intermediate_size=32, **fields)


limits = st.tuples(st.integers(1, 80), st.sampled_from([64, 200, 512]),
                   st.sampled_from([0, 16, 64]), st.integers(1, 40))


def symbol_values(cfg, m, seq, blk, bs):
    """The symbols a drawn formula may read, from the config fields and the
    limits as docs/buffers.md defines them."""
    r = max(32, bs)
    v = {"M": m, "Mp": _ceil(m, 16), "H": cfg.hidden_size, "V": cfg.vocab_size,
         "Hq": cfg.num_attention_heads, "Hkv": cfg.num_key_value_heads, "D": cfg.head_dim,
         "I": cfg.intermediate_size, "E": cfg.num_experts, "R": r,
         "B": 256 if blk == 0 else seq // blk + 1, "Lr": min(m, max(160, r + 1)),
         "max_batch_size": bs, "max_seq_len": seq}
    for long, short in (("max_batch_tokens", "M"), ("hidden_size", "H"), ("vocab_size", "V"),
                        ("num_attention_heads", "Hq"), ("head_dim", "D"),
                        ("intermediate_size", "I")):
        v[long] = v[short]
    return v


TOKEN_SYMBOLS = ("M", "Mp", "Lr", "max_batch_tokens")
OTHER_SYMBOLS = ("H", "V", "Hq", "Hkv", "D", "I", "E", "R", "B", "max_batch_size",
                 "hidden_size", "vocab_size", "num_attention_heads", "head_dim")


# -- formulas: (text, value as a function of the symbols, reads a token dimension,
#    reads no symbol at all) -----------------------------------------------------------------

def _sym(name):
    return (name, lambda v: v[name], name in TOKEN_SYMBOLS, False)


def _const(k):
    return (str(k), lambda v: k, False, True)


def _binary(op, a, b):
    fa, fb = a[1], b[1]
    fn = {"+": lambda v: fa(v) + fb(v), "*": lambda v: fa(v) * fb(v)}[op]
    return (f"({a[0]} {op} {b[0]})", fn, a[2] or b[2], a[3] and b[3])


def _call(name, a, b=None):
    fa = a[1]
    if name == "ceil16":
        return (f"ceil16({a[0]})", lambda v: _ceil(fa(v), 16), a[2], a[3])
    fb = b[1]
    fn = {"max": lambda v: max(fa(v), fb(v)), "min": lambda v: min(fa(v), fb(v)),
          "cdiv": lambda v: -(-fa(v) // fb(v)), "floordiv": lambda v: fa(v) // fb(v)}[name]
    text = f"({a[0]} // {b[0]})" if name == "floordiv" else f"{name}({a[0]}, {b[0]})"
    return (text, fn, a[2] or b[2], a[3] and b[3])


def _ifexp(k, a, b):
    fa, fb = a[1], b[1]
    # the condition reads M: the spec's size then reads a token dimension
    return (f"({a[0]} if M > {k} else {b[0]})", lambda v: fa(v) if v["M"] > k else fb(v), True,
            False)


leaves = st.one_of(st.sampled_from(TOKEN_SYMBOLS + OTHER_SYMBOLS).map(_sym),
                   st.integers(1, 16).map(_const))
consts = st.integers(1, 9).map(_const)


def _extend(inner):
    return st.one_of(
        st.builds(_binary, st.sampled_from(["+", "*"]), inner, inner),
        st.builds(_call, st.sampled_from(["max", "min"]), inner, inner),
        st.builds(_call, st.sampled_from(["cdiv", "floordiv"]), inner, consts),
        st.builds(_call, st.just("ceil16"), inner),
        st.builds(_ifexp, st.integers(1, 64), inner, inner))


formulas = st.recursive(leaves, _extend, max_leaves=3)
# A dimension that reads no symbol must be >= 1 (BufferSpec refuses a zero width).
dims = st.one_of(leaves, st.recursive(leaves, _extend, max_leaves=2)).filter(
    lambda d: not d[3] or d[1]({}) >= 1)

DTYPES = {"float32": 4, "bfloat16": 2, "int32": 4, "uint8": 1, "int64": 8, "float16": 2,
          "int8": 1, "uint32": 4, "float8_e4m3fn": 1}
ALIGNS = (256, 256, 512, 1024, 4096, 8192, 65536)
# The element types each step role takes (docs/step-inputs.md, by hand).
_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
STEP_TYPES = {"count": ("int32",), "positions": _INTS,
              "metadata": _INTS + ("float16", "float32", "float64")}


@st.composite
def new_specs(draw, i):
    """A new spec named b<i> and its size as a function of the symbols."""
    zero_all = draw(st.booleans())
    kw = dict(zero_all=zero_all, align=draw(st.sampled_from(ALIGNS)),
              checksum=draw(st.booleans()), init_zero=draw(st.booleans()),
              total=draw(st.booleans()))
    if draw(st.booleans()):                                 # a shape: product x element size
        shape = draw(st.lists(dims, min_size=1, max_size=3))
        dtype = draw(st.sampled_from(sorted(DTYPES) + [None]))
        if dtype is None:
            item = draw(st.sampled_from([1, 2, 4, 8, 16]))
            kw["itemsize"] = item
        else:
            item = DTYPES[dtype]
        floor = draw(st.one_of(st.none(), st.integers(0, 5000)))
        reads_m = any(d[2] for d in shape)

        def size(v, shape=shape, item=item, floor=floor):
            n = item
            for d in shape:
                n *= d[1](v)
            return max(n, floor) if floor else n
        kw.update(dtype=dtype, shape=[d[0] for d in shape], floor=floor)
    else:                                                   # a size formula
        f = draw(formulas)
        reads_m = f[2]
        size = f[1]
        kw.update(dtype=draw(st.sampled_from([None, "float32", "bfloat16"])), size=f[0])
    if zero_all and reads_m:
        kw["rows"] = draw(st.sampled_from(["whole", "M", "Mp", "M|Mp"]))
    kw["prefill"] = zero_all and draw(st.booleans())
    # a step input now and then: placed with the token ids, in no helper
    step = draw(st.sampled_from(["", "", "", "", "", "metadata", "positions", "count"]))
    if step and kw.get("dtype") in STEP_TYPES[step]:
        kw.update(step=step, zero_all=False, prefill=False, rows="whole", align=256)
    return BufferSpec(f"b{i}", **kw), size


@st.composite
def reference_part(draw, most=12):
    """Some REFERENCE specs, in a random order, some with other helpers."""
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=most))
    specs = []
    for name in names:
        s = REFERENCE[name]
        if name not in ("token_ids", "scratch") and draw(st.booleans()):   # 256 only
            changes = {"align": draw(st.sampled_from(ALIGNS))}
            if draw(st.booleans()):
                z = draw(st.booleans())
                changes.update(zero_all=z, prefill=z and draw(st.booleans()),
                               rows=draw(st.sampled_from(["whole", "M", "Mp", "M|Mp"]))
                               if z else "whole")
            try:
                s = s.replace(**changes)
            except ValueError:          # a rule the spec refuses (no token dimension): keep it
                s = s.replace(align=changes["align"])
        specs.append(s)
    return specs


@st.composite
def buffer_sets(draw, most_new=24):
    """(BufferSet, name -> size function or None for a REFERENCE spec)."""
    specs = draw(reference_part())
    oracle = {s.name: None for s in specs}
    for i in range(draw(st.integers(0 if specs else 1, most_new))):
        spec, size = draw(new_specs(i))
        at = draw(st.integers(0, len(specs)))               # anywhere in the order
        specs.insert(at, spec)
        oracle[spec.name] = size
    assume(sum(s.zero_all for s in specs) <= 30)
    roles = [s.step for s in specs if s.step and s.step != "metadata"]
    assume(len(roles) == len(set(roles)))      # one buffer per role
    assume(not ({"count", "positions"} & set(roles) and "decode_meta" in roles))
    return BufferSet(specs), oracle


def expected_sizes(buffers, oracle, cfg, lim, target=None):
    ref = dict(zip(NAMES, reference_sizes(cfg, *lim, target=target, env=NOENV)))
    v = symbol_values(cfg, *lim)
    return {s.name: ref[s.name] if oracle[s.name] is None else oracle[s.name](v)
            for s in buffers}


@st.composite
def sized_sets(draw, cap=8 << 20):
    """(BufferSizes, max_batch_tokens, max_batch_size, config): sizes from the
    specs (checked against the test's own evaluation), or by hand, chosen to
    hit every branch of the row rule (multiples of M, of ceil16(M), neither, 0)."""
    buffers, oracle = draw(buffer_sets())
    cfg = draw(configs())
    lim = draw(limits)
    m, bs = lim[0], lim[3]
    if draw(st.booleans()):
        want = expected_sizes(buffers, oracle, cfg, lim)
        assume(sum(want.values()) <= cap)
        sizes = BufferSizes.from_config(cfg, *lim, env=NOENV, buffers=buffers)
        assert sizes.as_dict() == want
    else:
        pick = st.one_of(st.just(0), st.integers(1, 64).map(lambda k: k * m),
                         st.integers(1, 64).map(lambda k: k * _ceil(m, 16)),
                         st.integers(1, 20000), st.integers(1, 40).map(lambda k: 256 * k))
        sizes = BufferSizes(buffers, **{n: draw(pick) for n in buffers.names})
    return sizes, m, bs, cfg


# -- the placement rule and the zeroing rule, written out from the docs -------------------------

def slab_order(buffers):
    return sorted(range(len(buffers)), key=lambda i: (spec_part(buffers.specs[i]), i))


def plain_layout(buffers, sizes, guard=0):
    """name -> offset (None: empty), and the slab bytes: the placed buffers,
    then room to move the base (allocated at 256) up to the largest
    alignment a placed buffer asks for."""
    offsets, cur, base = {}, 0, ALIGN
    for i in slab_order(buffers):
        s = buffers.specs[i]
        n = sizes[s.name]
        if n == 0:
            offsets[s.name] = None
            continue
        cur = _ceil(cur, s.align)
        offsets[s.name] = cur
        base = max(base, s.align)
        cur = _ceil(cur + n, ALIGN) + guard
    return offsets, cur + (base - ALIGN if cur else 0)


def reserved_layout(buffers, top, gran, guard=0):
    """name -> (offset of its sub-range or None, room), and the reservation
    (with room to move the base, reserved at `gran`, up to the largest
    alignment)."""
    out, cur, base = {}, 0, gran
    for i in slab_order(buffers):
        s = buffers.specs[i]
        r = top[s.name]
        if r == 0:
            out[s.name] = (None, 0)
            continue
        cur = _ceil(cur, s.align)
        base = max(base, s.align)
        span = r if not guard else _ceil(r, ALIGN) + guard
        end = _ceil(cur + span, ALIGN if spec_part(s) in TIGHT_PARTS else gran)
        out[s.name] = (cur, end - cur)
        cur = end
    return out, cur + (base - gran if cur else 0)


def spec_rows_live(spec, n, m, tokens):
    """Bytes from its start that zero_all_rows(tokens) clears (by the spec's
    row rule, helpers.rows_live; nothing when it is not zero_all)."""
    return rows_live(spec.rows, n, m, tokens) if spec.zero_all else 0


def _merge(ranges):
    out = []
    for lo, hi in sorted(r for r in ranges if r[1] > r[0]):
        if out and out[-1][1] >= lo:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def cleared(buffers, sizes, offsets, live, contiguous, hole=None, group="zero_all"):
    """The byte ranges [lo, hi) a zeroing clears: each member's (of `group`:
    zero_all, or prefill) first live[name] bytes (less the 4 bytes of `hole`,
    a count read in place), and
    the padding after a member cleared to its last byte when the next member
    is cleared from its first: any padding on a plain layout, else only up to
    the next 256-byte boundary (kernels/zero_ranges.h, layout.c)."""
    members = [buffers.specs[i].name for i in slab_order(buffers)
               if getattr(buffers.specs[i], group) and sizes[buffers.specs[i].name]]
    out = []

    def is_cleared(name, byte):
        at = offsets[name] + byte
        return byte < live[name] and not (hole is not None and hole <= at < hole + 4)

    for j, name in enumerate(members):
        lo, n = offsets[name], sizes[name]
        hi = lo + live[name]
        if hole is not None and lo <= hole < hi:
            out += [(lo, hole), (hole + 4, hi)]
        else:
            out.append((lo, hi))
        if j + 1 < len(members):
            nxt = members[j + 1]
            end = lo + n
            if offsets[nxt] > end and is_cleared(name, n - 1) and is_cleared(nxt, 0) and \
                    (contiguous or _ceil(end, ALIGN) == offsets[nxt]):
                out.append((end, offsets[nxt]))
    return _merge(out)


def _spans(buffers, sizes, offsets):
    return {n: (offsets[n], offsets[n] + sizes[n]) for n in buffers.names if offsets[n] is not None}


# -- the properties of the plan ---------------------------------------------------------------

@given(buffer_sets(), configs(), limits)
def test_sizes_are_the_specs_evaluated(case, cfg, lim):
    buffers, oracle = case
    sizes = BufferSizes.from_config(cfg, *lim, env=NOENV, buffers=buffers)
    want = expected_sizes(buffers, oracle, cfg, lim)
    assert sizes.as_dict() == want
    assert sizes.total_bytes() == sum(want[s.name] for s in buffers if s.total)
    assert sizes.buffers is buffers and tuple(sizes) == buffers.names


@given(buffer_sets())
def test_sets_round_trip_through_their_files(case):
    buffers, _ = case
    data = json.loads(json.dumps(buffers.to_dict()))
    again = BufferSet.from_dict(data)
    assert again == buffers and again.fingerprint() == buffers.fingerprint()
    assert BufferSet.from_dict(buffers.to_dict(BufferSet())) == buffers


@given(sized_sets(cap=1 << 62), st.sampled_from([0, 0, 256, 4096]), st.data())
def test_the_plan_is_the_placement_rule(case, guard, data):
    sizes, m, _, _ = case
    buffers = sizes.buffers
    # sizes by hand carry no limits: only those are given max_batch_tokens
    plan = plan_layout(sizes, m if sizes.limits is None else None, guard_bytes=guard)
    offsets, slab = plain_layout(buffers, sizes, guard)
    assert plan.offsets == offsets and plan.slab_bytes == slab
    assert plan.slab_order == tuple(buffers.names[i] for i in slab_order(buffers))
    spans = _spans(buffers, sizes, offsets)
    # disjoint, inside the slab, each at its alignment
    ordered = sorted(spans.values())
    for (_, a_end), (b_lo, _) in zip(ordered, ordered[1:]):
        assert a_end <= b_lo
    for name, (lo, hi) in spans.items():
        assert lo % buffers[name].align == 0 and hi <= plan.slab_bytes
    # each group one span over exactly its members, only padding between
    for group, got in (("zero_all", plan.zero_all), ("prefill", plan.zero_prefill)):
        members = [n for n in buffers.groups[group] if n in spans]
        if not members:
            assert got == (0, 0)
            continue
        lo = min(spans[n][0] for n in members)
        hi = max(spans[n][1] for n in members)
        assert got == (lo, hi - lo), group
        for name, (a, b) in spans.items():             # nothing else inside: only padding
            assert name in members or b <= lo or a >= hi, (group, name)
    # the row rule, buffer by buffer and as ranges
    for tokens in {0, 1, m - 1, m, m + 1, data.draw(st.integers(0, 2 * m + 20))}:
        if tokens < 0:
            continue
        live = {n: spec_rows_live(buffers[n], sizes[n], m, tokens) for n in buffers.names}
        for n in buffers.names:
            want = sizes[n] if not buffers[n].zero_all else live[n]
            assert plan.rows_length(n, tokens) == want, (n, tokens)
        want = cleared(buffers, sizes, offsets, live, contiguous=not guard)
        assert [(lo, lo + n) for lo, n in plan.rows_ranges(tokens)] == want, tokens
        if tokens >= m and not guard and want:         # everything: zero_all's one span
            assert want == [(plan.zero_all[0], plan.zero_all[0] + plan.zero_all[1])]


@given(sized_sets(cap=1 << 62), st.sampled_from([256, 4096, 1 << 21]),
       st.sampled_from([0, 0, 512]), st.data())
def test_a_reserved_plan_is_the_placement_rule(case, gran, guard, data):
    sizes, m, _, _ = case
    buffers = sizes.buffers
    grow = data.draw(st.lists(st.integers(0, 3000), min_size=len(buffers),
                              max_size=len(buffers)))
    top = BufferSizes(buffers, **{n: sizes[n] + g for n, g in zip(buffers.names, grow)})
    plan = plan_reserved(sizes, top, m, gran, guard_bytes=guard)
    subs, total = reserved_layout(buffers, top, gran, guard)
    assert plan.reserved and plan.slab_bytes == total
    offsets = {n: subs[n][0] if sizes[n] else None for n in buffers.names}
    assert plan.offsets == offsets
    for name, (lo, room) in subs.items():
        if lo is None:
            continue
        s = buffers[name]
        assert lo % s.align == 0 and lo + room <= total
        band = 0 if not guard else _ceil(top[name], ALIGN) - top[name] + guard
        assert top[name] + band <= room                 # the reserved size fits its room
        if spec_part(s) not in TIGHT_PARTS:
            assert (lo + room) % gran == 0              # each sub-range ends on a granule
    ordered = sorted((lo, lo + room) for lo, room in subs.values() if lo is not None)
    for (_, a_end), (b_lo, _) in zip(ordered, ordered[1:]):
        assert a_end <= b_lo
    # what is mapped: each buffer's granules (token_ids' whole room)
    need = []
    for name, (lo, room) in subs.items():
        tight = spec_part(buffers[name]) in TIGHT_PARTS     # mapped empty too: in the span
        if lo is None or (sizes[name] == 0 and not tight):
            continue
        n = room if tight else \
            (sizes[name] if not guard else _ceil(sizes[name], ALIGN) + guard)
        need.append((_floor(lo, gran), _ceil(lo + n, gran)))
    assert plan.committed_bytes == sum(hi - lo for lo, hi in _merge(need))
    for tokens in {0, 1, m, data.draw(st.integers(0, 2 * m))}:
        live = {n: spec_rows_live(buffers[n], sizes[n], m, tokens) for n in buffers.names}
        want = cleared(buffers, sizes, offsets, live, contiguous=False)
        assert [(lo, lo + n) for lo, n in plan.rows_ranges(tokens)] == want, tokens


# -- sentinel fills on a backend ----------------------------------------------------------------

class Slab:
    """The bytes of an arena's slab, read and written whole: on the host
    through the memory itself, on a GPU through the backend's copies.  A
    reserved arena's slab is touched only where its buffers are mapped."""

    def __init__(self, arena, gpu, base, regions):
        self.arena, self.gpu, self.base, self.regions = arena, gpu, base, regions
        self.host = isinstance(gpu, HostBackend)

    def fill(self, value):
        for lo, hi in self.regions:
            if self.host:
                _host(self.base + lo, hi - lo)[:] = value
            else:
                self.gpu.upload(self.base + lo, bytes([value]) * (hi - lo))

    def write(self, at, data):
        if self.host:
            _host(self.base + at, len(data))[:] = np.frombuffer(data, np.uint8)
        else:
            self.gpu.upload(self.base + at, data)

    def read(self):
        """{region start: uint8 array of the region}."""
        if self.host:
            return {lo: _host(self.base + lo, hi - lo).copy() for lo, hi in self.regions}
        return {lo: np.frombuffer(self.gpu.download(self.base + lo, hi - lo), np.uint8)
                for lo, hi in self.regions}


def _host(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))


def check_bytes(slab, zeroed, spared=()):
    """Every byte in `zeroed` ranges is 0, every other one still the
    sentinel; `spared`: (offset, bytes) written by the test, to find as written."""
    got = slab.read()
    for lo, arr in got.items():
        hi = lo + len(arr)
        mask = np.zeros(len(arr), bool)
        for a, b in zeroed:
            a, b = max(a, lo), min(b, hi)
            if a < b:
                mask[a - lo:b - lo] = True
        keep = np.ones(len(arr), bool)
        for at, data in spared:
            a, b = max(at, lo), min(at + len(data), hi)
            if a < b:
                keep[a - lo:b - lo] = False
                assert arr[a - lo:b - lo].tobytes() == data[a - at:b - at], "a spared count changed"
        bad = np.flatnonzero(mask & keep & (arr != 0))
        assert not len(bad), f"byte {lo + bad[0]} of the slab not zeroed"
        bad = np.flatnonzero(~mask & keep & (arr != SENTINEL))
        assert not len(bad), f"byte {lo + bad[0]} of the slab changed (now {arr[bad[0]]})"


def run_sentinels(arena, gpu, sizes, offsets, m, contiguous, slab, data):
    buffers = sizes.buffers
    members = [n for n in buffers.groups["zero_all"] if offsets[n] is not None]
    whole = {n: sizes[n] if buffers[n].zero_all else 0 for n in buffers.names}
    spans = _spans(buffers, sizes, offsets)
    # zero_all: its one range (plain), or its members' merged ranges
    slab.fill(SENTINEL)
    arena.zero_all()
    if contiguous and members:
        lo = min(spans[n][0] for n in members)
        hi = max(spans[n][1] for n in members)
        check_bytes(slab, [(lo, hi)])
    else:
        check_bytes(slab, cleared(buffers, sizes, offsets, whole, contiguous))
    # zero_prefill_essentials: the prefill members' span
    slab.fill(SENTINEL)
    arena.zero_prefill_essentials()
    pre = [n for n in buffers.groups["prefill"] if offsets[n] is not None]
    if contiguous and pre:
        check_bytes(slab, [(min(spans[n][0] for n in pre), max(spans[n][1] for n in pre))])
    else:
        check_bytes(slab, cleared(buffers, sizes, offsets, whole, contiguous, group="prefill"))
    # zero_all_rows(tokens), tokens given
    for tokens in {0, 1, m, data.draw(st.integers(0, 2 * m), label="tokens")}:
        slab.fill(SENTINEL)
        arena.zero_all_rows(tokens=tokens)
        live = {n: spec_rows_live(buffers[n], sizes[n], m, tokens) for n in buffers.names}
        check_bytes(slab, cleared(buffers, sizes, offsets, live, contiguous))
    # zero_all_rows(tokens_at=...): the count read where it lies, inside a buffer
    roomy = [n for n in spans if sizes[n] >= 4]
    if roomy:
        name = data.draw(st.sampled_from(roomy), label="count in")
        at = offsets[name] + 4 * data.draw(st.integers(0, sizes[name] // 4 - 1), label="slot")
        count = data.draw(st.integers(-3, m + 3), label="count")
        raw = int(count).to_bytes(4, "little", signed=True)
        slab.fill(SENTINEL)
        slab.write(at, raw)
        arena.zero_all_rows(tokens_at=slab.base + at)
        t = m if count < 0 or count >= m else count
        live = {n: spec_rows_live(buffers[n], sizes[n], m, t) for n in buffers.names}
        check_bytes(slab, cleared(buffers, sizes, offsets, live, contiguous, hole=at),
                    spared=[(at, raw)])


def _mapped_regions(sizes, offsets, gran):
    """The granules each live buffer touches: mapped in a reserved arena.
    (Of a GPU's 2 MiB granules, only each buffer up to its next 256 bytes,
    which holds every byte a zeroing may clear: less to copy.)"""
    if gran > 1 << 16:
        return _merge([(offsets[n], _ceil(offsets[n] + sizes[n], ALIGN))
                       for n in sizes.buffers.names if offsets[n] is not None])
    return _merge([(_floor(offsets[n], gran), _ceil(offsets[n] + sizes[n], gran))
                   for n in sizes.buffers.names if offsets[n] is not None])


def _base_of(arena, offsets):
    bases = {arena.ptr(n) - off for n, off in offsets.items() if off is not None}
    assert len(bases) <= 1, "the pointers disagree with the plan's offsets"
    return bases.pop() if bases else None


def _largest_align(buffers, sizes, least=ALIGN):
    """The alignment a slab's base needs: the largest of its placed buffers'."""
    return max([least] + [s.align for s in buffers if sizes[s.name]])


def sentinel_plain(gpu, case, debug, data):
    sizes, m, bs, cfg = case
    guard = debug.guard_bytes if debug else 0
    offsets, slab_bytes = plain_layout(sizes.buffers, sizes, guard)
    before = live_counts(gpu)
    # sizes by hand carry no shape or limits: only those are given them (the older form)
    args = (sizes,) if sizes.limits is not None else (cfg, sizes, m, bs)
    with BufferArena.from_sizes(*args, gpu, debug=debug) as arena:
        assert arena.slab_bytes() == slab_bytes
        base = _base_of(arena, offsets)
        if base is None:
            return
        largest = _largest_align(sizes.buffers, sizes)
        assert base % largest == 0
        for s in sizes.buffers:
            assert arena.ptr(s.name) % s.align == 0 and arena.nbytes(s.name) == sizes[s.name]
        # from the aligned base: the slab less the room it moved up by at most
        slab = Slab(arena, gpu, base, [(0, slab_bytes - (largest - ALIGN))])
        run_sentinels(arena, gpu, sizes, offsets, m, not guard, slab, data)
    assert live_counts(gpu) == before


def sentinel_reserved(gpu, cfg, buffers, lim, top, after, data):
    gran = gpu.allocation_granularity()
    before = live_counts(gpu), vm_counts(gpu)
    with BufferArena.new(cfg, *lim, gpu, env=NOENV, buffers=buffers, reserve=top) as arena:
        top_sizes = BufferSizes.from_config(cfg, *top, target=gpu.target(), env=NOENV,
                                            buffers=buffers)
        subs, total = reserved_layout(buffers, top_sizes, gran)
        assert arena.slab_bytes() == total
        ptrs = dict(arena.ptrs)
        for limits in (lim, after):
            if limits is not lim:
                arena.resize(*limits)
                assert dict(arena.ptrs) == ptrs            # nothing moved
            sizes = arena.sizes()
            plan = plan_reserved(sizes, top_sizes, limits[0], gran)
            offsets = plan.offsets
            assert offsets == {n: subs[n][0] if sizes[n] else None for n in buffers.names}
            base = _base_of(arena, offsets)
            if base is None:
                continue
            assert base % _largest_align(buffers, top_sizes, gran) == 0
            slab = Slab(arena, gpu, base, _mapped_regions(sizes, offsets, gran))
            run_sentinels(arena, gpu, sizes, offsets, limits[0], False, slab, data)
    assert (live_counts(gpu), vm_counts(gpu)) == before


debug_options = st.one_of(st.none(), st.sampled_from([256, 1024]).map(DebugOptions))
# Function-scoped fixtures are not used: the backend is made inside each test.
_settings = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_settings
@given(sized_sets(), debug_options, st.data())
def test_sentinels_plain_host(case, debug, data):
    sentinel_plain(HostBackend(), case, debug, data)


@st.composite
def reserved_cases(draw):
    buffers, oracle = draw(buffer_sets())
    cfg = draw(configs())
    lim = draw(limits)
    top = tuple(max(a, b) for a, b in zip(lim, draw(limits)))
    top = top[:2] + (lim[2],) + top[3:]          # the block size is not a limit that grows
    after = tuple(draw(st.integers(1 if k in (0, 3) else 0, top[k])) if k != 2 else lim[2]
                  for k in range(4))
    most = expected_sizes(buffers, oracle, cfg, top)
    assume(sum(most.values()) <= 8 << 20)
    for at in (lim, after):         # a formula may shrink as a limit grows: not reservable
        sized = expected_sizes(buffers, oracle, cfg, at)
        assume(all(sized[n] <= most[n] for n in most))
    return cfg, buffers, lim, top, after


@_settings
@given(reserved_cases(), st.data())
def test_sentinels_reserved_host(case, data):
    cfg, buffers, lim, top, after = case
    sentinel_reserved(HostBackend(), cfg, buffers, lim, top, after, data)


# -- the same on a GPU ---------------------------------------------------------------------------

@pytest.mark.gpu
@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
@given(sized_sets(), debug_options, st.data())
def test_sentinels_plain_cuda(case, debug, data):
    gpu = cuda_backend()
    sentinel_plain(gpu, case, debug, data)
    gpu.synchronize()


@pytest.mark.gpu
@settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
@given(reserved_cases(), st.data())
def test_sentinels_reserved_cuda(case, data):
    cfg, buffers, lim, top, after = case
    gpu = cuda_backend()
    sentinel_reserved(gpu, cfg, buffers, lim, top, after, data)
    gpu.synchronize()
