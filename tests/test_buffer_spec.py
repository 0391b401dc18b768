"""BufferSpec as a hostile user and a careless engine use it (issue 23,
docs/buffer-sets.md): every rule of each field refuses with the spec and the
field named, before anything is sized or allocated.

Every expected value here is written out from the docs, not read back from
the code under test.  Sets of specs: tests/test_buffer_set.py; their files:
tests/test_buffer_set_files.py; arenas over them: tests/test_custom_sets.py."""

import json

import pytest

from metrale import BufferSet, BufferSizes, BufferSpec
from metrale.buffers import RESERVED_NAMES

from helpers import H, M, V, _sized
from reference_oracle import NAMES


def _spec_error(exc, kwargs, *fields, name="probe"):
    """BufferSpec(name, **kwargs) raises `exc` naming the spec and every one of `fields`."""
    with pytest.raises(exc) as e:
        BufferSpec(name, **kwargs)
    msg = str(e.value)
    assert f"buffer spec {name!r}" in msg, msg
    for f in fields:
        assert f in msg, (f, msg)
    return msg


# -- BufferSpec: each field's rule -------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "a-b", "1a", "a b", "_private", "__x", "class", "None",
                                  "a" * 65, "x\n", "\uff4cogits", "caf\u00e9"])
def test_a_name_must_be_a_plain_identifier(name):
    with pytest.raises(ValueError, match="name must be a Python identifier") as e:
        BufferSpec(name, size=1)
    assert f"buffer spec {name!r}" in str(e.value)


def test_names_at_the_limits_and_reserved_names():
    assert BufferSpec("a" * 64, size=1).name == "a" * 64
    assert BufferSpec("sampler_ws", size=1).name == "sampler_ws"
    # BufferSizes' attributes and methods: a buffer of that name would hide them
    assert RESERVED_NAMES >= {"buffers", "limits", "replace", "keys", "items", "values", "get",
                              "total_bytes", "as_dict", "as_tuple", "from_config", "levers",
                              "config", "target"}
    # every public attribute but the reference buffers' own properties
    public = {n for n in dir(BufferSizes) if not n.startswith("_")} - set(NAMES)
    assert public <= RESERVED_NAMES
    for name in sorted(RESERVED_NAMES):
        assert hasattr(BufferSizes, name), name
        _spec_error(ValueError, dict(size=1), "name is reserved", name=name)


@pytest.mark.parametrize("shape,field", [
    (["M", "hiden_size"], "'hiden_size'"), (["max_batch_token"], "'max_batch_token'"),
    (["M", "layer_types"], "'layer_types'"),        # not an integer: refused
    (["M", "splitk_policy"], "'splitk_policy'"),
    (["M", "__builtins__"], "'__builtins__'"), (["M", "os"], "'os'")])
def test_an_unknown_dimension_name_is_named(shape, field):
    msg = _spec_error(ValueError, dict(dtype="float32", shape=shape), "shape[", field)
    assert "unknown name" in msg


@pytest.mark.parametrize("shape,field", [
    ([0], "shape[0]"), (["M", 0], "shape[1]"), (["M", -1], "shape[1]"),
    (["M", -(2**70)], "shape[1]"),
    (["M", "0"], "shape[1]"),                       # the same widths written as text
    (["M", "-1"], "shape[1]"), (["M", "2 - 3"], "shape[1]"), (["0", "M"], "shape[0]"),
    ("[M, 0]", "shape[1]"),                         # an exact shape's list text
])
def test_a_zero_or_negative_literal_dimension_is_refused(shape, field):
    kwargs = dict(dtype="float32", shape=shape)
    if isinstance(shape, str):
        kwargs["shape_exact"] = True
    _spec_error(ValueError, kwargs, field)


@pytest.mark.parametrize("dim", ["007", "²", "١٢", "1_000", " 4 "])
def test_a_dimension_text_is_checked_as_an_expression(dim):
    # Digits Python does not read as an int literal ("007", superscripts,
    # other scripts' digits) used to pass as "a number" and fail at sizing
    # with a SyntaxError; now they are refused when the spec is made, or
    # (1_000, padded) read as the int they are.
    try:
        spec = BufferSpec("probe", "float32", ["M", dim])
    except ValueError as e:
        assert "buffer spec 'probe'" in str(e) and "shape[1]" in str(e)
        return
    value = {"1_000": 1000, " 4 ": 4}[dim]
    assert _sized(spec)["probe"] == 4 * M * value


def test_dimensions_read_back_as_written():
    # replace() and a buffers file read the dims back from the shape text:
    # the spec (and its fingerprint) must not change on the way
    spec = BufferSpec("probe", "float32", ["(M + 1)", " 2*H", "max(V, 3)"])
    assert spec.shape == "[M + 1, 2 * H, max(V, 3)]"
    assert spec.formula == "4*(M + 1)*(2 * H)*(max(V, 3))"
    assert spec.replace(holds="x").replace(holds="") == spec
    one = BufferSet([spec])
    assert BufferSet.from_dict(json.loads(json.dumps(one.to_dict()))).fingerprint() == \
        one.fingerprint()
    assert _sized(spec)["probe"] == 4 * (M + 1) * 2 * H * V


def test_a_spec_that_does_not_say_how_big_is_refused():
    _spec_error(ValueError, dict(dtype="float32"), "size")
    _spec_error(ValueError, dict(dtype="float32", shape="[M, H]"), "size")    # a description
    _spec_error(ValueError, dict(shape=["M"]), "itemsize")                    # no element width
    _spec_error(ValueError, dict(dtype="float32", shape=[]), "shape", "no dimensions")
    _spec_error(ValueError, dict(dtype="float32", shape=["M", ""]), "shape[1]", "empty")
    _spec_error(ValueError, dict(dtype="float32", shape="M, H", shape_exact=True), "shape")
    _spec_error(ValueError, dict(dtype="float32", shape=["M"], shape_exact=False), "shape_exact")
    _spec_error(ValueError, dict(size=4, shape_exact=True), "shape_exact")


@pytest.mark.parametrize("size,what", [
    ("M ** 2", "Pow"), ("2 ** 64", "Pow"), ("M.bit_length()", "may be called"),
    ("M.real", "Attribute"), ("[M][0]", "Subscript"), ("(lambda: M)()", "may be called"),
    ("(lambda x: x)", "Lambda"), ("'M'", "constant"), ("b'M'", "constant"), ("f'{M}'", "JoinedStr"),
    ("[x for x in (M,)]", "ListComp"), ("sum(x for x in (M,))", "may be called"),
    ("{x: 1 for x in (M,)}", "DictComp"), ("(y := M)", "NamedExpr"), ("abs(M)", "may be called"),
    ("sum((M, H))", "may be called"), ("__import__('os')", "may be called"),
    ("print(M)", "may be called"), ("eval('1')", "may be called"), ("M / 2", "Div"),
    ("M << 2", "LShift"), ("M & 3", "BitAnd"), ("~M", "Invert"), ("M @ M", "MatMult"),
    ("M is M", "compare"), ("M in (M,)", "compare"), ("18446744073709551616", "constant"),
    ("10 ** 30", "Pow"), ("1.5", "constant"), ("1e3", "constant"), ("1j", "constant"),
    ("None", "constant"), ("...", "constant"), ("(M, H)", "Tuple"), ("{M}", "Set"),
    ("max(M, key=H)", "positional"), ("max(*(M, H))", "positional"), ("max()", "positional"),
    ("cdiv(M)", "two arguments"), ("ceil16(M, 2)", "one argument"), ("M if 'x' else H", "constant"),
    ("M +", "not an expression"), ("M; H", "not an expression"), ("", "empty"), ("   ", "empty"),
    ("M" + "+M" * 1000, "longer than"), ("M  # rows", "comment (#)"), ("4 * M#", "comment"),
    ("M + \uff28", "not ASCII"), ("\uff2d", "not ASCII"),
])
def test_disallowed_syntax_in_a_size_is_refused_when_the_spec_is_made(size, what):
    msg = _spec_error(ValueError, dict(size=size), "size")
    assert what in msg, msg


@pytest.mark.parametrize("size", ["max", "min", "cdiv", "ceil16", "M + max", "max(M, min)",
                                  "ceil16(max)", "max(M)", "min(H)"])
def test_a_helper_is_only_called_and_with_what_it_needs(size):
    # A helper named without a call is a function, not a size; max / min of
    # one int iterate it: either used to fail at sizing with a TypeError that
    # named nothing (or, bare, with "<built-in function max> is not a size").
    _spec_error(ValueError, dict(size=size), "size")


def test_a_sets_formulas_are_compiled_from_their_parsed_forms():
    """Formulas over several lines (a continuation, brackets) size as each
    alone does: pasted into one text, a '\\' continuation or a comment in
    one formula used to swallow the next (SyntaxError, IndexError)."""
    forms = {"a": "2 * \\\n M", "b": "(M +\n 1)", "c": "cdiv(M,\n 3) \\\n + 5",
             "d": "max(M,\n\n 7)"}
    for m in (1, 64, 1000):
        got = _sized(*(BufferSpec(n, size=f) for n, f in forms.items()), m=m)
        # a second implementation: each formula alone, as Python reads it
        want = {n: eval(f, {"M": m, "cdiv": lambda a, b: -(-a // b), "max": max})
                for n, f in forms.items()}
        assert {n: got[n] for n in forms} == want


def test_nesting_the_sizing_cannot_compile_is_refused():
    # CPython's parser stops at 200 levels of brackets: a formula is refused
    # at 100, so that its shape's dimensions, a few brackets deeper, parse too
    # (a formula that parsed alone used to fail at sizing with a SyntaxError).
    for size in ["max(" * 199 + "M" + ", 1)" * 199, "(" * 199 + "M" + ")" * 199]:
        _spec_error(ValueError, dict(size=size), "size")
    _spec_error(ValueError, dict(dtype="float32", shape=["M", "(" * 199 + "H" + ")" * 199]),
                "shape[1]")
    deep = "max(" * 40 + "M" + ", 1)" * 40         # deep, but well inside: sized
    assert _sized(BufferSpec("probe", size=deep))["probe"] == M


@pytest.mark.parametrize("kwargs,fields", [
    (dict(size=-1), ("size",)), (dict(size=2**64), ("size",)),
    (dict(dtype="float32", shape=["M", 2**64]), ("shape[1]",)),
    (dict(dtype="float32", shape=["M"], floor=-1), ("floor",)),
    (dict(dtype="float32", shape=["M"], floor=2**64), ("floor",)),
    (dict(dtype="float31", shape=["M"]), ("dtype", "float31")),
    (dict(dtype="float32", shape=["M"], itemsize=2), ("itemsize", "float32")),
    (dict(shape=["M"], itemsize=3), ("itemsize",)), (dict(shape=["M"], itemsize=0), ("itemsize",)),
    (dict(size="M", zero_all=True, rows="m"), ("rows", "'m'")),
    (dict(size="M", zero_all=True, rows="rows"), ("rows",)),
    (dict(dtype="float32", shape=["M"], shape_when="M ** 2"), ("shape_when", "Pow")),
    (dict(dtype="float32", shape=["M"], shape_when="N > 1"), ("shape_when", "'N'")),
])
def test_out_of_range_fields_are_named(kwargs, fields):
    _spec_error(ValueError, kwargs, *fields)


@pytest.mark.parametrize("kwargs,fields", [
    (dict(dtype="float32", shape=["H"], zero_all=True, rows="M"), ("rows", "token dimension")),
    (dict(dtype="float32", shape=["H", "V"], zero_all=True, rows="M|Mp"),
     ("rows", "token dimension")),
    (dict(size=4096, zero_all=True, rows="Mp"), ("rows", "token dimension")),
    (dict(size="4 * R", zero_all=True, rows="M"), ("rows", "token dimension")),   # R: batch rows
    (dict(size="4 * B * max_batch_size", zero_all=True, rows="M"), ("rows", "token dimension")),
    (dict(dtype="float32", shape=["M", "H"], rows="M"), ("rows", "zero_all")),
    (dict(dtype="float32", shape=["M", "H"], prefill=True), ("prefill", "zero_all")),
    (dict(dtype="float32", shape=["M", "H"], rows="Mp", prefill=True), ("zero_all",)),
])
def test_a_helper_flag_the_buffer_cannot_have_is_refused(kwargs, fields):
    _spec_error(ValueError, kwargs, *fields)


def test_row_rules_follow_the_token_dimension_through_derived_symbols():
    # Mp = ceil16(M), Lr = min(M, ...), qT = 8 * cdiv(M, 8): each reads M.
    for size in ["2 * Mp * H", "2 * Lr * V", "qT * 4", "max(M, 256)", "4 * max_batch_tokens"]:
        assert BufferSpec("probe", size=size, zero_all=True, rows="M|Mp").rows == "M|Mp"
    assert BufferSpec("probe", "bfloat16", ["Lr", "V"], zero_all=True, rows="M").rows == "M"


@pytest.mark.parametrize("align", [0, 1, 128, 255, 384, 1000, 3 << 20, 2**31, -256, 2**64])
def test_a_bad_alignment_is_refused(align):
    _spec_error(ValueError, dict(size=1, align=align), "align")


def test_alignments_at_the_limits():
    for align in (256, 512, 4096, 2 << 20, 1 << 30):
        assert BufferSpec("probe", size=1, align=align).align == align


def test_compiled_accessors_are_for_reference_buffers_only():
    msg = _spec_error(ValueError, dict(size=1, accessors=("pointer",)), "accessors",
                      "reference buffers only", "arena.ptr('probe')", "arena.ptrs.probe")
    assert "none 'pointer'" in msg
    # a reference name, but an accessor the reference does not compile for it
    _spec_error(ValueError, dict(size=1, accessors=("bytes",)), "accessors", "'bytes'",
                name="gate_logits_f32")
    _spec_error(ValueError, dict(size=1, accessors=("pointer",)), "accessors",
                name="moe_fp8_scratch")
    _spec_error(ValueError, dict(size=1, accessors=("ptr",)), "accessors", "'ptr'")
    spec = BufferSpec("logits", "float32", ["Lr", "V"], accessors=["bytes", "pointer"])
    assert spec.accessors == ("pointer", "bytes")         # the order of ACCESSORS


@pytest.mark.parametrize("kwargs,field", [
    (dict(dtype=4, shape=["M"]), "dtype"), (dict(dtype=b"float32", shape=["M"]), "dtype"),
    (dict(dtype="float32", shape={"M"}), "shape"), (dict(dtype="float32", shape=5), "shape"),
    (dict(dtype="float32", shape=["M", 1.5]), "shape[1]"),
    (dict(dtype="float32", shape=["M", True]), "shape[1]"),
    (dict(dtype="float32", shape=["M", None]), "shape[1]"),
    (dict(size=1.5), "size"), (dict(size=True), "size"), (dict(size=b"M"), "size"),
    (dict(dtype="float32", shape=["M"], floor="3"), "floor"),
    (dict(dtype="float32", shape=["M"], floor=True), "floor"),
    (dict(shape=["M"], itemsize="4"), "itemsize"), (dict(shape=["M"], itemsize=4.0), "itemsize"),
    (dict(size=1, zero_all=1), "zero_all"),
    (dict(size="M", zero_all=True, prefill="yes"), "prefill"),
    (dict(size=1, checksum=None), "checksum"), (dict(size=1, total=0), "total"),
    (dict(size=1, init_zero=1), "init_zero"), (dict(size=1, rows=None), "rows"),
    (dict(size=1, align="256"), "align"), (dict(size=1, align=256.0), "align"),
    (dict(size=1, align=True), "align"), (dict(size=1, accessors="pointer"), "accessors"),
    (dict(size=1, accessors=None), "accessors"), (dict(size=1, holds=3), "holds"),
    (dict(size=1, words=None), "words"), (dict(size=1, families=["x"]), "families"),
    (dict(dtype="float32", shape="[M]", shape_exact="yes"), "shape_exact"),
    (dict(dtype="float32", shape=["M"], shape_when=1), "shape_when"),
])
def test_wrong_types_are_type_errors_naming_the_field(kwargs, field):
    _spec_error(TypeError, kwargs, field)


def test_a_name_of_the_wrong_type_and_unknown_arguments():
    for name in (3, None, b"x", ["x"]):
        with pytest.raises(TypeError, match="name must be a str"):
            BufferSpec(name, size=1)
    with pytest.raises(TypeError, match="colour"):
        BufferSpec("probe", size=1, colour="red")
