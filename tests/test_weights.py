"""metrale.weights on the host: a model's parameters as a weight set, its arena,
safetensors files read by their header, and load's checks and copies.

The expected offsets are written out by hand (256-byte alignment); files are
written by helpers.write_safetensors from the format's description; the bytes
an arena holds after a load are compared with the files' own."""

import json
import os
import re
import zlib

import numpy as np
import pytest

from metrale import HostBackend, MetraleError, ModelConfig
from metrale.weights import (DEFAULT_ALIGN, LoadStats, Param, WeightSet, load, read_safetensors,
                             weight_arena, weight_set)

from helpers import _host_bytes, write_safetensors

# A small decoder layer's shapes: hidden 64, intermediate 96, vocab 100, 2 layers.
SHAPES = {
    "model.embed_tokens.weight": ("bfloat16", (100, 64)),           # 12,800 B
    "model.layers.0.input_layernorm.weight": ("bfloat16", (64,)),   # 128 B: pads to 256
    "model.layers.0.self_attn.q_proj.weight": ("bfloat16", (64, 64)),   # 8,192 B
    "model.layers.0.mlp.gate_proj.weight": ("bfloat16", (96, 64)),  # 12,288 B
    "model.layers.0.self_attn.q_proj.bias": ("float32", (3,)),      # 12 B: pads to 256
    "model.norm.weight": ("float32", (64,)),                        # 256 B
}
# Offsets by hand: 12,800 = 50 * 256; then 128 -> 256; 8,192; 12,288; 12 -> 256; 256.
OFFSETS = [0, 12800, 13056, 21248, 33536, 33792]
NBYTES = [12800, 128, 8192, 12288, 12, 256]
TOTAL = 34048
ST = {"bfloat16": "BF16", "float32": "F32", "float16": "F16", "int8": "I8"}
ITEM = {"bfloat16": 2, "float32": 4, "float16": 2, "int8": 1}


def _data(name, dtype, shape, seed=0):
    n = ITEM[dtype] * int(np.prod(shape, dtype=np.int64))
    rng = np.random.default_rng(zlib.crc32(name.encode()) + seed)
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def _tensors(shapes=SHAPES, seed=0):
    return [(n, ST[d], s, _data(n, d, s, seed)) for n, (d, s) in shapes.items()]


def _arena_bytes(arena, ws):
    return bytes(_host_bytes(arena.ptr(ws.buffer), ws.nbytes))


def test_a_weight_set_of_pairs_lays_each_parameter_out_aligned_in_order():
    ws = weight_set(SHAPES)
    assert isinstance(ws, WeightSet) and len(ws) == 6 and ws.names == tuple(SHAPES)
    assert [p.offset for p in ws] == OFFSETS and [p.nbytes for p in ws] == NBYTES
    assert ws.nbytes == TOTAL and ws.align == DEFAULT_ALIGN == 256
    p = ws["model.layers.0.self_attn.q_proj.bias"]
    assert p == Param("model.layers.0.self_attn.q_proj.bias", "float32", (3,), 33536, 12)
    (spec,) = ws.buffers
    assert (spec.name, spec.tag, spec.wake, spec.align) == ("weights", "weights", "offload", 256)
    assert "model.norm.weight" in ws and "model.norm" not in ws
    with pytest.raises(KeyError, match="model.norm"):
        ws["model.norm"]


def test_a_weight_set_takes_other_alignments_names_and_classes():
    ws = weight_set(SHAPES, align=4096, buffer="w", tag="policy")
    # 12,800 -> 16,384; 128 -> 4,096; 8,192; 12,288; 12 -> 4,096; 256 -> 4,096
    assert [p.offset for p in ws] == [0, 16384, 20480, 28672, 40960, 45056]
    assert ws.nbytes == 49152 and ws.buffers.names == ("w",) and ws.buffers["w"].tag == "policy"


def test_a_weight_set_of_arrays_reads_their_types_and_shapes():
    arrays = {"a": np.zeros((3, 5), np.float16), "b": np.zeros(7, np.int8)}
    ws = weight_set(arrays)
    assert [(p.dtype, p.shape, p.offset, p.nbytes) for p in ws] == \
        [("float16", (3, 5), 0, 30), ("int8", (7,), 256, 7)]
    assert weight_set({"a": (np.float16, [3, 5]), "b": ("i1", (7,))}) == ws


@pytest.mark.parametrize("params, err, match", [
    ({}, ValueError, "no parameter"),
    ([("a", ("float32", (1,)))], TypeError, "params must be a mapping"),
    ({1: ("float32", (1,))}, TypeError, "name must be a str"),
    ({"": ("float32", (1,))}, ValueError, "name is empty"),
    ({"a": ("float32", [1]), "b": ("bfloat16", (2, 3))}, None, None),
    ({"a": ("float33", (1,))}, ValueError, "float33"),
    ({"a": ("float32", (2, -1))}, ValueError, r"shape\[1\] must be >= 0"),
    ({"a": ("float32", (2, 1.0))}, TypeError, r"shape\[1\] must be an int"),
    ({"a": ("float32", (2, True))}, TypeError, r"shape\[1\] must be an int"),
    ({"a": ("float32", 4)}, TypeError, "shape must be a tuple"),
    ({"a": object()}, TypeError, "'a'.*a .dtype, shape. pair"),
])
def test_a_weight_set_refuses_what_it_does_not_understand(params, err, match):
    if err is None:                     # the same described directly: the same set
        assert WeightSet([(n, d, s) for n, (d, s) in params.items()]) == weight_set(params)
        return
    with pytest.raises(err, match=match):
        weight_set(params)


@pytest.mark.parametrize("described, err, match", [
    ([("a", "float32", (1,)), ("a", "float32", (2,))], ValueError, "'a' is named twice"),
    ([("a", "float32")], TypeError, r"\(name, dtype, shape\)"),
    ([(b"a", "float32", (1,))], TypeError, "name must be a str"),
    ([("a", "floaty", (1,))], ValueError, "'a'.*floaty"),
    ([("a", "float32", (1, -1))], ValueError, r"shape\[1\]"),
])
def test_a_weight_set_made_directly_checks_what_it_is_given(described, err, match):
    with pytest.raises(err, match=match):
        WeightSet(described)


@pytest.mark.parametrize("align", [0, 128, 300, 2**31])
def test_a_weight_set_refuses_an_alignment(align):
    with pytest.raises(ValueError, match="align"):
        weight_set(SHAPES, align=align)
    with pytest.raises(TypeError, match="align"):
        weight_set(SHAPES, align=256.0)


def test_read_safetensors_gives_each_tensor_in_the_order_of_its_bytes(tmp_path):
    # written in another order than the names' (the format's files sort by name)
    order = ["model.norm.weight", "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"]
    t = [(n, ST[SHAPES[n][0]], SHAPES[n][1], _data(n, *SHAPES[n])) for n in order]
    path = write_safetensors(tmp_path / "m.safetensors", t, metadata={"format": "pt"})
    got = read_safetensors(path)
    assert [e.name for e in got] == order
    header_len = int.from_bytes(open(path, "rb").read(8), "little")
    assert got[0].begin == 8 + header_len and got[0].end == got[0].begin + 256
    assert [e.end - e.begin for e in got] == [256, 12800, 128]
    assert got[1].dtype == "bfloat16" and got[1].shape == (100, 64)
    raw = open(path, "rb").read()
    for (_n, _d, _s, data), e in zip(t, got):
        assert raw[e.begin:e.end] == data


def _header_file(tmp_path, header, body=b"", raw=None):
    raw = json.dumps(header).encode() if raw is None else raw
    p = tmp_path / "bad.safetensors"
    p.write_bytes(len(raw).to_bytes(8, "little") + raw + body)
    return p


@pytest.mark.parametrize("header, body, match", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "past the file"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8, "hold 4 bytes"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 12, "4 bytes after"),
    ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "element type 'Q4'"),
    ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, "shape"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, b"\0" * 8, "data_offsets"),
    ({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, "exactly dtype, shape"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "starts at 4"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "starts at 4"),
    ([1, 2], b"", "not a JSON object"),
])
def test_read_safetensors_refuses_a_malformed_file(tmp_path, header, body, match):
    with pytest.raises(ValueError, match=match):
        read_safetensors(_header_file(tmp_path, header, body))


def test_read_safetensors_refuses_a_bad_header_length_or_json(tmp_path):
    p = tmp_path / "short.safetensors"
    p.write_bytes(b"\1\0\0")
    with pytest.raises(ValueError, match="8-byte"):
        read_safetensors(p)
    p.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="header length"):
        read_safetensors(p)
    with pytest.raises(ValueError, match="not JSON"):
        read_safetensors(_header_file(tmp_path, None, raw=b"{nope"))
    with pytest.raises(TypeError, match="path"):
        read_safetensors(3)


def _sharded(tmp_path, seed=0):
    """Two files and their index: the layer in one, the rest in the other."""
    t = _tensors(seed=seed)
    a = [x for x in t if ".layers." in x[0]]
    b = [x for x in t if ".layers." not in x[0]]
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", a)
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", b)
    wm = {x[0]: "model-00001-of-00002.safetensors" for x in a}
    wm.update({x[0]: "model-00002-of-00002.safetensors" for x in b})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": TOTAL}, "weight_map": wm}))
    return index, a + b


def test_a_weight_set_of_a_sharded_checkpoint_keeps_the_files_order(tmp_path):
    index, t = _sharded(tmp_path)
    ws = weight_set(index)
    assert ws.names == tuple(x[0] for x in t)
    assert {p.name: (p.dtype, p.shape) for p in ws} == dict(SHAPES.items())
    files = sorted(str(p) for p in tmp_path.glob("*.safetensors"))
    assert weight_set(files) == ws


def test_an_index_must_match_its_files(tmp_path):
    index, t = _sharded(tmp_path)
    wm = json.loads(index.read_text())["weight_map"]
    wm["model.extra.weight"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(ValueError, match="model.extra.weight.*lacks it"):
        weight_set(index)
    del wm["model.extra.weight"]
    wm["model.norm.weight"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(ValueError, match="model.norm.weight.*it is in model-00002"):
        weight_set(index)
    index.write_text(json.dumps({"weight_map": {"a": "../x.safetensors"}}))
    with pytest.raises(ValueError, match="outside its folder"):
        weight_set(index)


def test_load_copies_a_checkpoint_in_one_copy_per_run(tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors", _tensors())
    ws = weight_set(path)
    with weight_arena(ws, HostBackend()) as arena:
        assert arena.nbytes("weights") == TOTAL and arena.is_reserved()
        _host_bytes(arena.ptr("weights"), TOTAL)[:] = 0xEE
        st = load(arena, ws, path)
        # runs, by the sizes above: the embedding (12,800, a multiple of 256) is
        # followed at once by the 128-byte norm (the file's next bytes); the norm
        # pads to 256 in the arena, so q_proj starts a run of its own, which
        # gate_proj and the 12-byte bias continue; model.norm.weight after the
        # bias's padding: a third.
        assert st == LoadStats(6, sum(NBYTES), 3)
        got = _arena_bytes(arena, ws)
        for (name, _d, _s, data), p in zip(_tensors(), ws):
            assert got[p.offset:p.offset + p.nbytes] == data, name
        # the padding is untouched
        assert got[12928:13056] == b"\xee" * 128 and got[33548:33792] == b"\xee" * 244


def test_load_of_a_state_dict_checks_and_copies_each_tensor():
    ws = weight_set(SHAPES)
    sd = {}
    for n, (d, s) in SHAPES.items():
        sd[n] = (d, s, _data(n, d, s, seed=3))
    sd["model.norm.weight"] = np.frombuffer(sd["model.norm.weight"][2], np.float32).copy()
    with weight_arena(ws, HostBackend()) as arena:
        assert load(arena, ws, sd) == LoadStats(6, sum(NBYTES), 6)
        got = _arena_bytes(arena, ws)
        for p in ws:
            assert got[p.offset:p.offset + p.nbytes] == _data(p.name, p.dtype, p.shape, seed=3)


@pytest.mark.parametrize("change, match", [
    (lambda t: t[:-1], r"missing 1: 'model.norm.weight'"),
    (lambda t: t + [("lm_head.weight", "BF16", (4,), b"\0" * 8)], "not in the weight set 1: 'lm_head.weight'"),
    (lambda t: t[:-1] + [("model.norm.weight", "F16", (128,), b"\0" * 256)],
     r"'model.norm.weight' is float16 \[128\], the weight set's is float32 \[64\]"),
    (lambda t: t[:-1] + [("model.norm.weight", "F32", (8, 8), b"\0" * 256)],
     r"'model.norm.weight' is float32 \[8, 8\]"),
])
def test_load_refuses_every_mismatch_before_a_byte_moves(tmp_path, change, match):
    ws = weight_set(SHAPES)
    path = write_safetensors(tmp_path / "m.safetensors", change(_tensors(seed=1)))
    with weight_arena(ws, HostBackend()) as arena:
        _host_bytes(arena.ptr("weights"), TOTAL)[:] = 0x5A
        with pytest.raises(ValueError, match=match):
            load(arena, ws, path)
        assert _arena_bytes(arena, ws) == b"\x5a" * TOTAL


def test_load_refuses_a_state_dict_tensor_of_another_size_or_kind():
    ws = weight_set({"a": ("float32", (4,)), "b": ("int8", (3,))})
    with weight_arena(ws, HostBackend()) as arena:
        with pytest.raises(ValueError, match="'a' holds 12 bytes"):
            load(arena, ws, {"a": ("float32", (4,), b"\0" * 12), "b": np.zeros(3, np.int8)})
        with pytest.raises(ValueError, match="'a' is float64"):
            load(arena, ws, {"a": np.zeros(4), "b": np.zeros(3, np.int8)})
        with pytest.raises(ValueError, match="not C-contiguous"):
            load(arena, ws, {"a": np.zeros(8, np.float32)[::2], "b": np.zeros(3, np.int8)})
        with pytest.raises(TypeError, match="'b' must be a numpy array"):
            load(arena, ws, {"a": np.zeros(4, np.float32), "b": [0, 0, 0]})
        with pytest.raises(TypeError, match="source must be"):
            load(arena, ws, 7)


def test_the_weights_sleep_and_wake_with_their_bytes():
    ws = weight_set(SHAPES)
    sd = {n: (d, s, _data(n, d, s, seed=9)) for n, (d, s) in SHAPES.items()}
    with weight_arena(ws, HostBackend(), config=ModelConfig.preset("qwen2.5-7b")) as arena:
        load(arena, ws, sd)
        before = _arena_bytes(arena, ws)
        arena.sleep()
        assert arena.committed_bytes() == 0
        with pytest.raises(MetraleError, match="sleeps"):
            load(arena, ws, sd)
        arena.wake()
        assert _arena_bytes(arena, ws) == before
        assert arena.summary().classes[0].name == "weights"


def test_a_view_of_offloaded_weights_stays_readable_while_they_sleep():
    # what a module bound to the weights (metrale.torch.bind) relies on
    ws = weight_set(SHAPES)
    sd = {n: (d, s, _data(n, d, s, seed=4)) for n, (d, s) in SHAPES.items()}
    with weight_arena(ws, HostBackend()) as arena:
        load(arena, ws, sd)
        before = _arena_bytes(arena, ws)
        view = arena.view(ws.buffer, "uint8")
        arena.sleep()
        assert arena.is_sleeping()
        assert bytes(_host_bytes(view.ptr, ws.nbytes)) == before   # host memory, same address
        arena.wake()
        assert _arena_bytes(arena, ws) == before
        del view


def test_kept_weights_refuse_a_sleep_while_a_view_is_alive():
    ws = weight_set(SHAPES, wake="keep")
    assert ws.wake == "keep" and ws.buffers["weights"].wake == "keep"
    assert ws != weight_set(SHAPES)
    with weight_arena(ws, HostBackend()) as arena:
        view = arena.view(ws.buffer, "uint8")
        with pytest.raises(BufferError, match="alive"):
            arena.sleep()
        del view
        arena.sleep()
        arena.wake()


def test_a_weight_set_refuses_a_wake_contract_it_does_not_know():
    with pytest.raises(ValueError, match="wake"):
        weight_set(SHAPES, wake="sometimes")


def test_load_refuses_an_arena_of_another_set():
    ws, other = weight_set(SHAPES), weight_set({"x": ("float32", (4,))})
    with weight_arena(other, HostBackend()) as arena:
        with pytest.raises(MetraleError, match="weight_arena"):
            load(arena, ws, {})
    with pytest.raises(TypeError, match="ws must be a WeightSet"):
        weight_arena(SHAPES, HostBackend())


def test_the_module_is_the_public_path():
    import metrale.weights
    import metrale._integrations.weights as home
    assert metrale.weights is home and os.path.basename(home.__file__).startswith("weights")
    assert re.fullmatch(r"WeightSet\(6 params, 34,048 bytes in 'weights', class 'weights'\)",
                        repr(weight_set(SHAPES)))


def test_load_refuses_a_file_cut_short_since_its_header_was_read(tmp_path, monkeypatch):
    import metrale._integrations.weights as w
    path = write_safetensors(tmp_path / "m.safetensors", _tensors())
    ws = weight_set(path)
    real = w.entries_of

    def then_cut(paths, where):         # the header is read, then the file loses its tail
        out = real(paths, where)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 100)
        return out
    monkeypatch.setattr(w, "entries_of", then_cut)
    with weight_arena(ws, HostBackend()) as arena:
        with pytest.raises(MetraleError, match="ended before its tensors' bytes"):
            load(arena, ws, path)


def test_a_tensor_in_two_files_is_refused(tmp_path):
    t = [("a", "F32", (2,), b"\0" * 8)]
    f1 = write_safetensors(tmp_path / "one.safetensors", t)
    f2 = write_safetensors(tmp_path / "two.safetensors", t)
    with pytest.raises(ValueError, match="tensor 'a' is in both .*one.safetensors and .*two"):
        weight_set([f1, f2])
