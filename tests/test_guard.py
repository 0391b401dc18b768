"""Classes and guards (BufferSpec(tag=), metrale/_arena/_guard.pyx): which
classes a set has, what a guard covers, its refusal while they sleep, and
each class's wakes counted."""

import pytest

from helpers import CFG, LIMITS, NOENV
from reference_oracle import NAMES
from metrale import BufferArena, BufferSet, BufferSpec, HostBackend, MetraleError
from metrale.reference import REFERENCE

TOP = LIMITS
SET = BufferSet([
    BufferSpec("w_q", "bfloat16", ["H", "H"], tag="weights", wake="keep"),
    BufferSpec("kv", "bfloat16", ["max_seq_len", "H"], tag="kv"),
    BufferSpec("w_o", "bfloat16", ["H", "H"], tag="weights", wake="keep"),
    BufferSpec("acts", "bfloat16", ["M", "H"]),
])


def _arena(reserve=TOP, buffers=SET):
    return BufferArena.new(CFG, *LIMITS, HostBackend(), reserve=reserve, env=NOENV,
                           buffers=buffers)


def test_a_sets_classes_are_its_tags_in_order():
    assert SET.classes == {"weights": ("w_q", "w_o"), "kv": ("kv",), "default": ("acts",)}
    assert REFERENCE.classes == {"default": NAMES}          # the reference tags nothing
    assert SET["kv"].to_dict()["tag"] == "kv" and "tag" not in SET["acts"].to_dict()


@pytest.mark.parametrize("tag, error, words", [
    (3, TypeError, "tag must be a str"), ("two words", ValueError, "ASCII identifier"),
    ("ｋv", ValueError, "ASCII identifier"), ("x" * 65, ValueError, "at most 64"),
    ("torch", ValueError, "pool's class"),
])
def test_a_tag_not_understood_is_refused(tag, error, words):
    with pytest.raises(error, match=words):
        BufferSpec("b", "float32", ["M"], tag=tag)


def test_a_set_has_at_most_63_classes():
    specs = [BufferSpec(f"b{i}", "float32", ["M"], tag=f"t{i}") for i in range(64)]
    BufferSet(specs[:63])
    with pytest.raises(ValueError, match="at most 63 classes"):
        BufferSet(specs)


def test_a_guard_refuses_while_a_class_it_covers_sleeps():
    with _arena() as a:
        weights, everything = a.guard("weights"), a.guard()
        by_buffer = a.guard("kv", "w_o")        # buffer names: their classes
        assert weights.classes == ("weights",) and by_buffer.classes == ("weights", "kv")
        assert everything.classes == ("weights", "kv", "default")
        for g in (weights, everything, by_buffer):
            g.check()
            assert g.asleep == ()
        a.sleep()
        for g in (weights, everything, by_buffer):
            with pytest.raises(MetraleError, match="asleep") as e:
                g.check()
            assert all(c in str(e.value) for c in g.classes)
            assert g.asleep == g.classes
        a.wake()
        for g in (weights, everything, by_buffer):
            g.check()


def test_each_wake_counts_in_its_classes_epochs():
    with _arena() as a:
        g = a.guard()
        assert g.epochs == {"weights": 0, "kv": 0, "default": 0}
        for n in range(1, 4):
            a.sleep()
            assert g.epochs == dict.fromkeys(g.classes, n - 1)     # asleep: not yet
            assert a.memory_stats()["classes_asleep"] == ["weights", "kv", "default"]
            a.wake()
            assert g.epochs == dict.fromkeys(g.classes, n) == a.memory_stats()["class_epochs"]
            assert a.memory_stats()["classes_asleep"] == []


def test_the_pools_class_is_torch():
    with _arena() as a:
        with pytest.raises(ValueError, match="has none"):
            a.guard("torch")
        a.open_pool(4 * 4096)
        g = a.guard("torch")
        assert g.classes == ("torch",) and "torch" in a.guard().classes
        a.sleep()
        with pytest.raises(MetraleError, match="torch, asleep"):
            g.check()
        a.wake()
        g.check()
        assert g.epochs == {"torch": 1}


@pytest.mark.parametrize("names, error, words", [
    (("nope",), ValueError, "not a class"), (("kv", 3), TypeError, r"names\[1\]"),
])
def test_a_guard_of_what_the_arena_lacks_is_refused(names, error, words):
    with _arena() as a:
        with pytest.raises(error, match=words):
            a.guard(*names)


def test_a_guard_outlives_its_arena_and_then_refuses():
    a = _arena()
    g = a.guard("kv")
    a.release()
    with pytest.raises(MetraleError, match="released"):
        g.check()
    del a
    with pytest.raises(MetraleError, match="released"):
        g.check()


def test_an_arena_that_never_sleeps_has_nothing_to_guard():
    with _arena(reserve=None) as a:
        with pytest.raises(MetraleError, match="no reservation"):
            a.guard()


def test_a_failed_sleep_leaves_the_classes_awake():
    from metrale.testing import FaultyBackend
    gpu = FaultyBackend()
    with BufferArena.new(CFG, *LIMITS, gpu, reserve=TOP, env=NOENV, buffers=SET) as a:
        g = a.guard()
        gpu.inject_fault("copy")                # the first copy out of a kept buffer
        with pytest.raises(MetraleError):
            a.sleep()
        gpu.clear_faults()
        assert not a.is_sleeping()
        g.check()
        assert g.epochs == dict.fromkeys(g.classes, 0)


def test_a_wrapped_call_runs_only_while_its_classes_are_awake():
    with _arena() as a:
        calls = []
        run = a.guard("kv").wrap(lambda *args: calls.append(args) or len(calls))
        assert run(1, 2) == 1 and calls == [(1, 2)]
        assert run.guard.classes == ("kv",)
        a.sleep(tags="kv")
        with pytest.raises(MetraleError, match="touches kv, asleep"):
            run()
        assert calls == [(1, 2)]                # nothing called
        a.guard("weights").wrap(calls.clear)()  # another class: awake
        assert calls == []
        a.wake(tags="kv")
        assert run() == 1
    with pytest.raises(MetraleError, match="released"):
        run()
    with pytest.raises(TypeError, match="fn must be callable"):
        _arena().guard().wrap(3)
