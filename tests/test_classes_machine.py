"""A stateful property test (hypothesis) of the wake contracts and of classes
sleeping apart, against a model of the contracts written here.

hypothesis drives random sequences of sleeps (whole or of some classes, each
buffer as its contract says or as keep / offload / discard name it), wakes
(whole or partial), resizes, trims, new views, writes and guarded passes over
an arena of three classes and a pool, with faults injected into the backend.
After every step: each awake buffer holds what the model says (the bytes
written, kept and offloaded bytes, zeros, its fill), an offloaded buffer is
readable while asleep, every sleeping class has no memory mapped, a guarded
pass over a sleeping class raises and writes nothing; after release nothing is
held.

Sequences: METRALE_CLASSES_EXAMPLES (10,000 by default in CI; the "long"
hypothesis profile's count when that profile is loaded and this is unset).
"""

import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant,  # noqa: E402
                                 precondition, rule)

from metrale import BufferArena, MetraleError  # noqa: E402
from metrale.testing import FaultyBackend  # noqa: E402

from helpers import CFG, LIMITS, NOENV, _host_bytes, vm_counts  # noqa: E402
from test_classes import CLASSES, FRESH, G, TAGGED  # noqa: E402

KINDS = {n: TAGGED[n].wake for n in TAGGED.names}
CLASS_OF = {n: c for c, names in CLASSES.items() for n in names}
ORDER = ("weights", "kv", "activations")
POOL_BYTES = 2 * G
SLEEP_FAULTS = ("copy", "map", "create", "host_alloc", "reserve")


def _fill(name, n):
    """The bytes of buffer `name`'s fill, written out: kv_scale is float32 1.0."""
    assert KINDS[name] == "fill:1.0"
    return np.frombuffer(np.ones(n // 4, "<f4").tobytes(), np.uint8).copy()


def _woken(fate, name, n, kept):
    """What `wake` gives a buffer of `n` bytes: its kept bytes (a prefix of them
    after a shrink; after a growth, what its contract gives after them), zeros,
    its fill, or None (undefined)."""
    if fate == "bytes":
        # past the bytes kept (a growth while asleep): what its contract gives
        kind = KINDS[name] if name is not None else "zero"
        if kept is None or (n > kept.size and kind == "undefined"):
            return None
        out = _fill(name, n) if kind.startswith("fill") else np.zeros(n, np.uint8)
        k = min(n, kept.size)
        out[:k] = kept[:k]
        return out
    if fate == "zero":
        return np.zeros(n, np.uint8)
    if fate == "fill":
        return _fill(name, n)
    return None


class ClassesMachine(RuleBasedStateMachine):

    def __init__(self):
        super().__init__()
        self.gpu = FaultyBackend(fresh=FRESH)
        self.arena = None

    @initialize(m=st.sampled_from([8, 16, LIMITS[0]]), pool=st.sampled_from(
        [None, "zero", "offload", "undefined"]))
    def build(self, m, pool):
        self.arena = a = BufferArena.new(CFG, m, *LIMITS[1:], self.gpu, reserve=LIMITS,
                                         env=NOENV, buffers=TAGGED)
        self.asleep = set()
        self.model = {n: None for n in TAGGED.names}     # bytes, or None: unknown
        for n in TAGGED.names:
            if KINDS[n] == "fill:1.0":
                self.model[n] = _fill(n, a.nbytes(n))
        self.pending = {}           # asleep: name -> (fate, kept bytes)
        self.offloaded = {}         # asleep and offloaded: name -> bytes readable meanwhile
        self.pool = None
        if pool is not None:
            self.pool = a.open_pool(8 * G, wake=pool)
            self.seg = self.pool.alloc(POOL_BYTES)
            _host_bytes(self.seg, POOL_BYTES)[:] = 0x66
            self.seg_model = np.full(POOL_BYTES, 0x66, np.uint8)
            self.seg_pending = None

    # -- the model's view of the arena ----------------------------------------------------

    def classes(self):
        return ORDER + (("torch",) if self.pool is not None else ())

    def awake(self, name):
        return CLASS_OF[name] not in self.asleep

    def read(self, name):
        return _host_bytes(self.arena.ptr(name), self.arena.nbytes(name)).copy()

    # -- rules ------------------------------------------------------------------------------

    @rule(data=st.data())
    def write(self, data):
        names = [n for n in TAGGED.names if self.awake(n) and self.arena.nbytes(n)]
        if not names:
            return
        n = data.draw(st.sampled_from(names))
        byte = data.draw(st.integers(1, 250))
        m = _host_bytes(self.arena.ptr(n), self.arena.nbytes(n))
        m[:] = (np.arange(m.size) + byte) % 251 + 1
        self.model[n] = m.copy()

    @rule(data=st.data(), fault=st.sampled_from((None,) + SLEEP_FAULTS),
          nth=st.integers(1, 3))
    def sleep(self, data, fault, nth):
        a = self.arena
        awake = [c for c in self.classes() if c not in self.asleep]
        whole = data.draw(st.booleans())
        tags = None if whole else data.draw(st.lists(st.sampled_from(self.classes()),
                                                     min_size=1, max_size=2, unique=True))
        going = awake if tags is None else tags
        members = [n for c in going if c != "torch" for n in CLASSES[c]]
        picks = data.draw(st.lists(st.sampled_from(members), unique=True, max_size=3)) \
            if members else []
        split = data.draw(st.lists(st.sampled_from(("keep", "offload", "discard")),
                                   min_size=len(picks), max_size=len(picks)))
        named = {k: [n for n, s in zip(picks, split) if s == k]
                 for k in ("keep", "offload", "discard")}
        pool_word = data.draw(st.sampled_from((None, "offload", "discard"))) \
            if "torch" in going else None
        if pool_word is not None:
            named[pool_word].append("torch")
        refused = not going or (tags is not None and any(c in self.asleep for c in tags))
        if fault is not None:
            self.gpu.inject_fault(fault, nth)
        try:
            a.sleep(tags=tags, **named)
        except MetraleError as e:
            self.gpu.clear_faults()
            if refused:
                return
            # a fault: every class awake as before (a copy, host memory, a
            # mapping: nothing changed, or undone), the kept and offloaded bytes
            # in place; the others' are unknown (as before, or their contract's)
            assert fault is not None, e
            assert set(a.memory_stats()["classes_asleep"]) == self.asleep, e
            for n in members:
                if self._fate(n, named)[0] != "bytes":
                    self.model[n] = None
            if "torch" in going and not self._pool_kept(named):
                self.seg_model = None
            return
        self.gpu.clear_faults()
        assert not refused
        self.asleep |= set(going)
        for n in members:
            fate, how = self._fate(n, named)
            self.pending[n] = (fate, self.model[n] if fate == "bytes" else None)
            if how == "offload":
                self.offloaded[n] = self.model[n]
        if "torch" in going:
            w = self.pool.wake
            self.seg_pending = ("bytes", self.seg_model) if self._pool_kept(named) else \
                ("zero", None) if w != "undefined" else (None, None)

    def _fate(self, n, named):
        """(what wake gives it, how it sleeps) for buffer `n` of a sleeping class."""
        kind = KINDS[n]
        if n in named["keep"]:
            return "bytes", "keep"
        if n in named["offload"]:
            return "bytes", "offload"
        if n in named["discard"]:
            return ("zero" if kind in ("keep", "offload", "zero") else
                    "fill" if kind.startswith("fill") else None), "discard"
        if kind in ("keep", "offload"):
            return "bytes", kind
        return ("zero" if kind == "zero" else "fill" if kind.startswith("fill") else None), \
            "discard"

    def _pool_kept(self, named):
        return "torch" in named["offload"] or (self.pool.wake == "offload"
                                               and "torch" not in named["discard"])

    @rule(data=st.data(), fault=st.sampled_from((None, "map", "create", "copy", "host_alloc")),
          nth=st.integers(1, 3))
    def wake(self, data, fault, nth):
        a = self.arena
        whole = data.draw(st.booleans())
        tags = None if whole else data.draw(st.lists(st.sampled_from(self.classes()),
                                                     min_size=1, max_size=2, unique=True))
        waking = sorted(self.asleep) if tags is None else tags
        refused = not waking or any(c not in self.asleep for c in waking)
        if fault is not None:
            self.gpu.inject_fault(fault, nth)
        try:
            a.wake(tags=tags)
        except MetraleError as e:
            self.gpu.clear_faults()
            assert refused or fault is not None, e
            assert set(a.memory_stats()["classes_asleep"]) == self.asleep, e
            return
        self.gpu.clear_faults()
        assert not refused
        self.asleep -= set(waking)
        for c in waking:
            if c == "torch":
                fate, kept = self.seg_pending
                self.seg_model = _woken(fate, None, POOL_BYTES, kept) if fate else None
                continue
            for n in CLASSES[c]:
                fate, kept = self.pending.pop(n)
                self.offloaded.pop(n, None)
                self.model[n] = _woken(fate, n, a.nbytes(n), kept)

    @rule(m=st.sampled_from([4, 8, 16, LIMITS[0]]))
    def resize(self, m):
        a = self.arena
        classes = set(self.asleep) - {"torch"}
        partial = bool(classes) and classes != set(ORDER)
        before = {n: a.nbytes(n) for n in TAGGED.names}
        try:
            a.resize(m)
        except MetraleError as e:
            assert partial, e
            assert {n: a.nbytes(n) for n in TAGGED.names} == before
            return
        assert not partial
        for n in TAGGED.names:
            if a.nbytes(n) == before[n]:
                continue
            if self.awake(n):
                # the bytes both sizes hold stay; a grown tail is new memory,
                # a fill buffer filled again whole
                if KINDS[n] == "fill:1.0":
                    self.model[n] = _fill(n, a.nbytes(n))
                else:
                    self.model[n] = None
            # asleep: wake gives the contract at the new size (_woken)

    @rule()
    def trim(self):
        assert self.arena.trim() >= 0

    @rule(data=st.data())
    def view(self, data):
        n = data.draw(st.sampled_from(TAGGED.names))
        if not self.arena.nbytes(n):
            return
        try:
            v = self.arena.view(n, "uint8")
        except MetraleError as e:
            assert not self.awake(n), e
            return
        assert self.awake(n)
        del v

    @rule(data=st.data())
    def guarded_pass(self, data):
        uses = data.draw(st.lists(st.sampled_from(self.classes()), min_size=1, unique=True))
        g = self.arena.guard(*uses)
        sleeping = [c for c in uses if c in self.asleep]
        try:
            g.check()
        except MetraleError as e:
            assert sleeping and all(c in str(e) for c in sleeping), e
            return                      # refused: nothing written
        assert not sleeping
        for c in uses:                  # the pass: a kernel over its classes' buffers
            for n in CLASSES.get(c, ()):
                if self.arena.nbytes(n):
                    m = _host_bytes(self.arena.ptr(n), self.arena.nbytes(n))
                    m[:] = 0x21
                    self.model[n] = m.copy()
                    break

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def contracts_hold(self):
        if self.arena is None:
            return
        a = self.arena
        stats = a.memory_stats()
        assert stats["classes_asleep"] == [c for c in self.classes() if c in self.asleep]
        for c in a.summary().classes:
            if c.asleep:
                assert c.committed_bytes == 0, c
        for n in TAGGED.names:
            if not a.nbytes(n):
                continue
            if self.awake(n):
                want = self.model[n]
                if want is not None:
                    assert np.array_equal(self.read(n), want), n
            elif n in self.offloaded and self.offloaded[n] is not None:
                # the bytes it had are mapped at its addresses (a growth while
                # asleep maps nothing past them until the wake)
                k = min(a.nbytes(n), self.offloaded[n].size)
                assert np.array_equal(_host_bytes(a.ptr(n), k), self.offloaded[n][:k]), n
        if self.pool is not None and "torch" not in self.asleep and self.seg_model is not None:
            assert np.array_equal(_host_bytes(self.seg, POOL_BYTES), self.seg_model)

    def teardown(self):
        if self.arena is None:
            return
        if self.pool is not None:
            self.pool.free(self.seg, POOL_BYTES)
        self.arena.release()
        assert vm_counts(self.gpu) == (0, 0, 0)
        assert self.gpu.host_handle_count == 0 and self.gpu.live_host_alloc_count == 0
        self.arena = None


def _examples():
    given = os.environ.get("METRALE_CLASSES_EXAMPLES")
    if given:
        return int(given)
    if os.environ.get("METRALE_HYPOTHESIS_PROFILE") == "long":
        return hypothesis.settings().max_examples
    return 10_000


ClassesMachine.TestCase.settings = hypothesis.settings(
    hypothesis.settings.default, max_examples=_examples(), stateful_step_count=12)
test_classes_state_machine = ClassesMachine.TestCase
