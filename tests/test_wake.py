"""Wake contracts (metrale/_sizing/_wake.py, _arena/_fresh.pyx): what each
buffer, and the pool, gets from `wake`, checked against sentinel bytes and
the element encodings written out by hand."""

import struct

import numpy as np
import pytest

from helpers import CFG, COMPACT, LIMITS, NOENV, RESERVE, _host_bytes
from metrale import MINIMAL, BufferArena, BufferSet, BufferSpec
from metrale.reference import REFERENCE
from metrale._sizing._wake import fills_of
from metrale.testing import FaultyBackend

SENTINEL = 0x5A


# -- the contract in the spec ----------------------------------------------------------------

def _pattern(wake, dtype):
    return fills_of(BufferSet([BufferSpec("x", dtype, ["M"], wake=wake)]))[0][1]


@pytest.mark.parametrize("wake, dtype, element", [
    # bfloat16: float32's upper half (1.0 = 0x3F80), ties to even (1 + 2**-8 lies
    # halfway between 1 and 1 + 2**-7: 1; 1 + 3 * 2**-8 between 1 + 2**-7 and
    # 1 + 2**-6: the even 1 + 2**-6, 0x3F82), 0.1 to the nearer 0x3DCD
    ("fill:1.0", "bfloat16", b"\x80\x3f"), ("fill:1.00390625", "bfloat16", b"\x80\x3f"),
    ("fill:1.01171875", "bfloat16", b"\x82\x3f"), ("fill:0.1", "bfloat16", b"\xcd\x3d"),
    ("fill:-inf", "bfloat16", b"\x80\xff"), ("fill:-0.0", "bfloat16", b"\x00\x80"),
    ("fill:0.1", "float32", b"\xcd\xcc\xcc\x3d"), ("fill:-2", "float16", b"\x00\xc0"),
    # E4M3 (fn): 448 = S.1111.110, 460 rounds down to it; E5M2: 1.0 = 0x3C, -inf 0xFC
    ("fill:448", "float8_e4m3fn", b"\x7e"), ("fill:460", "float8_e4m3fn", b"\x7e"),
    ("fill:1", "float8_e5m2", b"\x3c"), ("fill:-inf", "float8_e5m2", b"\xfc"),
    ("fill:-1", "int32", b"\xff\xff\xff\xff"), ("fill:0x7f", "int8", b"\x7f"),
    ("fill:true", "bool", b"\x01"), ("fill:255", "uint8", b"\xff"),
    ("fill:-3", "int64", struct.pack("<q", -3)),
])
def test_a_fill_is_the_value_in_the_element_type(wake, dtype, element):
    assert _pattern(wake, dtype) == element * (16 // len(element))


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(wake=1), TypeError, "wake must be a str"),
    (dict(wake="zeros"), ValueError, "wake must be one of"),
    (dict(wake="fill:500", dtype="float8_e4m3fn"), ValueError, "outside the values"),
    (dict(wake="fill:inf", dtype="float8_e4m3fn"), ValueError, "outside the values"),
    (dict(wake="fill:1e39", dtype="float32"), ValueError, "outside the values"),
    (dict(wake="fill:128", dtype="int8"), ValueError, "outside int8"),
    (dict(wake="fill:1.5", dtype="int32"), ValueError, "not an integer"),
    (dict(wake="fill:x", dtype="float32"), ValueError, "not a number"),
    (dict(wake="fill:1", dtype="complex64"), ValueError, "not supported"),
    (dict(wake="undefined", init_zero=True), ValueError, "contradicts"),
    (dict(wake="fill:0", init_zero=True), ValueError, "contradicts"),
])
def test_a_contract_not_understood_is_refused_naming_the_spec(kwargs, error, words):
    args = dict(dtype="float32", shape=["M"])
    args.update(kwargs)
    with pytest.raises(error, match=words) as e:
        BufferSpec("b", **args)
    assert "buffer spec 'b'" in str(e.value)


def test_a_fill_needs_an_element_type():
    with pytest.raises(ValueError, match="needs the buffer's dtype"):
        BufferSpec("raw", size="64*M", wake="fill:1")


def test_the_contract_is_kept_by_files_and_replace(tmp_path):
    spec = BufferSpec("c", "float32", ["M"], wake="fill: 1.5")
    assert spec.wake == "fill:1.5" and spec.to_dict()["wake"] == "fill:1.5"
    assert "wake" not in BufferSpec("d", "float32", ["M"]).to_dict()     # "zero": the default
    assert spec.replace(wake="keep").wake == "keep"
    path = tmp_path / "set.toml"
    path.write_text('base = "empty"\n[[buffer]]\nname = "w"\ndtype = "bfloat16"\n'
                    'shape = ["M", "H"]\nwake = "offload"\n')
    got = BufferSet.load(path)
    assert got["w"].wake == "offload" and got.groups["wake_offload"] == ("w",)
    with pytest.raises(ValueError, match="wake must be one of"):
        path.write_text('base = "empty"\n[[buffer]]\nname = "w"\nsize = 64\nwake = "gone"\n')
        BufferSet.load(path)


# -- the contracts on a reserved arena (host backend) ----------------------------------------

# An own set with a class of each kind: weights kept, KV offloaded, activations
# zeroed, a constant filled, a scratch left undefined, and a zero_all buffer.
OWN = BufferSet([
    BufferSpec("weights", "bfloat16", ["H", "H"], wake="keep"),
    BufferSpec("kv", "bfloat16", ["max_seq_len", "H"], wake="offload"),
    BufferSpec("acts", "bfloat16", ["M", "H"]),
    BufferSpec("ones", "float32", ["M", 3], wake="fill:1.5"),
    BufferSpec("scratch", "uint8", ["M", 100], wake="undefined"),
    BufferSpec("logits_z", "float32", ["M", 8], zero_all=True),
])
TOP = (LIMITS[0], LIMITS[1], LIMITS[2], LIMITS[3])


# New device memory holds this byte (as a GPU's may hold anything), not the
# host's zeros: a zero or a fill the wake leaves out shows.
FRESH = 0xC3


def _arena(gpu=None, buffers=OWN, cfg=CFG, m=LIMITS[0], top=TOP):
    gpu = FaultyBackend(fresh=FRESH) if gpu is None else gpu
    return BufferArena.new(cfg, m, *top[1:], gpu, reserve=top, env=NOENV, buffers=buffers)


def _mem(a, name):
    return _host_bytes(a.ptr(name), a.nbytes(name))


def _stamp(a, names):
    """Each buffer's bytes set to a pattern of its own (never zero)."""
    out = {}
    for k, n in enumerate(names):
        if a.nbytes(n):
            m = _mem(a, n)
            m[:] = (np.arange(m.size) * 7 + 11 * k) % 251 + 1
            out[n] = m.copy()
    return out


def _fill_bytes(a, name, wake):
    spec = a.buffers[name]
    return np.frombuffer(_pattern(wake, spec.dtype) * (a.nbytes(name) // 16 + 1),
                         np.uint8)[:a.nbytes(name)]


def _expect(a, before, fates):
    """Each buffer after `wake` as its fate: "bytes", "zero", or a fill contract."""
    for n, fate in fates.items():
        got = _mem(a, n)
        if fate == "bytes":
            assert np.array_equal(got, before[n]), n
        elif fate == "zero":
            assert not got.any(), n
        elif fate == "fresh":                   # "undefined": the new memory, untouched
            assert (got == FRESH).all(), n
        else:
            assert np.array_equal(got, _fill_bytes(a, n, fate)), n


def test_a_new_arena_holds_its_fills():
    with _arena() as a:
        assert np.array_equal(_mem(a, "ones"), _fill_bytes(a, "ones", "fill:1.5"))
        assert np.frombuffer(_mem(a, "ones").tobytes(), "<f4").tolist() == \
            [1.5] * (a.nbytes("ones") // 4)
    with BufferArena.new(CFG, *LIMITS, FaultyBackend(fresh=FRESH), env=NOENV,
                         buffers=OWN) as a:     # unreserved
        assert np.array_equal(_mem(a, "ones"), _fill_bytes(a, "ones", "fill:1.5"))


def test_sleep_applies_each_contract():
    with _arena() as a:
        before = _stamp(a, OWN.names)
        a.sleep()
        assert np.array_equal(_mem(a, "kv"), before["kv"])     # readable while asleep
        a.wake()
        _expect(a, before, {"weights": "bytes", "kv": "bytes", "acts": "zero",
                            "ones": "fill:1.5", "logits_z": "zero", "scratch": "fresh"})


def test_names_override_the_contract_for_one_sleep():
    with _arena() as a:
        before = _stamp(a, OWN.names)
        a.sleep(keep=["acts"], offload=["weights"], discard=["kv"])
        a.wake()
        _expect(a, before, {"weights": "bytes", "kv": "zero", "acts": "bytes",
                            "ones": "fill:1.5", "logits_z": "zero"})
        before = _stamp(a, OWN.names)
        a.sleep(keep=["ones"])                  # a fill kept: its bytes, not its fill
        a.wake()
        _expect(a, before, {"weights": "bytes", "kv": "bytes", "ones": "bytes",
                            "acts": "zero"})


@pytest.mark.parametrize("keep, offload, discard, words", [
    (["weights"], [], ["weights"], "keep, discard: weights in both"),
    ([], ["kv"], ["kv"], "offload, discard: kv in both"),
    ([], [], ["nope"], "unknown buffer name 'nope'"),
    ([], [], ["torch"], "the arena has none"),
    ([], [], [3], "buffer names must be str"),
])
def test_sleep_refuses_names_it_cannot_follow_and_changes_nothing(keep, offload, discard, words):
    with _arena() as a:
        before = _stamp(a, OWN.names)
        with pytest.raises((TypeError, ValueError), match=words):
            a.sleep(keep=keep, offload=offload, discard=discard)
        assert not a.is_sleeping()
        _expect(a, before, {n: "bytes" for n in before})


def test_a_resize_while_asleep_wakes_the_new_bytes_as_the_contract_says():
    with _arena(m=16) as a:
        before = _stamp(a, OWN.names)
        a.sleep()
        a.resize(LIMITS[0])                     # acts, ones, scratch, logits_z grow
        a.wake()
        _expect(a, before, {"weights": "bytes", "kv": "bytes", "acts": "zero",
                            "ones": "fill:1.5", "logits_z": "zero"})
        before = _stamp(a, OWN.names)
        a.resize(8)
        a.resize(LIMITS[0])                     # awake: a grown fill buffer is filled again
        assert np.array_equal(_mem(a, "ones"), _fill_bytes(a, "ones", "fill:1.5"))


def test_the_kept_tail_past_a_shrunk_sleep_wakes_zeroed():
    with _arena(m=16) as a:
        a.sleep(keep=["acts"])                  # 16 rows kept
        a.resize(LIMITS[0])
        a.wake()
        rows = _mem(a, "acts")
        assert not rows[16 * 2 * 256:].any()     # rows past the 16 kept ones: zeros


@pytest.mark.parametrize("buffers", [REFERENCE, MINIMAL], ids=["reference", "minimal"])
def test_every_buffer_of_the_shipped_sets_wakes_zeroed(buffers):
    with BufferArena.new(COMPACT, 64, *RESERVE[1:], FaultyBackend(fresh=FRESH),
                         reserve=RESERVE, env=NOENV, buffers=buffers) as a:
        names = [n for n in buffers.names if a.nbytes(n)]
        before = _stamp(a, names)
        a.sleep()
        a.wake()
        _expect(a, before, {n: "zero" for n in names})
        # and as contracts given on the same set say
        first, second = names[0], names[-1]
        own = buffers.replace(first, wake="keep").replace(second, wake="offload")
    with BufferArena.new(COMPACT, 64, *RESERVE[1:], FaultyBackend(fresh=FRESH),
                         reserve=RESERVE, env=NOENV, buffers=own) as a:
        before = _stamp(a, names)
        a.sleep()
        a.wake()
        _expect(a, before, {n: "bytes" if n in (first, second) else "zero" for n in names})


def test_prepare_sleep_makes_the_contracts_host_memory():
    with _arena() as a:
        held = a.prepare_sleep()
        assert held >= a.nbytes("weights") + a.nbytes("kv")
        assert a.prepare_sleep(discard=["weights", "kv"]) == held   # nothing more made


# -- the pool's contract ------------------------------------------------------------------------

@pytest.mark.parametrize("wake, discard, fate", [
    ("zero", [], "zero"), ("offload", [], "bytes"), ("offload", ["torch"], "zero"),
    ("undefined", [], None),
])
def test_the_pools_contract(wake, discard, fate):
    with _arena() as a:
        pool = a.open_pool(8 * 4096, wake=wake)
        assert pool.wake == wake
        p = pool.alloc(3 * 4096)
        seg = _host_bytes(p, 3 * 4096)
        seg[:] = SENTINEL
        a.sleep(discard=discard)
        a.wake()
        got = _host_bytes(p, 3 * 4096)
        if fate == "zero":
            assert not got.any()
        elif fate == "bytes":
            assert (got == SENTINEL).all()
        else:
            assert (got == FRESH).all()     # "undefined": the new memory, untouched
        pool.free(p, 3 * 4096)


@pytest.mark.parametrize("wake, error", [(1, TypeError), ("keep", ValueError),
                                         ("fill:0", ValueError)])
def test_a_pool_contract_not_understood_is_refused(wake, error):
    with _arena() as a:
        with pytest.raises(error, match="wake"):
            a.open_pool(4096, wake=wake)
        assert a.pool is None


def test_a_failed_wake_leaves_the_contracts_for_the_next():
    gpu = FaultyBackend(fresh=FRESH)
    with _arena(gpu) as a:
        before = _stamp(a, OWN.names)
        a.sleep()
        gpu.inject_fault("map", 1)
        with pytest.raises(Exception):
            a.wake()
        gpu.clear_faults()
        assert a.is_sleeping()
        a.wake()
        _expect(a, before, {"weights": "bytes", "kv": "bytes", "acts": "zero",
                            "ones": "fill:1.5", "logits_z": "zero"})
