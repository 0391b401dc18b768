"""Step inputs over an engine's own set (issue 36 item 2, docs/step-inputs.md):
buffers whose spec says what they hold of a step (`BufferSpec(step=...)`),
placed first and back to back, staged and uploaded by one copy.

The engine here is shaped like nano-vllm's model runner: int64 input ids and
positions, an int32 token count, int64 slot mapping, int32 context lengths
and block tables, float32 sampling temperatures.  Every expected value is
written out below (offsets from the placement rule, bytes from the arrays
given), not read back from the code under test."""

import pytest

import metrale
from metrale import (REFERENCE, BufferArena, BufferSet, BufferSpec, HostBackend, MetraleError,
                     ModelConfig)

from helpers import NOENV, _ceil

np = pytest.importorskip("numpy")

CFG = ModelConfig.preset("llama-3.1-8b").replace(hidden_size=64, vocab_size=100,
                                                  num_hidden_layers=2)
M, SEQ, BLK, BS = 64, 512, 16, 8
B = SEQ // BLK + 1                      # blocks per sequence: docs/buffers.md's B
H, V = 64, 100
SENTINEL = 0xAB

STEP = [
    BufferSpec("input_ids", "int64", ["M"], step="token_ids"),
    BufferSpec("num_tokens", "int32", [1], step="count"),
    BufferSpec("pos", "int64", ["M"], step="positions"),
    BufferSpec("slot_mapping", "int64", ["M"], step="metadata"),
    BufferSpec("context_lens", "int32", ["max_batch_size"], step="metadata"),
    BufferSpec("block_tables", "int32", ["max_batch_size", "B"], step="metadata"),
    BufferSpec("temperatures", "float32", ["max_batch_size"], step="metadata"),
]
WORK = [
    BufferSpec("hidden", "bfloat16", ["M", "H"], zero_all=True, rows="M"),
    BufferSpec("logits", "float32", ["max_batch_size", "V"], zero_all=True),
    BufferSpec("kv_scratch", "bfloat16", ["M", 8]),
]
# declared out of slab order: the work buffers first, the count last
OWN = BufferSet([WORK[0], STEP[3], WORK[1], STEP[0], STEP[4], WORK[2], STEP[5], STEP[6],
                 STEP[2], STEP[1]])
# bytes of each buffer, from its shape (docs/buffers.md)
BYTES = {"input_ids": 8 * M, "num_tokens": 4, "pos": 8 * M, "slot_mapping": 8 * M,
         "context_lens": 4 * BS, "block_tables": 4 * BS * B, "temperatures": 4 * BS,
         "hidden": 2 * M * H, "logits": 4 * BS * V, "kv_scratch": 2 * M * 8}
# the placement rule (docs/buffer-sets.md): the token ids, then the other step
# inputs in set order, then the row-trimmed buffers, the rest of zero_all,
# everything else; each at the next 256 bytes
ORDER = ("input_ids", "slot_mapping", "context_lens", "block_tables", "temperatures", "pos",
         "num_tokens", "hidden", "logits", "kv_scratch")


def _offsets():
    out, cur = {}, 0
    for name in ORDER:
        out[name] = cur
        cur = _ceil(cur + BYTES[name], 256)
    return out


OFFSETS = _offsets()
SPAN = OFFSETS["num_tokens"] + 4        # the last step input's end


def _new(gpu, **kw):
    return BufferArena.new(CFG, M, SEQ, BLK, BS, gpu, env=NOENV, buffers=OWN, **kw)


def _read(arena, gpu, name, n=None):
    n = arena.nbytes(name) if n is None else n
    if isinstance(gpu, HostBackend):
        return np.asarray(arena.view(name, "uint8", n)).copy()
    return np.frombuffer(gpu.download(arena.ptr(name), n), dtype=np.uint8).copy()


def _fill(arena, gpu, name, value=SENTINEL):
    data = np.full(arena.nbytes(name), value, dtype=np.uint8)
    if isinstance(gpu, HostBackend):
        np.asarray(arena.view(name, "uint8"))[:] = data
    else:
        gpu.upload(arena.ptr(name), data.tobytes())


def _step_arrays(n, rng):
    return dict(input_ids=rng.integers(0, 2**40, n), pos=np.arange(n) + 100,
                slot_mapping=rng.integers(0, 2**33, n), context_lens=np.arange(1, 4, dtype=np.int32),
                block_tables=rng.integers(0, 1000, (3, 5)).astype(np.int32),
                temperatures=np.array([0.5, 1.0, 0.0], np.float32))


# -- the specs and the set -------------------------------------------------------------------

def test_specs_say_what_they_hold():
    assert [s.step for s in STEP] == ["token_ids", "count", "positions"] + ["metadata"] * 4
    assert BufferSpec("x", "int32", [4]).step == ""
    # the reference's two hold it by their names, as before `step` existed
    assert REFERENCE["token_ids"].step == "token_ids" and REFERENCE["scratch"].step == "decode_meta"
    assert BufferSpec("token_ids", "int32", ["M"]).step == "token_ids"
    assert BufferSpec("token_ids", "int32", ["M"], step="").step == ""
    # a renamed spec follows its new name where it followed its old one
    assert REFERENCE["token_ids"].replace(name="ids", accessors=()).step == ""
    assert BufferSpec("x", "uint32", ["M"]).replace(name="token_ids").step == "token_ids"
    assert STEP[1].replace(name="n").step == "count"
    # a file round trip keeps it
    for s in STEP:
        assert BufferSpec(**s.to_dict()) == s and s.to_dict()["step"] == s.step


@pytest.mark.parametrize("kw, match", [
    (dict(step="tokens"), "step must be one of token_ids, count, positions, metadata, "
                          "decode_meta"),
    (dict(dtype="float32", step="count"), "step='count' holds int32 values"),
    (dict(dtype="int64", step="count"), "step='count' holds int32 values"),
    (dict(dtype="float32", step="token_ids"), "step='token_ids' holds int8 or"),
    (dict(dtype="bfloat16", step="metadata"), "step='metadata' holds"),
    (dict(dtype=None, itemsize=4, step="positions"), "got dtype None"),
    (dict(step="positions", zero_all=True), "zero_all: the step inputs upload positions"),
    (dict(step="metadata", zero_all=True, rows="M"), "zero_all: the step inputs upload"),
    (dict(step="metadata", align=4096), "align: the step inputs' buffers sit back to back"),
])
def test_a_spec_refuses_a_role_it_cannot_hold(kw, match):
    args = dict(dtype="int32", shape=["M"])
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        BufferSpec("b", **args)


def test_a_spec_refuses_a_role_of_the_wrong_type():
    with pytest.raises(TypeError, match="step must be a str or None, got int"):
        BufferSpec("b", "int32", [4], step=1)
    # fill takes a metadata buffer by its name: not one of its own keywords
    for name in ("tokens", "count", "block_table", "seq_lens", "self"):
        with pytest.raises(ValueError, match="one of its own keywords"):
            BufferSpec(name, "int32", [4], step="metadata")


def test_a_set_holds_each_role_once():
    with pytest.raises(ValueError, match="'b': step='count': 'num_tokens' holds it already"):
        OWN.with_(BufferSpec("b", "int32", [1], step="count"))
    with pytest.raises(ValueError, match="'b': step='token_ids': 'input_ids' holds it"):
        OWN.with_(BufferSpec("b", "int32", ["M"], step="token_ids"))
    # the reference's scratch holds a count and positions of its own
    for spec in (STEP[1], STEP[2]):
        with pytest.raises(ValueError, match=f"{spec.name!r}: step={spec.step!r}: 'scratch'"):
            BufferSet([REFERENCE["token_ids"], REFERENCE["scratch"], spec])
    # metadata any number of times, and beside the reference's two
    BufferSet([REFERENCE["token_ids"], REFERENCE["scratch"], STEP[3], STEP[4]])


def test_the_role_is_part_of_the_layouts_identity():
    plain = BufferSet([s.replace(step="") for s in STEP])
    assert plain.fingerprint() != BufferSet(STEP).fingerprint()
    assert OWN.groups["step"] == tuple(n for n in OWN.names if n in BYTES and n not in
                                       ("hidden", "logits", "kv_scratch"))


# -- the slab ----------------------------------------------------------------------------------

def test_the_slab_places_the_step_inputs_first_back_to_back():
    with _new(HostBackend()) as a:
        assert {n: a.nbytes(n) for n in OWN.names} == BYTES
        base = a.ptr("input_ids")
        assert {n: a.ptr(n) - base for n in OWN.names} == OFFSETS


def test_a_reserved_slab_keeps_the_step_inputs_rooms_mapped():
    gpu = HostBackend()
    with _new(gpu, reserve=(4 * M, SEQ, BLK, 4 * BS)) as a:
        # each step input's room is its reserved bytes to the next 256 (4x M
        # rows, 4x the sequences); the count's granule ends the tight run
        room = {"input_ids": 8 * 4 * M, "slot_mapping": 8 * 4 * M, "context_lens": 4 * 4 * BS,
                "block_tables": 4 * 4 * BS * B, "temperatures": 4 * 4 * BS, "pos": 8 * 4 * M}
        cur = 0
        for name in ORDER[:6]:
            assert a.ptr(name) - a.ptr("input_ids") == cur, name
            cur = _ceil(cur + room[name], 256)
        assert a.ptr("num_tokens") - a.ptr("input_ids") == cur
        rng = np.random.default_rng(3)
        a.resize(M // 2, SEQ, BLK, BS // 2)
        with a.step_inputs() as st:         # the span lies in committed memory
            arrays = _step_arrays(5, rng)
            st.fill(**arrays)
            st.upload()
            assert _read(a, gpu, "pos", 40).view(np.int64).tolist() == list(range(100, 105))
            assert _read(a, gpu, "num_tokens").view(np.int32)[0] == 5


# -- the staging and the upload ------------------------------------------------------------------

def test_the_staging_has_the_buffers_shapes_and_types():
    with _new(HostBackend()) as a, a.step_inputs() as st:
        assert st.names == ("token_ids", "slot_mapping", "context_lens", "block_tables",
                            "temperatures", "positions", "count")
        assert st.device_span == (a.ptr("input_ids"), SPAN) and st.nbytes == SPAN
        assert st.count_at == a.ptr("num_tokens")
        assert st.token_ids.dtype == np.int64 and st.token_ids.shape == (M,)
        assert st.positions.dtype == np.int64 and st.positions.shape == (M,)
        assert st.view("block_tables").shape == (BS, B)
        assert st.view("block_tables").dtype == np.int32
        assert st.view("temperatures").dtype == np.float32
        # a role's region by the buffer's name too
        assert st.view("pos") is st.positions and st.view("input_ids") is st.token_ids
        assert st.layout is None and st.max_blocks == 0 and st.max_batch_tokens == M
        with pytest.raises(AttributeError, match="no region 'seq_slot'"):
            st.seq_slot
        with pytest.raises(AttributeError, match="no region 'nope'"):
            st.view("nope")
        with pytest.raises(TypeError, match="name must be a str"):
            st.view(3)
    with _new(HostBackend()) as a:
        with pytest.raises(ValueError, match="max_blocks: these step inputs hold no decode"):
            a.step_inputs(max_blocks=4)


@pytest.mark.parametrize("n", [0, 1, 5, M])
def test_upload_writes_the_step_inputs_and_zeroes_for_their_count(backend, n):
    rng = np.random.default_rng(n)
    with _new(backend) as a, a.step_inputs() as st:
        for name in OWN.names:
            _fill(a, backend, name)
        arrays = _step_arrays(n, rng)
        h2d = backend.h2d_count
        st.fill(**arrays)
        st.upload()
        st.wait()
        assert backend.h2d_count == h2d + 1                # one copy
        got = {name: _read(a, backend, name) for name in OWN.names}
        for name, value, dtype in (("input_ids", arrays["input_ids"], np.int64),
                                   ("pos", arrays["pos"], np.int64),
                                   ("slot_mapping", arrays["slot_mapping"], np.int64),
                                   ("context_lens", arrays["context_lens"], np.int32),
                                   ("temperatures", arrays["temperatures"], np.float32)):
            want = np.zeros(BYTES[name] // np.dtype(dtype).itemsize, dtype)
            want[:len(value)] = value                      # the rest: the staging's zeros
            assert (got[name].view(dtype) == want).all(), name
        table = got["block_tables"].view(np.int32).reshape(BS, B)
        assert (table[:3, :5] == arrays["block_tables"]).all() and not table[3:].any()
        assert got["num_tokens"].view(np.int32)[0] == n
        # zero_all_rows(n): hidden's first n rows, logits whole; kv_scratch untouched
        assert not got["hidden"][:n * 2 * H].any() and (got["hidden"][n * 2 * H:] == SENTINEL).all()
        assert not got["logits"].any() and (got["kv_scratch"] == SENTINEL).all()


class _ArrayGivingList:
    """An array-like whose __array__ breaks numpy's protocol (returns a list)."""

    def __array__(self, dtype=None, copy=None):
        return [1, 2]


def test_fill_checks_every_region_before_it_writes():
    with _new(HostBackend()) as a, a.step_inputs() as st:
        st.fill(np.arange(4), pos=[7, 8, 9, 10], temperatures=[1, 2])   # ints into floats
        before = bytes(memoryview(st))
        for kw, err, match in (
                (dict(nope=[1]), TypeError, "no region 'nope'"),
                (dict(count=[1]), TypeError, "the count is tokens="),
                (dict(num_tokens=[1]), TypeError, "no region 'num_tokens'"),
                (dict(temperatures=[1e39]), ValueError, "temperatures: values must lie within"),
                (dict(temperatures=[True]), TypeError, "temperatures must hold numbers"),
                (dict(context_lens=[2**31]), ValueError, r"context_lens: values must lie in"),
                (dict(block_tables=np.zeros((BS, B + 1), np.int32)), ValueError,
                 "does not fit its region of shape"),
                (dict(block_tables=[1, 2]), ValueError, "block_tables must be 2-D"),
                (dict(positions=np.zeros(M + 1, np.int64)), ValueError, "does not fit"),
                # numpy's own refusals, with the argument named
                (dict(block_tables=[[1], [1, 2]]), ValueError,
                 r"block_tables: not a rectangular array of numbers \(.*inhomogeneous"),
                (dict(pos=_ArrayGivingList()), ValueError,
                 r"pos: not a rectangular array of numbers \(.*__array__"),
                # one region twice: by its role and by its buffer's name
                (dict(input_ids=[7, 8, 9]), TypeError,
                 "token_ids and input_ids both give the region 'token_ids'.*give it once")):
            with pytest.raises(err, match=match):
                st.fill([1, 2], **kw)
            assert bytes(memoryview(st)) == before, kw     # nothing written
        for kw, match in ((dict(input_ids=[2**63]), r"input_ids: values must lie in"),
                          (dict(token_ids=[2**63]), r"token_ids: values must lie in")):
            with pytest.raises(ValueError, match=match):
                st.fill(**kw)                              # named as given
            assert bytes(memoryview(st)) == before, kw
        # input_ids= is token_ids=: it sets the count
        st.fill(input_ids=[5, 6, 7])
        assert st.tokens == 3 and st.token_ids[:3].tolist() == [5, 6, 7]
        st.fill(tokens=9, context_lens=[-1, 3])            # not a "length" region: any int32
        assert st.tokens == 9 and st.view("context_lens")[:2].tolist() == [-1, 3]


def test_a_debug_arenas_guard_bands_survive_uploads():
    with _new(HostBackend(), debug=True) as a, a.step_inputs() as st:
        assert st.nbytes > SPAN                            # the bands lie in the span
        st.fill(np.arange(M), context_lens=np.arange(BS, dtype=np.int32))
        st.upload()
        assert a.check_guards() == []


def test_step_inputs_sleep_and_wake_with_their_arena():
    gpu = HostBackend()
    with _new(gpu, reserve=(M, SEQ, BLK, BS)) as a:
        with a.step_inputs() as st:
            st.fill(np.arange(3) + 1, pos=[4, 5, 6])
            st.upload()
        a.sleep(keep=["pos"], offload=["input_ids"])
        a.wake()
        assert _read(a, gpu, "pos", 24).view(np.int64).tolist() == [4, 5, 6]
        assert _read(a, gpu, "input_ids", 24).view(np.int64).tolist() == [1, 2, 3]
        with a.step_inputs() as st:                        # and upload again
            st.fill([9])
            st.upload()
            assert _read(a, gpu, "input_ids", 8).view(np.int64)[0] == 9


def test_a_set_without_a_count_has_no_step_inputs():
    buffers = BufferSet(WORK + [STEP[0], STEP[2]])
    gpu = HostBackend()
    with BufferArena.new(CFG, M, SEQ, BLK, BS, gpu, env=NOENV, buffers=buffers) as a:
        with pytest.raises(MetraleError, match="declare one with step='count'"):
            a.step_inputs()
        assert gpu.host_alloc_count == 0
    assert metrale.buffers.STEP_ROLES["count"][1] == ("int32",)


def test_an_empty_step_input_inside_the_span_stays_mapped():
    # a step buffer empty at these limits (a per-position table at
    # max_seq_len 0) between two others: its reserved room lies inside the
    # span one upload copies, so it stays mapped through trim and sleep/wake
    buffers = BufferSet([STEP[0], BufferSpec("per_pos", "int32", ["max_seq_len"], step="metadata"),
                         STEP[1], WORK[0]])
    gpu = HostBackend()
    with BufferArena.new(CFG, M, 1 << 14, BLK, BS, gpu, env=NOENV, buffers=buffers,
                         reserve=(M, 1 << 14, BLK, BS)) as a:
        a.resize(max_seq_len=0)
        assert a.nbytes("per_pos") == 0
        a.trim()
        a.sleep()
        a.wake()
        room = _ceil(4 * (1 << 14), 256)                  # per_pos reserved at 16,384 positions
        with a.step_inputs() as st:
            assert st.nbytes == _ceil(8 * M, 256) + room + 4 and st.view("per_pos").size == 0
            st.fill([1, 2, 3])
            st.upload()                                   # the whole span is mapped
        assert _read(a, gpu, "num_tokens").view(np.int32)[0] == 3
        assert _read(a, gpu, "input_ids", 24).view(np.int64).tolist() == [1, 2, 3]
