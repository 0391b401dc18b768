"""Buffer sets as a hostile user and a careless engine use them (issue 23,
docs/buffer-sets.md): every rule of BufferSpec and BufferSet refuses with the
spec and the field named, before anything is sized or allocated; the derived
sets and the files round-trip; and arenas over sets that are not REFERENCE
(plain, reserved, debug, shared between ranks) hold exactly the buffers
their set declares, with the spec's sizes, element types and shapes.

Every expected value here is written out from the docs (sizes as products of
the config's fields, poison patterns, offsets from the placement rule), not
read back from the code under test.  The layout and zeroing properties over
random sets are in tests/test_buffer_set_properties.py."""

import ctypes
import json
import pickle
import re

import pytest

import metrale
from metrale import (REFERENCE, BufferArena, BufferSet, BufferSizes, BufferSpec, HostBackend,
                     MetraleError, ModelConfig)
from metrale.buffers import MAX_BUFFERS, MAX_ZERO_ALL, RESERVED_NAMES

from helpers import FileGroup, live_counts, run_ranks, vm_counts
from reference_oracle import BYTES, COUNT, NAMES, POINTER, ZERO_ALL

np = pytest.importorskip("numpy")

# A small Llama: every size below is a few KiB to a few MiB.
CFG = ModelConfig.preset("llama-3.1-8b").replace(
    hidden_size=256, intermediate_size=512, vocab_size=1000, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64)
H, V, HQ, D = 256, 1000, 4, 64
LIMITS = (50, 256, 16, 8)           # max_batch_tokens, max_seq_len, kv_block_size, max_batch_size
M, BS = LIMITS[0], LIMITS[3]
NOENV = {}


def _ceil(x, n):
    return -(-x // n) * n


def _spec_error(exc, kwargs, *fields, name="probe"):
    """BufferSpec(name, **kwargs) raises `exc` naming the spec and every one of `fields`."""
    with pytest.raises(exc) as e:
        BufferSpec(name, **kwargs)
    msg = str(e.value)
    assert f"buffer spec {name!r}" in msg, msg
    for f in fields:
        assert f in msg, (f, msg)
    return msg


def _sized(*specs, m=M, config=CFG):
    return BufferSizes.from_config(config, m, *LIMITS[1:], env=NOENV, buffers=BufferSet(specs))


def _host_bytes(ptr, n):
    """A writable numpy array over n bytes of this process at address ptr."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))


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
                              "total_bytes", "as_dict", "as_tuple", "from_config", "levers"}
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
    (dict(dtype="float32", shape=["H", "V"], zero_all=True, rows="auto"),
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
        assert BufferSpec("probe", size=size, zero_all=True, rows="auto").rows == "auto"
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


# -- BufferSet: rules across specs ------------------------------------------------------------

def test_a_set_refuses_duplicates_naming_both_places():
    a, b = BufferSpec("a", size=1), BufferSpec("b", size=1)
    with pytest.raises(ValueError) as e:
        BufferSet([a, b, BufferSpec("a", size=2)])
    assert "buffer spec 'a'" in str(e.value) and "specs[0]" in str(e.value) \
        and "specs[2]" in str(e.value)
    with pytest.raises(ValueError, match="'hidden_states'.*twice"):
        REFERENCE.with_(BufferSpec("hidden_states", size=1))


def test_the_zero_all_and_buffer_count_limits():
    zero = [BufferSpec(f"z{i}", size="M", zero_all=True) for i in range(MAX_ZERO_ALL + 1)]
    assert MAX_ZERO_ALL == 30 and MAX_BUFFERS == 256
    assert len(BufferSet(zero[:30])) == 30
    with pytest.raises(ValueError, match="at most 30 buffers may be zero_all.*got 31"):
        BufferSet(zero)
    # REFERENCE has 18: twelve more fit, thirteen do not
    fit = MAX_ZERO_ALL - len(ZERO_ALL)
    assert len(REFERENCE.with_(zero[:fit]).groups["zero_all"]) == 30
    with pytest.raises(ValueError, match="zero_all"):
        REFERENCE.with_(zero[:fit + 1])
    with pytest.raises(ValueError, match="zero_all"):
        REFERENCE.replace("o_latent", zero_all=True).with_(zero[:fit])
    many = [BufferSpec(f"b{i}", size=1) for i in range(MAX_BUFFERS + 1)]
    assert len(BufferSet(many[:256])) == 256
    with pytest.raises(ValueError, match="at most 256 buffers, got 257"):
        BufferSet(many)
    with pytest.raises(ValueError, match="256"):
        REFERENCE.with_(many[:211])


def test_token_ids_is_in_no_zeroing_helper():
    ids = REFERENCE["token_ids"]
    for change in (dict(zero_all=True), dict(zero_all=True, prefill=True),
                   dict(zero_all=True, rows="M")):
        with pytest.raises(ValueError, match="buffer spec 'token_ids': zero_all"):
            REFERENCE.replace("token_ids", **change)
        with pytest.raises(ValueError, match="token_ids"):
            BufferSet([ids.replace(**change)])
    # another buffer may be zeroed; a buffer renamed token_ids is checked too
    with pytest.raises(ValueError, match="token_ids"):
        BufferSet([BufferSpec("x", size="M", zero_all=True)]).replace("x", name="token_ids")


def test_set_arguments_of_the_wrong_type():
    spec = BufferSpec("a", size=1)
    for bad in ("abc", b"abc", spec, 3):
        with pytest.raises(TypeError):
            BufferSet(bad)
    with pytest.raises(TypeError, match=r"specs\[1\] must be a BufferSpec"):
        BufferSet([spec, {"name": "b", "size": 1}])
    with pytest.raises(TypeError):
        REFERENCE.with_("hidden_states")
    with pytest.raises(TypeError, match="buffers must be a BufferSet"):
        BufferSizes.from_config(CFG, *LIMITS, env=NOENV, buffers=[spec])
    with pytest.raises(TypeError, match="buffers must be a BufferSet"):
        BufferArena.new(CFG, *LIMITS, HostBackend(), env=NOENV, buffers=(spec,))


# -- sizing-time errors: named, and nothing allocated ------------------------------------------

SIZING_ERRORS = [
    # (spec, words the message must hold besides the spec's name and max_batch_tokens)
    (BufferSpec("probe", size="M * 18446744073709551615"), ("exceeds 2^64 - 1",)),
    (BufferSpec("probe", "float32", ["M", 2**62]), ("exceeds 2^64 - 1",)),
    (BufferSpec("probe", size="M - 2 * M"), ("size", "not a size in bytes")),
    (BufferSpec("probe", "float32", ["M", "H - 2 * H"]), ("size", "not a size in bytes")),
    # CPython's words: "integer division or modulo by zero", "division by zero" (3.14)
    (BufferSpec("probe", size="M // (M - M)"), ("size", "by zero")),
    (BufferSpec("probe", size="cdiv(H, M - M)"), ("size", "by zero")),
    (BufferSpec("probe", size="M % (H - H)"), ("size", "by zero")),
    (BufferSpec("probe", size="M > 3"), ("size", "not a size in bytes")),     # a bool
]


@pytest.mark.parametrize("spec,words", SIZING_ERRORS,
                         ids=[s.formula[:24] for s, _ in SIZING_ERRORS])
def test_sizing_errors_name_the_spec_and_max_batch_tokens_and_allocate_nothing(spec, words):
    buffers = REFERENCE.with_(spec)
    with pytest.raises(ValueError) as e:
        BufferSizes.from_config(CFG, *LIMITS, env=NOENV, buffers=buffers)
    msg = str(e.value)
    assert "probe" in msg and f"max_batch_tokens={M}" in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    for kw in ({}, {"reserve": (2 * M,) + LIMITS[1:]}, {"debug": True}):
        gpu = HostBackend()
        with pytest.raises(ValueError) as e2:
            BufferArena.new(CFG, *LIMITS, gpu, env=NOENV, buffers=buffers, **kw)
        assert "probe" in str(e2.value)
        assert gpu.alloc_count == 0 and live_counts(gpu) == (0, 0) and vm_counts(gpu) == (0, 0, 0)


def test_a_size_that_only_fails_at_the_reserved_limits_allocates_nothing():
    # fine at M = 50, negative from M = 64 on: the reserved sizing refuses
    spec = BufferSpec("probe", size="(64 - M) * 256 + 1")
    assert _sized(spec)["probe"] == 14 * 256 + 1
    gpu = HostBackend()
    with pytest.raises(ValueError, match="probe.*max_batch_tokens=100"):
        BufferArena.new(CFG, *LIMITS, gpu, env=NOENV, buffers=BufferSet([spec]),
                        reserve=(100,) + LIMITS[1:])
    assert gpu.alloc_count == 0 and vm_counts(gpu) == (0, 0, 0)


def test_sizes_that_fit_but_a_slab_that_does_not():
    half = (1 << 63) - 1                    # each fits, their sum fits; the padding does not
    buffers = BufferSet([BufferSpec("a", size=half), BufferSpec("b", size=half)])
    sizes = BufferSizes.from_config(CFG, *LIMITS, env=NOENV, buffers=buffers)
    assert sizes.as_tuple() == (half, half)
    gpu = HostBackend()
    with pytest.raises(ValueError, match="exceeds 2\\^64 - 1.*max_batch_tokens=50"):
        BufferArena.new(CFG, *LIMITS, gpu, env=NOENV, buffers=buffers)
    assert gpu.alloc_count == 0
    over = BufferSet([BufferSpec("a", size=2**64 - 1), BufferSpec("b", size=1)])
    with pytest.raises(ValueError, match="sum of all buffer sizes.*max_batch_tokens=50"):
        BufferSizes.from_config(CFG, *LIMITS, env=NOENV, buffers=over)


# -- derived sets ----------------------------------------------------------------------------

SAMPLER = BufferSpec("sampler_probs", "float32", ["max_batch_size", "vocab_size"])
LSE = BufferSpec("splitkv_lse", "float32", ["max_batch_size", "num_attention_heads", 16],
                 zero_all=True)
STAGING = BufferSpec("allreduce_staging", "bfloat16", ["max_batch_tokens", "hidden_size"],
                     zero_all=True, rows="M", align=4096)


def test_without_with_and_replace_make_new_sets():
    drop = ("ffn_act_q8", "fp8_act", "logits")
    s = REFERENCE.without(drop)
    assert len(REFERENCE) == COUNT and len(s) == COUNT - 3
    assert s.names == tuple(n for n in NAMES if n not in drop)
    assert REFERENCE.without("logits") == REFERENCE.without(["logits"]) == \
        REFERENCE.without(iter(["logits"]))
    assert REFERENCE.without(()) == REFERENCE
    with pytest.raises(ValueError, match="unknown buffer name 'logit'.*did you mean logits"):
        REFERENCE.without(["logit"])
    for bad in (3, [3], ["logits", None], [b"logits"]):
        with pytest.raises(TypeError, match="names"):
            REFERENCE.without(bad)
    with pytest.raises(TypeError, match="buffer names are str"):
        REFERENCE.index(3)
    with pytest.raises(TypeError, match="buffer names are str"):
        REFERENCE.replace(3, size=1)
    t = s.with_([SAMPLER, LSE]).with_(STAGING)
    assert t.names[-3:] == ("sampler_probs", "splitkv_lse", "allreduce_staging")
    assert t["sampler_probs"] is SAMPLER and t.index("splitkv_lse") == COUNT - 3 + 1
    u = t.replace("hidden_states", dtype="float32", size="4*M*H")
    assert u.index("hidden_states") == 0 and u["hidden_states"].formula == "4*M*H"
    assert u["hidden_states"].dtype == "float32"
    assert t["hidden_states"] == REFERENCE["hidden_states"]
    r = t.replace("sampler_probs", name="sampler_ws")
    assert r.names[-3] == "sampler_ws" and "sampler_probs" not in r
    # a shape-sized spec is sized again from a new shape
    w = t.replace("sampler_probs", shape=["max_batch_size", "vocab_size", 2])
    assert w["sampler_probs"].formula == "4*max_batch_size*vocab_size*2"
    with pytest.raises(TypeError, match="unknown field 'colour'"):
        t.replace("sampler_probs", colour="red")
    with pytest.raises(TypeError, match="unknown field 'formula'"):
        t.replace("sampler_probs", formula="M")
    with pytest.raises(ValueError, match="buffer spec 'sampler_probs': rows"):
        t.replace("sampler_probs", zero_all=True, rows="M")     # no token dimension
    with pytest.raises(ValueError, match="unknown buffer name"):
        t.replace("nope", size=1)


def test_sets_compare_hash_pickle_and_refuse_changes():
    a = REFERENCE.without("logits").with_(SAMPLER)
    b = REFERENCE.without(["logits"]).with_([SAMPLER])
    assert a == b and hash(a) == hash(b) and a is not b
    assert a != REFERENCE and a != list(a) and a.fingerprint() == b.fingerprint()
    assert pickle.loads(pickle.dumps(a)) == a
    assert pickle.loads(pickle.dumps(SAMPLER)) == SAMPLER
    for obj, attr in ((a, "_specs"), (a, "names"), (SAMPLER, "size"), (SAMPLER, "name")):
        with pytest.raises(AttributeError):
            setattr(obj, attr, None)
        with pytest.raises(AttributeError):
            delattr(obj, attr)
    with pytest.raises(KeyError):
        a["logits"]
    assert "logits" not in a and 3 not in a and "sampler_probs" in a
    assert a.groups["zero_all"] == tuple(n for n in ZERO_ALL if n != "logits")
    groups = a.groups
    groups["zero_all"] = ()
    assert a.groups["zero_all"]                     # a copy each time
    assert BufferSet() == BufferSet([]) and len(BufferSet()) == 0


def test_the_fingerprint_follows_what_decides_the_layout_only():
    base = BufferSet([STAGING, SAMPLER])
    fp = base.fingerprint()
    assert re.fullmatch(r"[0-9a-f]{32}", fp)
    assert base.replace("sampler_probs", holds="its text").fingerprint() == fp
    changed = [base.replace("allreduce_staging", align=8192),
               base.replace("allreduce_staging", rows="Mp"),
               base.replace("allreduce_staging", prefill=True),
               base.replace("allreduce_staging", checksum=True),
               base.replace("sampler_probs", dtype="int32"),
               base.replace("sampler_probs", init_zero=True),
               base.replace("sampler_probs", shape=["max_batch_size", "vocab_size", 2]),
               base.replace("sampler_probs", name="sampler_ws"),
               BufferSet([SAMPLER, STAGING])]
    fps = {s.fingerprint() for s in changed}
    assert fp not in fps and len(fps) == len(changed)


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


# -- arenas over custom sets (HostBackend) -----------------------------------------------------

STEP_SPECS = (REFERENCE["token_ids"], REFERENCE["scratch"])
CUSTOM = BufferSet([
    STAGING,                                                            # rows "M", align 4096
    BufferSpec("tiled", "bfloat16", ["Mp", "hidden_size"], zero_all=True, rows="Mp", prefill=True),
    BufferSpec("auto_rows", "float32", ["M", 3], zero_all=True, rows="auto", checksum=True),
    SAMPLER,                                                            # not zeroed
    LSE,                                                                # zeroed whole
    BufferSpec("flags", "int32", [7], init_zero=True),
    BufferSpec("raw", size="M * 3 + 5", zero_all=True, rows="auto"),    # rows do not divide
    BufferSpec("nothing", "float32", ["M", "E"]),                       # E = 0: empty
    BufferSpec("idx", "int32", ["M", 2], zero_all=True, rows="M"),
])
# Each size, written out from the config: product of the dims times the element size.
CUSTOM_SIZES = {"allreduce_staging": 2 * M * H, "tiled": 2 * _ceil(M, 16) * H,
                "auto_rows": 4 * M * 3, "sampler_probs": 4 * BS * V,
                "splitkv_lse": 4 * BS * HQ * 16,
                "flags": 28, "raw": 3 * M + 5, "nothing": 0, "idx": 8 * M}


def _new(buffers=CUSTOM, gpu=None, limits=LIMITS, **kw):
    return BufferArena.new(CFG, *limits, gpu or HostBackend(), env=NOENV, buffers=buffers, **kw)


def test_sizes_of_a_custom_set_are_its_specs():
    sizes = BufferSizes.from_config(CFG, *LIMITS, env=NOENV, buffers=CUSTOM)
    assert sizes.as_dict() == CUSTOM_SIZES and sizes.buffers is CUSTOM
    assert tuple(sizes) == CUSTOM.names and sizes.sampler_probs == 4 * BS * V
    assert sizes.total_bytes() == sum(CUSTOM_SIZES.values())
    with pytest.raises(AttributeError, match="no buffer of that name"):
        sizes.hidden_states
    assert "hidden_states" not in sizes
    # by hand: every entry of the set, nothing else
    by_hand = BufferSizes(CUSTOM, **CUSTOM_SIZES)
    assert by_hand.as_dict() == sizes.as_dict() and by_hand.limits is None
    with pytest.raises(TypeError, match="missing entries: raw"):
        BufferSizes(CUSTOM, **{k: v for k, v in CUSTOM_SIZES.items() if k != "raw"})
    with pytest.raises(TypeError, match="no entry 'hidden_states'"):
        BufferSizes(CUSTOM, hidden_states=1, **CUSTOM_SIZES)
    with pytest.raises(ValueError, match="size of raw"):
        BufferSizes(CUSTOM, **{**CUSTOM_SIZES, "raw": -1})


def test_every_buffer_by_name_and_the_pointer_table():
    gpu = HostBackend()
    with _new(gpu=gpu) as a:
        ptrs = a.ptrs
        assert tuple(n for n, _ in ptrs) == CUSTOM.names
        seen = []
        for name in CUSTOM.names:
            p, n = a.ptr(name), a.nbytes(name)
            assert n == CUSTOM_SIZES[name], name
            assert getattr(ptrs, name) == p == a.buffers[name].ptr, name
            assert a.buffers[name].nbytes == n and a.buffers[name].dtype == CUSTOM[name].dtype
            if n == 0:
                assert p == 0, name
                continue
            assert p % CUSTOM[name].align == 0, name
            seen.append((p, p + n, name))
        seen.sort()
        for (_, end, x), (start, _, y) in zip(seen, seen[1:]):
            assert end <= start, (x, y)
        base = min(s for s, _, _ in seen)
        # the slab holds room to move its base up to the set's largest
        # alignment (4096 here), counted in slab_bytes and allocated
        assert max(e for _, e, _ in seen) - base <= a.slab_bytes() - (4096 - 256)
        assert gpu.live_bytes == a.slab_bytes()
        for bad in ("hidden_states", "nothin", ""):
            with pytest.raises(ValueError, match="name: unknown buffer name"):
                a.ptr(bad)
            with pytest.raises(ValueError, match="name: unknown buffer name"):
                a.nbytes(bad)
        for bad in (3, None, b"raw"):
            with pytest.raises(TypeError, match="name must be a str"):
                a.ptr(bad)
            with pytest.raises(TypeError, match="name must be a str"):
                a.nbytes(bad)
        with pytest.raises(AttributeError, match="read-only"):
            ptrs.raw = 1
        with pytest.raises(AttributeError, match="read-only"):
            del ptrs.raw
        with pytest.raises(AttributeError):
            ptrs.hidden_states
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(ptrs)
        assert a.sizes().buffers is CUSTOM
    # release: every pointer 0, in the table the engine kept too; sizes stay
    assert all(v == 0 for _, v in ptrs) and a.ptr("raw") == 0 and ptrs is a.ptrs
    assert a.nbytes("raw") == CUSTOM_SIZES["raw"]
    assert live_counts(gpu) == (0, 0)


def test_the_compiled_accessors_of_dropped_reference_buffers_refuse():
    kept = ("hidden_states", "logits", "scratch")
    buffers = BufferSet([REFERENCE[n] for n in kept]).with_(SAMPLER)
    with _new(buffers) as a:
        for name in POINTER:
            if name in kept:
                assert getattr(a, name)() == a.ptr(name) != 0
            else:
                with pytest.raises(MetraleError, match=f"{name}: not in this arena's buffer set"):
                    getattr(a, name)()
        for name in BYTES:
            if name in kept:
                assert getattr(a, f"{name}_bytes")() == a.nbytes(name)
            else:
                with pytest.raises(MetraleError, match=f"{name}: not in this arena's buffer set"):
                    getattr(a, f"{name}_bytes")()
        with pytest.raises(MetraleError, match="buffer set has no moe_fp8_scratch"):
            a.moe_fp8_scratch(ModelConfig.preset("qwen3-30b-a3b"), 1)
        with pytest.raises(MetraleError, match="its buffer set lacks the slab"):
            a.take_ssm_rowwise_w_bf16(16)
    # a set without hidden_states in front: the accessors still find theirs
    moved = BufferSet([SAMPLER, REFERENCE["logits"], REFERENCE["hidden_states"]])
    with _new(moved) as a:
        assert a.hidden_states() == a.ptr("hidden_states") and a.logits() == a.ptr("logits")
        assert a.logits_bytes() == 2 * min(M, max(160, 32 + 1)) * V


def test_a_reference_buffer_changed_by_the_set():
    buffers = REFERENCE.replace("logits", dtype="float32", size="4*Lr*V")
    with _new(buffers) as a, _new(REFERENCE) as r:
        assert a.logits_bytes() == 2 * r.logits_bytes() == 4 * M * V      # Lr = min(M, ...) = M
        assert a.view("logits").dtype == "float32" and a.view("logits").shape == (M, V)


def test_step_inputs_need_token_ids_and_scratch():
    for buffers, missing in ((CUSTOM, "token_ids and scratch"),
                             (CUSTOM.with_(STEP_SPECS[0]), "scratch"),
                             (CUSTOM.with_(STEP_SPECS[1]), "token_ids")):
        gpu = HostBackend()
        with _new(buffers, gpu) as a:
            with pytest.raises(MetraleError, match=f"buffer set has no {missing}:"):
                a.step_inputs()
            assert gpu.host_alloc_count == 0


def test_step_inputs_buffers_keep_the_reference_alignment():
    # one upload reaches token_ids and scratch back to back: no other alignment
    for i, name in ((0, "token_ids"), (1, "scratch")):
        with pytest.raises(ValueError, match=f"buffer spec '{name}': align: .*256 only"):
            CUSTOM.with_(STEP_SPECS[i].replace(align=512))
    with pytest.raises(ValueError, match="buffer spec 'token_ids': zero_all"):
        CUSTOM.with_(STEP_SPECS[0].replace(zero_all=True))


def test_step_inputs_work_over_a_custom_set():
    # the step inputs placed first, back to back, whatever the set's order:
    # the one upload reaches both
    buffers = CUSTOM.with_([STEP_SPECS[1], STEP_SPECS[0]])
    gpu = HostBackend()
    with _new(buffers, gpu) as a:
        assert a.ptr("token_ids") + _ceil(a.nbytes("token_ids"), 256) == a.ptr("scratch")
        for name in ("allreduce_staging", "tiled", "sampler_probs"):
            _host_bytes(a.ptr(name), a.nbytes(name))[:] = 0xAB
        with a.step_inputs() as st:
            st.fill(np.arange(5, dtype=np.uint32) + 7)
            st.upload()
            assert list(_host_bytes(a.ptr("token_ids"), 20).view(np.uint32)) == [7, 8, 9, 10, 11]
            count = _host_bytes(a.ptr("scratch") + 32752, 4).view(np.int32)[0]
            assert count == 5
            # zero_all_rows for the 5 uploaded tokens: staging's first 5 rows,
            # tiled's first 16, the not-zeroed sampler untouched
            staging = _host_bytes(a.ptr("allreduce_staging"), a.nbytes("allreduce_staging"))
            assert not staging[:5 * 2 * H].any() and (staging[5 * 2 * H:] == 0xAB).all()
            tiled = _host_bytes(a.ptr("tiled"), a.nbytes("tiled"))
            assert not tiled[:16 * 2 * H].any() and (tiled[16 * 2 * H:] == 0xAB).all()
            assert (_host_bytes(a.ptr("sampler_probs"), 4 * BS * V) == 0xAB).all()


def test_views_take_the_spec_dtype_and_exact_shape():
    shapes = {"allreduce_staging": ("bfloat16", (M, H)), "tiled": ("bfloat16", (_ceil(M, 16), H)),
              "auto_rows": ("float32", (M, 3)), "sampler_probs": ("float32", (BS, V)),
              "splitkv_lse": ("float32", (BS, HQ, 16)), "flags": ("int32", (7,)),
              "idx": ("int32", (M, 2))}
    with _new() as a:
        for name, (dtype, shape) in shapes.items():
            v = a.view(name)
            assert (v.dtype, v.shape, v.ptr, v.nbytes) == (dtype, shape, a.ptr(name),
                                                          a.nbytes(name)), name
            del v
        arr = np.asarray(a.view("sampler_probs"))
        assert arr.dtype == np.float32 and arr.shape == (BS, V)
        del arr
        with pytest.raises(TypeError, match="raw has no element type|holds raw bytes"):
            a.view("raw")
        assert a.view("raw", "uint8").shape == (3 * M + 5,)
        assert a.view("tiled", "uint8").shape == (2 * _ceil(M, 16) * H,)
        # an empty buffer: only an empty view
        assert a.view("nothing").shape == (M, 0)
        with pytest.raises(ValueError, match="unknown buffer name"):
            a.view("hidden_states")


def test_views_of_text_shapes_and_conditional_shapes():
    buffers = BufferSet([
        BufferSpec("exact", "float32", "[M, 2*H]", shape_exact=True, size="4*M*2*H"),
        BufferSpec("described", "float32", "[M, H] or [M, 2*H]", size="max(4*M*H, 8*M*H)"),
        BufferSpec("when", "bfloat16", ["M", "H"], shape_when="E > 0"),      # dense: not exact
        BufferSpec("floored", "int32", ["max_batch_size"], floor=4096),
        BufferSpec("bytes4", shape=["M", 5], itemsize=4),                     # no dtype: raw
    ])
    with _new(buffers) as a:
        assert a.view("exact").shape == (M, 2 * H)
        assert a.view("described").shape == (2 * M * H,)          # only a description: 1-D
        assert a.view("when").shape == (M * H,)
        assert a.nbytes("floored") == 4096 and a.view("floored").shape == (BS,)
        assert a.nbytes("bytes4") == 4 * M * 5
        with pytest.raises(TypeError, match="give a dtype"):
            a.view("bytes4")


def _fill(a, value):
    for name in a.sizes().buffers.names:
        if a.nbytes(name):
            _host_bytes(a.ptr(name), a.nbytes(name))[:] = value


def _zeroed_prefix(a, name):
    """How many bytes from the start of `name` are 0 (the rest must hold 0xAB)."""
    data = _host_bytes(a.ptr(name), a.nbytes(name))
    nz = np.flatnonzero(data)
    k = int(nz[0]) if len(nz) else len(data)
    assert (data[k:] == 0xAB).all(), f"{name}: bytes past {k} changed"
    return k


# zero_all_rows(tokens=3) over CUSTOM at M = 50: the rule of each buffer, by hand
ROWS3 = {"allreduce_staging": 3 * 2 * H, "tiled": 16 * 2 * H, "auto_rows": 3 * 12,
         "splitkv_lse": 4 * BS * HQ * 16, "raw": 3 * M + 5, "idx": 3 * 8}


def test_zeroing_a_custom_set_on_the_host():
    with _new() as a:
        _fill(a, 0xAB)
        a.zero_all_rows(tokens=3)
        got = {n: _zeroed_prefix(a, n) for n in CUSTOM.names if a.nbytes(n)}
        assert got == {**dict.fromkeys(got, 0), **ROWS3}
        _fill(a, 0xAB)
        a.zero_prefill_essentials()
        assert {n: _zeroed_prefix(a, n) for n in got} == {**dict.fromkeys(got, 0),
                                                          "tiled": CUSTOM_SIZES["tiled"]}
        _fill(a, 0xAB)
        a.zero_all()
        zero_all = CUSTOM.groups["zero_all"]
        assert {n: _zeroed_prefix(a, n) for n in got} == {
            n: CUSTOM_SIZES[n] if n in zero_all else 0 for n in got}


def test_thirty_zero_all_buffers_and_a_count_read_inside_one():
    # 30 zero_all buffers (scratch and 29 more), the most one zero_all_rows
    # launch holds, plus the entry the count's hole splits off: every layout
    specs = [BufferSpec(f"z{i}", "float32", ["M", i % 5 + 1], zero_all=True,
                        rows=("M", "Mp", "auto", "whole")[i % 4], prefill=i % 7 == 0)
             for i in range(29)]
    buffers = BufferSet(specs + list(STEP_SPECS))
    assert len(buffers.groups["zero_all"]) == 30
    hole = 16 * 12 + 4          # z13 is [M, 4] float32: row 12, its second word
    for kw in ({}, {"debug": True}, {"reserve": (64,) + LIMITS[1:]}):
        with _new(buffers, **kw) as a:
            _fill(a, 0xAB)
            _host_bytes(a.ptr("z13") + hole, 4).view(np.int32)[0] = 7
            a.zero_all_rows(tokens_at=a.ptr("z13") + hole)
            for spec in specs:
                n = a.nbytes(spec.name)
                data = _host_bytes(a.ptr(spec.name), n).copy()
                # 4 * k * 50 bytes: rows of M = 50 divide them, rows of 64 never
                live = n if spec.rows in ("whole", "Mp") else 7 * (n // M)
                if spec.name == "z13":              # "Mp": cleared whole, but the count
                    assert list(data[hole:hole + 4].view(np.int32)) == [7]
                    data[hole:hole + 4] = 0
                assert not data[:live].any() and (data[live:] == 0xAB).all(), (spec.name, kw)
            with a.step_inputs() as st:
                st.fill(np.arange(3, dtype=np.uint32))
                st.upload()
                assert list(_host_bytes(a.ptr("token_ids"), 12).view(np.uint32)) == [0, 1, 2]
                assert not _host_bytes(a.ptr("z1"), 3 * 8).any()       # [M, 2]: 3 rows


def test_a_count_buffer_of_its_own_keeps_its_count():
    # A 4-byte zero_all buffer holding the count, between two others: the
    # hole covers it whole, so it has no entry of its own, and the padding
    # the buffer before it takes along used to run over it to the next one.
    buffers = BufferSet([BufferSpec("before", size=100, zero_all=True, prefill=True),
                         BufferSpec("count", "int32", [1], zero_all=True, prefill=True),
                         BufferSpec("rows", "bfloat16", ["M", "H"], zero_all=True, rows="M")])
    for kw in ({}, {"debug": True}, {"reserve": LIMITS}):
        with _new(buffers, **kw) as a:
            for count, live in ((2, 2), (-1, M), (M + 5, M)):
                _fill(a, 0xAB)
                _host_bytes(a.ptr("count"), 4).view(np.int32)[0] = count
                a.zero_all_rows(tokens_at=a.ptr("count"))
                assert _host_bytes(a.ptr("count"), 4).view(np.int32)[0] == count, kw
                assert _zeroed_prefix(a, "before") == 100
                assert _zeroed_prefix(a, "rows") == live * 2 * H


def test_a_reserved_arena_over_a_custom_set():
    gpu = HostBackend()
    top = (200,) + LIMITS[1:]
    with _new(gpu=gpu, reserve=top) as a:
        assert a.is_reserved()
        before = dict(a.ptrs)
        assert a.nbytes("allreduce_staging") == 2 * M * H
        _fill(a, 0xAB)
        a.zero_all_rows(tokens=3)
        assert {n: _zeroed_prefix(a, n) for n in ROWS3} == ROWS3
        a.resize(max_batch_tokens=130)                      # grow: sizes and rows follow
        assert dict(a.ptrs) == before
        sizes = a.sizes()
        assert sizes["allreduce_staging"] == 2 * 130 * H and sizes["raw"] == 3 * 130 + 5
        assert sizes["tiled"] == 2 * 144 * H and sizes["sampler_probs"] == 4 * BS * V
        assert a.nbytes("idx") == 8 * 130 and a.max_batch_tokens() == 130
        _fill(a, 0xAB)
        a.zero_all_rows(tokens=20)
        assert _zeroed_prefix(a, "allreduce_staging") == 20 * 2 * H
        assert _zeroed_prefix(a, "tiled") == 32 * 2 * H
        assert _zeroed_prefix(a, "raw") == 3 * 130 + 5
        assert _zeroed_prefix(a, "idx") == 20 * 8
        a.zero_all()
        for name in CUSTOM.groups["zero_all"]:
            assert _zeroed_prefix(a, name) == a.nbytes(name), name
        # sleep keeping one buffer; the init_zero buffer is zeroed at wake,
        # the zero_all ones too, the kept one restored, others undefined
        _fill(a, 0xCD)
        _host_bytes(a.ptr("sampler_probs"), 8)[:] = range(1, 9)
        a.sleep(keep=["sampler_probs"])
        assert gpu.mapped_bytes == 0 and dict(a.ptrs) == before
        with pytest.raises(MetraleError):
            a.zero_all()
        a.resize(max_batch_tokens=64)                       # asleep: only the limits
        a.wake()
        assert dict(a.ptrs) == before and a.nbytes("raw") == 3 * 64 + 5
        assert not _host_bytes(a.ptr("flags"), 28).any()
        for name in CUSTOM.groups["zero_all"]:
            assert not _host_bytes(a.ptr(name), a.nbytes(name)).any(), name
        kept = _host_bytes(a.ptr("sampler_probs"), 4 * BS * V)
        assert list(kept[:8]) == list(range(1, 9)) and (kept[8:] == 0xCD).all()
        with pytest.raises(ValueError, match="max_batch_tokens=201 exceeds the reserved"):
            a.resize(max_batch_tokens=201)
        committed = a.committed_bytes()
        a.resize(max_batch_tokens=1)
        assert a.committed_bytes() <= committed
    assert vm_counts(gpu) == (0, 0, 0) and live_counts(gpu) == (0, 0)


def test_resize_with_sizes_of_another_set_is_refused():
    with _new(reserve=(100,) + LIMITS[1:]) as a:
        other = BufferSizes.from_config(CFG, *LIMITS, env=NOENV, buffers=CUSTOM.without("raw"))
        with pytest.raises(ValueError, match="another buffer set"):
            a.resize(sizes=other)
        same = BufferSizes.from_config(CFG, 60, *LIMITS[1:], env=NOENV, buffers=CUSTOM)
        a.resize(sizes=same)
        assert a.nbytes("raw") == 3 * 60 + 5


# Poison patterns of docs/debug.md, by element type.
POISON = {"float32": bytes.fromhex("d17fd17f"), "bfloat16": bytes.fromhex("d17f"),
          "int32": bytes.fromhex("00000080")}


def test_a_debug_arena_over_a_custom_set():
    with _new(debug=True) as a:
        assert a.check_guards() == []
        # an overrun of 4 bytes past the end of raw (155 bytes) lands in its band
        _host_bytes(a.ptr("raw") + a.nbytes("raw"), 4)[:] = 0
        bad = a.check_guards()
        band = _ceil(3 * M + 5, 256) - (3 * M + 5) + 4096      # to 256, then the guard bytes
        assert [(g.buffer, g.offset, g.nbytes, g.band_bytes) for g in bad] == [("raw", 0, 4, band)]
        # poison: past the live rows of each row-trimmed buffer, in its dtype
        _fill(a, 0xAB)
        a.poison_rows(tokens=3)
        live = {"allreduce_staging": 3 * 2 * H, "tiled": 16 * 2 * H, "auto_rows": 3 * 12,
                "idx": 3 * 8, "raw": 3 * M + 5}
        for name in CUSTOM.groups["rows"]:
            data = _host_bytes(a.ptr(name), a.nbytes(name)).tobytes()
            k = live[name]
            assert data[:k] == b"\xab" * k, name
            dtype = CUSTOM[name].dtype
            if dtype is None:                       # raw bytes: nothing to poison with
                assert data[k:] == b"\xab" * (len(data) - k)
            else:
                pat = POISON[dtype]
                assert data[k:] == pat * ((len(data) - k) // len(pat)), name
        for name in ("sampler_probs", "splitkv_lse", "flags"):
            assert (_host_bytes(a.ptr(name), a.nbytes(name)) == 0xAB).all()
        # the scan reads the live rows of the float ones only, by their dtype
        a.zero_all()
        assert a.find_nonfinite(tokens=3) == []
        staging = _host_bytes(a.ptr("allreduce_staging"), a.nbytes("allreduce_staging"))
        staging[2 * (2 * H + 5):2 * (2 * H + 5) + 2] = [0x80, 0x7F]      # bf16 +Inf, row 2
        rows = _host_bytes(a.ptr("auto_rows"), a.nbytes("auto_rows")).view(np.float32)
        rows[4 * 3 + 1] = np.nan                                          # row 4: not live at 3
        _host_bytes(a.ptr("idx"), 4).view(np.int32)[0] = -1               # an int: never scanned
        found = a.find_nonfinite(tokens=3)
        assert [(f.buffer, f.nan, f.inf, f.first_offset, f.first_row) for f in found] == \
            [("allreduce_staging", 0, 1, 2 * (2 * H + 5), 2)]
        found = a.find_nonfinite(tokens=M)
        assert [(f.buffer, f.nan, f.first_row) for f in found] == \
            [("allreduce_staging", 0, 2), ("auto_rows", 1, 4)]


def test_the_checksum_probes_the_checksum_specs(caplog):
    with _new() as a:
        _fill(a, 0)
        values = np.arange(1, 3 * M + 1, dtype=np.float32)          # auto_rows: [M, 3] float32
        _host_bytes(a.ptr("auto_rows"), a.nbytes("auto_rows")).view(np.float32)[:] = values
        with caplog.at_level("DEBUG", logger="metrale"):
            a.debug_buffer_checksum(tag="t7", level=10)
        lines = [r.getMessage() for r in caplog.records if "METRALE_BUF_CKSUM" in r.getMessage()]
        assert len(lines) == 1 and lines[0].startswith("METRALE_BUF_CKSUM[t7] auto_rows ")
        n = 3 * M
        assert f"bytes={4 * n} " in lines[0]
        fields = dict(kv.split("=") for kv in lines[0].split()[2:])
        assert float(fields["sum"]) == n * (n + 1) / 2
        assert float(fields["ssq"]) == n * (n + 1) * (2 * n + 1) / 6
        assert float(fields["sabs"]) == n * (n + 1) / 2


def test_fingerprints_over_a_custom_set():
    from test_debug import py_fingerprint      # docs/debug.md's hash, in plain Python
    with _new() as a:
        _fill(a, 0x11)
        _host_bytes(a.ptr("raw") + 100, 1)[:] = 0x12
        fp = a.fingerprint()
        live = [n for n in CUSTOM.names if CUSTOM_SIZES[n]]
        assert list(fp) == live
        for name in live:
            assert fp[name] == py_fingerprint(_host_bytes(a.ptr(name), a.nbytes(name)).tobytes())
        assert a.fingerprint(names=["raw", "nothing"]) == {"raw": fp["raw"],
                                                           "nothing": py_fingerprint(b"")}
        with pytest.raises(ValueError, match="unknown buffer name"):
            a.fingerprint(names=["hidden_states"])


def test_every_address_is_aligned_as_its_spec_asks():
    # The layout aligns offsets in the slab; the backends align their
    # allocations to 256 bytes, their reservations to the page (2 MiB on a
    # GPU).  A buffer's address must be aligned all the same.
    for align in (512, 8192, 1 << 16, 1 << 21):
        buffers = BufferSet([BufferSpec("small", size=100),
                             BufferSpec("big", size="M * 1000", align=align, zero_all=True),
                             BufferSpec("after", size=5, align=1024)])
        for kw in ({}, {"debug": True}, {"reserve": (120,) + LIMITS[1:]},
                   {"reserve": (120,) + LIMITS[1:], "debug": True}):
            gpu = HostBackend()
            with _new(buffers, gpu, **kw) as a:
                for spec in buffers:
                    assert a.ptr(spec.name) % spec.align == 0, (align, kw, spec.name)
                if "reserve" in kw:
                    assert gpu.reserved_bytes == a.slab_bytes() and gpu.live_bytes == 0
                    a.resize(max_batch_tokens=120)
                    assert a.ptr("big") % align == 0 and a.nbytes("big") == 120 * 1000
                else:
                    # room to move the base up to the largest alignment, in slab_bytes
                    assert gpu.live_bytes == a.slab_bytes()
                    assert a.sizes().total_bytes() + max(align, 1024) - 256 <= a.slab_bytes()
                _host_bytes(a.ptr("big"), a.nbytes("big"))[:] = 1
                a.zero_all()
                assert not _host_bytes(a.ptr("big"), a.nbytes("big")).any()
            assert live_counts(gpu) == (0, 0) and vm_counts(gpu) == (0, 0, 0), (align, kw)


# -- tensor parallelism: the set is part of the layout -------------------------------------------

# aligned beyond the host's page: the peers' reservations must be aligned too
ALIGNED = BufferSpec("aligned", "uint8", [1000], align=1 << 16)


def _rank_set(rank, which):
    if which == "same" or rank == 0:
        return CUSTOM.with_(ALIGNED)
    changed = CUSTOM.replace("raw", align=512) if which == "align" else CUSTOM.without("flags")
    return changed.with_(ALIGNED)


def rank_custom(rank, size, path, which):
    """Every rank builds a shared arena over its set: the same set shares
    (peer pointers by name); different sets fail every rank alike."""
    from metrale.tp import PeerGroup
    gpu = HostBackend()
    grp = PeerGroup(FileGroup(path, rank, size), timeout=20.0)
    buffers = _rank_set(rank, which)
    try:
        with BufferArena.new(CFG, *LIMITS, gpu, env=NOENV, buffers=buffers, group=grp) as a:
            other = a.peer(1 - rank)
            offsets = {n: other.ptr(n) - other.ptr("allreduce_staging") for n in buffers.names
                       if a.nbytes(n)}
            mine = {n: a.ptr(n) - a.ptr("allreduce_staging") for n in offsets}
            aligned = all(other.ptr(s.name) % s.align == 0 for s in buffers if a.nbytes(s.name))
            _host_bytes(a.ptr("raw"), a.nbytes("raw"))[:] = 0x30 + rank
            grp.all_gather("written")
            seen = int(_host_bytes(other.ptr("raw"), a.nbytes("raw")).max())
            grp.all_gather("read")
            with pytest.raises(MetraleError, match="not in this arena's buffer set"):
                other.hidden_states()
            return ("ok", offsets == mine and aligned, seen, live_counts(gpu))
    except MetraleError as e:
        return ("error", str(e), None, vm_counts(gpu) + live_counts(gpu))


def test_ranks_with_the_same_custom_set_share_it(tmp_path):
    outs = run_ranks(rank_custom, 2, args=(str(tmp_path), "same"))
    for rank, (what, same_offsets, seen, _) in enumerate(outs):
        assert what == "ok" and same_offsets and seen == 0x30 + (1 - rank), outs


@pytest.mark.parametrize("which", ["align", "dropped"])
def test_ranks_with_different_sets_fail_alike_naming_the_set(tmp_path, which):
    outs = run_ranks(rank_custom, 2, args=(str(tmp_path), which))
    (w0, m0, _, c0), (w1, m1, _, c1) = outs
    assert w0 == w1 == "error" and m0 == m1, outs
    fp0, fp1 = _rank_set(0, which).fingerprint(), _rank_set(1, which).fingerprint()
    assert "rank 1 and rank 0 disagree on the buffer set" in m0
    assert fp0 in m0 and fp1 in m0
    assert c0 == c1 == (0, 0, 0, 0, 0)


def test_metrale_exports_the_set_types():
    assert metrale.BufferSet is BufferSet and metrale.BufferSpec is BufferSpec
    assert metrale.REFERENCE is REFERENCE and repr(REFERENCE) == f"<BufferSet REFERENCE: {COUNT} buffers>"
