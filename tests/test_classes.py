"""Classes (`BufferSpec(tag=...)`, the pool's "torch") sleeping and waking
apart (_arena/_sleep.pyx, docs/stable-addresses.md): each class's chunks
given back and mapped again alone, the others' memory, views and bytes
untouched, each buffer woken as its contract says, never a class slept or
woken twice; checked against sentinel bytes, the granules each class's
buffers span (written out from the sizes) and the backend's own counts."""

import numpy as np
import pytest

from helpers import CFG, COMPACT, LIMITS, NOENV, RESERVE, _host_bytes, vm_counts
from metrale import BufferArena, BufferSet, BufferSpec, MetraleError
from metrale.reference import REFERENCE
from metrale.testing import FaultyBackend

FRESH = 0xC3            # new device memory holds this byte: a missing zero shows
G = 4096                # the testing backend's granule

# An engine's classes, interleaved in address order: weights (kept), the KV
# cache (zeroed, with a constant scale), activations (zeroed, a zero_all
# buffer and an undefined scratch), and more weights after them.
TAGGED = BufferSet([
    BufferSpec("wq", "bfloat16", ["H", "H"], wake="keep", tag="weights"),
    BufferSpec("kv", "bfloat16", ["max_seq_len", "H"], tag="kv"),
    BufferSpec("kv_scale", "float32", ["max_seq_len", 4], wake="fill:1.0", tag="kv"),
    BufferSpec("acts", "bfloat16", ["M", "H"], tag="activations"),
    BufferSpec("logits_z", "float32", ["M", 8], zero_all=True, tag="activations"),
    BufferSpec("scratch", "uint8", ["M", 100], wake="undefined", tag="activations"),
    BufferSpec("lm_head", "bfloat16", ["H", 64], wake="keep", tag="weights"),
])
CLASSES = {"weights": ("wq", "lm_head"), "kv": ("kv", "kv_scale"),
           "activations": ("acts", "logits_z", "scratch")}


def _arena(gpu=None, m=LIMITS[0]):
    gpu = FaultyBackend(fresh=FRESH) if gpu is None else gpu
    return BufferArena.new(CFG, m, *LIMITS[1:], gpu, reserve=LIMITS, env=NOENV, buffers=TAGGED)


def _mem(a, name):
    return _host_bytes(a.ptr(name), a.nbytes(name))


def _stamp(a, names=TAGGED.names):
    out = {}
    for k, n in enumerate(names):
        m = _mem(a, n)
        m[:] = (np.arange(m.size) * 5 + 13 * k) % 251 + 1
        out[n] = m.copy()
    return out


def _granules(a, names):
    """The bytes of whole granules the buffers span (each starts on one in a
    reserved arena, and no two classes share one)."""
    return sum(-(-a.nbytes(n) // G) * G for n in names)


def _woke(a, before, cls):
    """Each buffer of class `cls` as its contract gives it after a wake."""
    for n in CLASSES[cls]:
        got, wake = _mem(a, n), TAGGED[n].wake
        if wake == "keep":
            assert np.array_equal(got, before[n]), n
        elif wake == "zero":
            assert not got.any(), n
        elif wake == "undefined":
            assert (got == FRESH).all(), n
        else:
            assert (np.frombuffer(got.tobytes(), "<f4") == 1.0).all(), n


def _untouched(a, before, classes):
    for cls in classes:
        for n in CLASSES[cls]:
            assert np.array_equal(_mem(a, n), before[n]), n


def test_the_classes_are_the_tags_in_order():
    assert list(TAGGED.classes) == ["weights", "kv", "activations"]
    assert TAGGED.classes["weights"] == ("wq", "lm_head")


def test_one_class_sleeps_and_wakes_alone():
    gpu = FaultyBackend(fresh=FRESH)
    with _arena(gpu) as a:
        before = _stamp(a)
        full = a.committed_bytes()
        assert full == _granules(a, TAGGED.names)
        ptrs = {n: a.ptr(n) for n in TAGGED.names}
        weights = a.view("wq", "uint8")         # a view of a class left awake stays
        a.sleep(tags=["kv"])
        assert a.committed_bytes() == full - _granules(a, CLASSES["kv"])
        assert vm_counts(gpu)[1] == a.committed_bytes()       # the backend's own count
        assert a.is_sleeping() and a.memory_stats()["classes_asleep"] == ["kv"]
        _untouched(a, before, ["weights", "activations"])
        a.guard("weights", "activations").check()
        with pytest.raises(MetraleError, match="touches kv, asleep"):
            a.guard("weights", "kv").check()
        with pytest.raises(MetraleError, match="kv_scale is of the class 'kv', asleep"):
            a.view("kv_scale", "uint8")
        np.asarray(a.view("acts", "uint8"))[:] = 9      # a new view of an awake class
        before["acts"][:] = 9
        a.wake(tags="kv")
        assert a.committed_bytes() == full and not a.is_sleeping()
        assert {n: a.ptr(n) for n in TAGGED.names} == ptrs
        _woke(a, before, "kv")
        _untouched(a, before, ["weights", "activations"])
        assert np.array_equal(np.asarray(weights), before["wq"])
        del weights
        assert vm_counts(gpu)[1] == full


def test_a_staged_wake_gives_each_class_its_contract_when_it_wakes():
    with _arena() as a:
        before = _stamp(a)
        g = a.guard("weights")
        epochs = dict(a.guard().epochs)
        a.sleep()
        assert a.committed_bytes() == 0
        assert a.memory_stats()["classes_asleep"] == ["weights", "kv", "activations"]
        a.wake(tags=["weights"])
        assert a.committed_bytes() == _granules(a, CLASSES["weights"])
        _woke(a, before, "weights")
        g.check()
        assert g.epochs == {"weights": epochs["weights"] + 1}
        np.asarray(a.view("wq", "uint8"))[:] = 3        # a refit writes the weights
        with pytest.raises(MetraleError, match="classes kv, activations sleep"):
            a.zero_all()                # the arena's operations wait for every class
        with pytest.raises(MetraleError, match="touches kv, activations"):
            a.guard().check()
        a.wake(tags="kv")
        _woke(a, before, "kv")
        assert a.memory_stats()["classes_asleep"] == ["activations"]
        a.wake()                        # the rest
        _woke(a, before, "activations")
        assert (_mem(a, "wq") == 3).all()
        assert a.guard().epochs == {k: v + 1 for k, v in epochs.items()}
        a.zero_all()


def test_a_partial_sleep_after_a_partial_wake_keeps_the_new_bytes():
    with _arena() as a:
        _stamp(a)
        a.sleep()
        a.wake(tags="weights")
        new = _stamp(a, CLASSES["weights"])    # the new weights
        a.sleep(tags="weights")         # asleep again before the others woke
        assert a.committed_bytes() == 0
        a.wake()
        for n in CLASSES["weights"]:
            assert np.array_equal(_mem(a, n), new[n]), n
        _woke(a, new, "weights")


@pytest.mark.parametrize("first, then, words", [
    (lambda a: a.sleep(tags="kv"), lambda a: a.sleep(tags="kv"), "sleep: kv already sleeps"),
    (lambda a: a.sleep(tags="kv"), lambda a: a.sleep(tags=["weights", "kv"]),
     "sleep: kv already sleeps"),
    (lambda a: a.sleep(), lambda a: a.sleep(), "already sleeping"),
    (lambda a: a.sleep(tags="kv"), lambda a: a.wake(tags="weights"),
     "wake: weights is not sleeping"),
    (lambda a: None, lambda a: a.wake(), "wake: the buffer arena is not sleeping"),
    (lambda a: a.sleep(tags="kv"), lambda a: a.sleep(keep=["kv"]),
     "kv: of a class already asleep"),
    (lambda a: a.sleep(tags="kv"), lambda a: a.resize(8), "some classes of the arena sleep"),
    (lambda a: a.sleep(tags="kv"), lambda a: a.prepare_sleep(tags="kv"), "kv already sleeps"),
])
def test_a_class_never_sleeps_or_wakes_twice(first, then, words):
    gpu = FaultyBackend(fresh=FRESH)
    with _arena(gpu) as a:
        _stamp(a)
        first(a)
        state = (a.committed_bytes(), a.memory_stats()["classes_asleep"], vm_counts(gpu))
        for op in ("map", "unmap", "create", "copy"):
            gpu.inject_fault(op, 1)             # fires if the refused call reaches the backend
        with pytest.raises(MetraleError, match=words):
            then(a)
        armed = repr(gpu).split("armed=")[1].split("}")[0]
        assert all(f"'{op}'" in armed for op in ("map", "unmap", "create", "copy")), armed
        gpu.clear_faults()
        assert (a.committed_bytes(), a.memory_stats()["classes_asleep"], vm_counts(gpu)) == state
        a.wake() if a.is_sleeping() else None
        assert a.committed_bytes() == _granules(a, TAGGED.names)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(tags="nope"), ValueError, "'nope' is not a class of the arena"),
    (dict(tags=[]), ValueError, "tags is empty"),
    (dict(tags=[1]), TypeError, r"tags\[0\] must be a str"),
    (dict(tags=3), TypeError, "tags must be a class name"),
    (dict(tags="torch"), ValueError, "has none"),
    (dict(tags="kv", keep=["wq"]), ValueError, "keep: wq: of a class that tags leaves out"),
    (dict(tags="kv", offload=["acts"]), ValueError, "offload: acts"),
])
def test_sleep_refuses_classes_it_cannot_follow(kwargs, error, words):
    with _arena() as a:
        before = _stamp(a)
        with pytest.raises(error, match=words):
            a.sleep(**kwargs)
        assert not a.is_sleeping()
        _untouched(a, before, CLASSES)


def test_an_offloaded_class_is_readable_while_it_sleeps_and_the_others_wake():
    with _arena() as a:
        before = _stamp(a)
        kv = a.view("kv", "uint8")
        a.sleep(offload=["kv"], tags=["kv", "activations"])
        assert np.array_equal(np.asarray(kv), before["kv"])     # host memory at its address
        a.wake(tags="activations")
        _woke(a, before, "activations")
        assert np.array_equal(np.asarray(kv), before["kv"])
        a.wake()
        assert np.array_equal(np.asarray(kv), before["kv"])
        # each class's host memory is its own: made once, reused
        held = a.memory_stats()["host_offload_bytes"]
        a.sleep(offload=["kv"], tags="kv")
        a.sleep(keep=["acts"], tags="activations")
        assert a.memory_stats()["host_offload_bytes"] == held
        a.wake(tags="activations")
        a.wake(tags="kv")
        assert np.array_equal(np.asarray(kv), before["kv"])
        del kv


def test_the_pool_sleeps_as_its_own_class():
    with _arena() as a:
        pool = a.open_pool(8 * G, wake="offload")
        p = pool.alloc(2 * G)
        _host_bytes(p, 2 * G)[:] = 0x77
        before = _stamp(a)
        a.sleep(tags="torch")
        assert not a.is_sleeping()              # the buffers are awake
        assert a.memory_stats()["classes_asleep"] == ["torch"]
        a.zero_all()                            # and the arena's operations work
        with pytest.raises(MetraleError, match="touches torch"):
            a.guard("torch").check()
        a.guard("weights", "kv", "activations").check()
        assert (_host_bytes(p, 2 * G) == 0x77).all()
        a.wake(tags=["torch"])
        assert (_host_bytes(p, 2 * G) == 0x77).all()
        before["logits_z"][:] = 0
        _untouched(a, before, CLASSES)
        a.sleep(tags=["kv"])
        a.sleep()                               # the rest: the pool and two classes
        assert a.memory_stats()["classes_asleep"] == ["weights", "kv", "activations", "torch"]
        a.wake(tags=["torch", "weights"])
        assert (_host_bytes(p, 2 * G) == 0x77).all()
        _woke(a, before, "weights")
        a.wake()
        pool.free(p, 2 * G)


def test_a_resize_of_an_arena_asleep_whole_wakes_each_class_at_the_new_limits():
    with _arena(m=16) as a:
        before = _stamp(a)
        a.sleep()
        a.resize(LIMITS[0])
        a.wake(tags="activations")              # at the new sizes
        assert a.nbytes("acts") == LIMITS[0] * CFG.hidden_size * 2 > before["acts"].size
        _woke(a, before, "activations")
        a.wake()
        _woke(a, before, "weights")
        assert a.committed_bytes() == _granules(a, TAGGED.names)


def test_a_failed_partial_sleep_or_wake_changes_no_class():
    gpu = FaultyBackend(fresh=FRESH)
    with _arena(gpu) as a:
        before = _stamp(a)
        gpu.inject_fault("copy", 1)             # the kept weights' copy out
        with pytest.raises(MetraleError):
            a.sleep(tags="weights")
        gpu.clear_faults()
        assert not a.is_sleeping()
        _untouched(a, before, CLASSES)
        a.sleep(tags=["weights", "kv"])
        gpu.inject_fault("map", 2)
        with pytest.raises(MetraleError):
            a.wake(tags=["weights", "kv"])
        gpu.clear_faults()
        assert a.memory_stats()["classes_asleep"] == ["weights", "kv"]
        _untouched(a, before, ["activations"])
        a.wake(tags="kv")
        a.wake(tags="weights")
        _woke(a, before, "weights")
        _woke(a, before, "kv")


def test_release_of_a_partly_asleep_arena_gives_everything_back():
    gpu = FaultyBackend(fresh=FRESH)
    a = _arena(gpu)
    _stamp(a)
    a.sleep(offload=["kv"], tags="kv")
    a.sleep(keep=["acts"], tags="activations")
    a.release()
    assert vm_counts(gpu) == (0, 0, 0) and gpu.host_handle_count == 0
    assert gpu.live_host_alloc_count == 0


def test_buffers_sharing_a_granule_must_share_a_class():
    own = REFERENCE.replace("token_ids", tag="inputs")
    with pytest.raises(ValueError, match="token_ids and scratch share a granule"):
        BufferArena.new(COMPACT, 64, *RESERVE[1:], FaultyBackend(), reserve=RESERVE, env=NOENV,
                        buffers=own)


def test_summary_and_pins_report_each_class():
    with _arena() as a:
        a.sleep(tags="kv")
        view = a.view("wq", "uint8")
        got = {c.name: c for c in a.summary().classes}
        assert list(got) == ["weights", "kv", "activations"]
        for cls, names in CLASSES.items():
            c = got[cls]
            assert c.buffers == names and c.asleep == (cls == "kv")
            assert c.committed_bytes == (0 if cls == "kv" else _granules(a, names))
            assert c.epoch == 0
        assert "kv (asleep, 0 bytes mapped, woken 0x)" in str(a.summary())
        assert [(p.kind, p.name, p.count, p.tag) for p in a.pins()] == \
            [("view", "wq", 1, "weights")]
        del view
        with pytest.raises(MetraleError, match="sleeping"):
            a.open_pool(4 * G)              # a pool opens on an arena awake whole
        a.wake(tags="kv")
        pool = a.open_pool(4 * G)
        p = pool.alloc(G)
        assert a.pins()[-1].tag == "torch"
        c = a.summary().classes[-1]
        assert (c.name, c.buffers, c.asleep, c.committed_bytes) == ("torch", (), False, G)
        assert a.summary().classes[1].epoch == 1
        pool.free(p, G)


def test_a_pool_closed_asleep_leaves_no_class_asleep():
    with _arena() as a:
        a.open_pool(4 * G)
        a.sleep(tags="torch")
        a.close_pool()
        assert a.memory_stats()["classes_asleep"] == [] and not a.is_sleeping()
        pool = a.open_pool(4 * G)               # a new pool, awake
        a.sleep(tags="torch")
        assert a.memory_stats()["classes_asleep"] == ["torch"]
        a.wake()
        pool.free(pool.alloc(G), G)
