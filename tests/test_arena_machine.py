"""A stateful property-based test (hypothesis) over the whole lifetime of a
reserved arena.

Profiles (conftest.py): "ci" is deterministic with a bounded example count;
METRALE_HYPOTHESIS_PROFILE=long runs many more examples locally.
"""

import pytest

hypothesis = pytest.importorskip("hypothesis")
np = pytest.importorskip("numpy")
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant,  # noqa: E402
                                 precondition, rule)

from metrale import BufferArena, BufferSizes, MetraleError, OutOfMemoryError  # noqa: E402
from metrale.sizes import BUFFER_NAMES  # noqa: E402
from metrale.testing import FaultyBackend  # noqa: E402

from helpers import COMPACT, vm_counts  # noqa: E402
from reference_oracle import ROWS, ZERO_ALL  # noqa: E402


# -- a stateful test over the whole lifetime of a reserved arena -------------------------------
#
# hypothesis drives any sequence of construction, resize, sleep, wake, views,
# step inputs, zeroing, debug operations, injected faults and release.  Each
# call either succeeds or raises one of the exceptions its docstring lists for
# the state the model says the arena is in; the invariants hold after every
# step; after release nothing is reserved, mapped, allocated or open.

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
            k = expected_rows_length(name, n, self.m, tokens)
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
