"""Buffer sets in files (issue 23, docs/buffer-sets.md): a TOML and a JSON
file give the set they write, to_dict and from_dict are inverses, and bad data
and bad files are refused naming where.

Every expected value here is written out from the docs, not read back from
the code under test."""

import json
import re

import pytest

from metrale import REFERENCE, BufferSet, BufferSpec

from helpers import LSE, SAMPLER, STAGING


# -- files -------------------------------------------------------------------------------------

TOML = """
base = "reference"
drop = ["ffn_act_q8", "ffn_act_a", "fp8_act"]

[replace.logits]
dtype = "float32"
size = "4*Lr*V"

[[buffer]]
name = "sampler_probs"
dtype = "float32"
shape = ["max_batch_size", "vocab_size"]

[[buffer]]
name = "allreduce_staging"
dtype = "bfloat16"
shape = ["max_batch_tokens", "hidden_size"]
zero_all = true
rows = "M"
align = 4096
"""


def _expected_file_set():
    return REFERENCE.without(["ffn_act_q8", "ffn_act_a", "fp8_act"]) \
        .replace("logits", dtype="float32", size="4*Lr*V").with_([SAMPLER, STAGING])


def test_a_toml_and_a_json_file_give_the_set_they_write(tmp_path):
    want = _expected_file_set()
    (tmp_path / "set.toml").write_text(TOML)
    assert BufferSet.load(tmp_path / "set.toml") == want
    assert BufferSet.load(str(tmp_path / "set.toml")) == want
    (tmp_path / "set.json").write_text(json.dumps(want.to_dict()))
    assert BufferSet.load(tmp_path / "set.json") == want
    # a file of the suffix TOML, any other suffix read as TOML
    (tmp_path / "set.cfg").write_text(TOML)
    assert BufferSet.load(tmp_path / "set.cfg") == want


def test_to_dict_is_the_inverse_of_from_dict():
    want = _expected_file_set()
    data = want.to_dict()
    assert data["base"] == "reference" and data["drop"] == ["ffn_act_q8", "ffn_act_a", "fp8_act"]
    assert data["replace"] == {"logits": {"dtype": "float32", "size": "4*Lr*V"}}
    assert [b["name"] for b in data["buffer"]] == ["sampler_probs", "allreduce_staging"]
    assert BufferSet.from_dict(json.loads(json.dumps(data))) == want
    assert REFERENCE.to_dict() == {"base": "reference"}
    assert BufferSet.from_dict({}) == REFERENCE
    scratch = BufferSet([SAMPLER, LSE])
    assert scratch.to_dict()["base"] == "empty"
    assert BufferSet.from_dict(scratch.to_dict()) == scratch
    assert BufferSet.from_dict({"base": "empty"}) == BufferSet()
    # as changes to another base: the reference with its order changed is
    # written from scratch (every spec), and still round-trips
    shuffled = BufferSet(REFERENCE.specs[::-1])
    assert shuffled.to_dict()["base"] == "empty"
    assert BufferSet.from_dict(shuffled.to_dict()) == shuffled


def test_to_dict_round_trips_what_it_used_to_lose():
    # a reference buffer's field set back to its default was written as {}
    # (to_dict of a spec leaves defaults out), so the file meant the reference
    # spec again; a new buffer between reference ones came back at the end
    off = REFERENCE.replace("hidden_states", zero_all=False, prefill=False, rows="whole",
                            checksum=False)
    assert off.to_dict()["replace"] == {"hidden_states": {
        "zero_all": False, "prefill": False, "rows": "whole", "checksum": False}}
    between = BufferSet([REFERENCE["hidden_states"], SAMPLER, REFERENCE["residual"]])
    for s in (off, between, REFERENCE.replace("logits", accessors=()),
              REFERENCE.replace("ssm_qkvz", floor=None), REFERENCE.with_(SAMPLER)):
        data = json.loads(json.dumps(s.to_dict()))
        assert BufferSet.from_dict(data) == s, s
        assert BufferSet.from_dict(s.to_dict(BufferSet())) == s
    assert between.to_dict()["base"] == "empty"
    with pytest.raises(ValueError, match="cannot be written as changes to REFERENCE"):
        between.to_dict(REFERENCE)
    for base in (BufferSet([SAMPLER]), REFERENCE.without("logits"), "reference"):
        with pytest.raises(ValueError, match="base must be REFERENCE or an empty"):
            off.to_dict(base)


@pytest.mark.parametrize("data,exc,words", [
    ([], TypeError, ("a table",)), ("x", TypeError, ("a table",)),
    ({"bases": "reference"}, ValueError, ("unknown key 'bases'",)),
    ({"base": "ref"}, ValueError, ("base must be",)),
    ({"base": None}, ValueError, ("base must be",)),
    ({"drop": "logits"}, TypeError, ("drop must be a list",)),
    ({"drop": [1]}, TypeError, ("drop must be a list",)),
    ({"drop": ["logit"]}, ValueError, ("unknown buffer name 'logit'",)),
    ({"replace": []}, TypeError, ("replace must be a table",)),
    ({"replace": {"logits": 3}}, TypeError, ("replace.logits",)),
    ({"replace": {"logits": {"colour": 1}}}, TypeError, ("unknown field 'colour'",)),
    ({"replace": {"logits": {"size": "M ** 2"}}}, ValueError, ("buffer spec 'logits'", "Pow")),
    ({"replace": {"nope": {"size": 1}}}, ValueError, ("unknown buffer name 'nope'",)),
    ({"buffer": {"name": "x"}}, TypeError, ("buffer must be a list",)),
    ({"buffer": [{"size": 1}]}, TypeError, ("buffer[0] must be a table with a name",)),
    ({"buffer": [3]}, TypeError, ("buffer[0]",)),
    ({"buffer": [{"name": 3, "size": 1}]}, TypeError, ("buffer[0]",)),
    ({"buffer": [{"name": "x", "size": 1, "colour": 1}]}, TypeError, ("buffer spec 'x'", "colour")),
    ({"buffer": [{"name": "x", "size": 1}, {"name": "x", "size": 2}]}, ValueError,
     ("buffer spec 'x'", "twice")),
    ({"buffer": [{"name": "hidden_states", "size": 1}]}, ValueError, ("'hidden_states'", "twice")),
    ({"buffer": [{"name": "x", "shape": ["M", 0], "dtype": "float32"}]}, ValueError,
     ("buffer spec 'x'", "shape[1]")),
    ({"buffer": [{"name": "x", "size": "M", "align": 100}]}, ValueError,
     ("buffer spec 'x'", "align")),
    ({"buffer": [{"name": "x", "size": 1.5}]}, TypeError, ("buffer spec 'x'", "size")),
])
def test_bad_data_is_refused_naming_where(data, exc, words):
    with pytest.raises(exc) as e:
        BufferSet.from_dict(data, "my.toml")
    msg = str(e.value)
    assert msg.startswith("my.toml: "), msg
    for w in words:
        assert w in msg, (w, msg)


def test_files_past_the_bounds_are_refused_before_they_are_parsed(tmp_path, monkeypatch):
    """A parser recurses once a level (100,000 '[' raised RecursionError) and
    TOML's took seconds for 250,000 tables: the bytes are bounded first, so
    no parser runs at all (each is replaced by one that fails the test)."""
    from metrale._sizing import buffers as B
    assert (B.MAX_FILE_BYTES, B.MAX_DEPTH, B.MAX_TABLES) == (1 << 20, 32, 1024)
    cases = {
        "deep.json": ("[" * 100_000 + "]" * 100_000, "nested more than 32 levels deep"),
        "deep.toml": ("x = " + "[" * 100_000 + "]" * 100_000 + "\n",
                      "nested more than 32 levels deep"),
        "table.toml": ("x = " + "{a = " * 40 + "1" + "}" * 40 + "\n", "nested more than 32"),
        "just.json": ("[" * 33 + "]" * 33, "nested more than 32"),
        "many.toml": ('[[buffer]]\nname = "x"\nsize = 1\n' * 1025,
                      r"more than 1024 tables \(1025\)"),
        "many.json": (json.dumps({"buffer": [{"name": f"b{i}", "size": 1} for i in range(1025)]}),
                      r"more than 1024 tables \(1026\)"),
        "arrays.json": ('{"drop": [' + "[]," * 20_000 + "[]]}", "more than 16384 arrays"),
        "huge.json": (" " * (1 << 20) + "{}", "larger than 1 MiB"),
    }
    parsers = [json]
    try:
        import tomllib
        parsers.append(tomllib)
    except ImportError:                 # Python 3.10: tomli, where installed
        pass
    for mod in parsers:
        monkeypatch.setattr(mod, "loads", lambda *a, **k: pytest.fail("parsed"))
    for name, (text, words) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: {words}"):
            BufferSet.load(path)


def test_files_at_the_bounds_load(tmp_path):
    """Brackets in strings and comments are not structure: 256 buffers whose
    texts are full of brackets load, as JSON and as TOML; 32 levels pass the
    bound (the parser then judges the file)."""
    mine = BufferSet([BufferSpec(f"b{i}", "float32", ["M", 4],
                                 holds=f"row [{i}] of {{x}} ]]] [[[ '\"")
                      for i in range(256)])
    path = tmp_path / "max.json"
    path.write_text(json.dumps(mine.to_dict()))
    assert BufferSet.load(path) == mine
    lines = ['base = "empty"  # [[[[ {{{{']
    for spec in mine:
        lines += ["[[buffer]]", f'name = "{spec.name}"', 'dtype = "float32"',
                  'shape = ["M", 4]', f"holds = {json.dumps(spec.holds)}"]
    path = tmp_path / "max.toml"
    path.write_text("\n".join(lines) + "\n")
    assert BufferSet.load(path) == mine
    at = tmp_path / "at.json"
    at.write_text('{"base": "empty", "x": ' + "[" * 31 + "]" * 31 + "}")
    with pytest.raises(ValueError, match="unknown key 'x'"):      # parsed: within the bound
        BufferSet.load(at)
    strings = tmp_path / "strings.toml"
    strings.write_text('base = "empty"\n[[buffer]]\nname = "x"\nsize = 1\n'
                       "holds = '''\n" + "[" * 100 + "'''\n"
                       'words = """' + "{" * 100 + '\\""" ]"""\n')
    assert BufferSet.load(strings)["x"].holds == "[" * 100


def test_a_set_past_the_buffer_count_is_refused_before_its_specs_are_built():
    bad = [{"name": f"b{i}", "dtype": "no-such-type", "size": 1} for i in range(257)]
    with pytest.raises(ValueError, match="at most 256 buffers, got 257"):
        BufferSet.from_dict({"base": "empty", "buffer": bad})
    with pytest.raises(ValueError, match="at most 256 buffers, got 257"):
        BufferSet.from_dict({"base": "reference", "buffer": bad[:211]})     # 46 + 211


def test_bad_files_are_refused_naming_the_file(tmp_path):
    cases = {"bad.toml": b"base = \n", "bad.json": b"{\"base\": ", "latin.toml": b"base = '\xe9'\n",
             "latin.json": b"\xff\xfe", "list.json": b"[1, 2]",
             "unknown.toml": b"colour = 'red'\n", "zero.json": json.dumps(
                 {"buffer": [{"name": "x", "dtype": "float32", "shape": [0]}]}).encode()}
    for name, raw in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        with pytest.raises((ValueError, TypeError)) as e:
            BufferSet.load(path)
        assert str(path) in str(e.value), (name, str(e.value))
    with pytest.raises(OSError):
        BufferSet.load(tmp_path / "missing.toml")
    with pytest.raises(TypeError):
        BufferSet.load(3)
