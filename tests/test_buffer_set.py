"""BufferSet as a hostile user and a careless engine use it (issue 23,
docs/buffer-sets.md): the rules across specs refuse with the specs named,
sizing-time errors name the spec and allocate nothing, and the derived sets
(without, with_, replace) are new sets that compare, hash and pickle.

Every expected value here is written out from the docs, not read back from
the code under test.  Each spec's own rules: tests/test_buffer_spec.py; the
layout and zeroing properties over random sets:
tests/test_buffer_set_properties.py."""

import pickle
import re

import pytest

import metrale
from metrale import REFERENCE, BufferArena, BufferSet, BufferSizes, BufferSpec, HostBackend
from metrale.buffers import MAX_BUFFERS, MAX_ZERO_ALL

from helpers import CFG, LIMITS, LSE, M, NOENV, SAMPLER, STAGING, _sized, live_counts, vm_counts
from reference_oracle import COUNT, NAMES, ZERO_ALL


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


# -- derived sets (of REFERENCE and helpers.SAMPLER, LSE, STAGING) -----------------------------

@pytest.mark.parametrize("typed, near", [
    # a slip: one edit (a swap of neighbours counts one), case, separators
    ("logit", ["logits"]), ("hidden_state", ["hidden_states"]), ("lgoits", ["logits"]),
    ("residaul", ["residual"]), ("Hidden-States", ["hidden_states"]), ("fp8_ac", ["fp8_act"]),
    ("hidden_sattes", ["hidden_states"]),                     # two edits in a long name
    # the same words: the first, the last two, or most of them
    ("expert_gate", ["expert_gate_out"]), ("gate_out", ["expert_gate_out"]),
    ("norm", ["norm_output", "norm_unit_w"]), ("moe_scratch", ["moe_fp8_scratch"]),
    # nothing close: no suggestion rather than an unrelated one
    ("nope", []), ("offload", []), ("pool", []), ("kv", []), ("x", []), ("", []),
    ("scratch_pad", []), ("out", []),
])
def test_unknown_name_suggests_only_close_names(typed, near):
    with pytest.raises(ValueError) as e:
        REFERENCE.index(typed)
    text = str(e.value)
    assert text.startswith(f"unknown buffer name {typed!r}")
    if near:
        assert text.endswith(f"; did you mean {', '.join(near)}?"), text
    else:
        assert "did you mean" not in text, text


def test_unknown_name_near_a_short_set():
    # difflib (cutoff 0.6) offered 'ignore' and 'notes' for 'nope'
    s = BufferSet([BufferSpec(n, "uint8", ["max_batch_tokens"])
                   for n in ("ignore", "copied", "notes", "rope_cache", "note")])
    assert str(_raises(s.index, "nope")).endswith("; did you mean note?")
    assert "did you mean" not in str(_raises(s.index, "cache"))
    assert str(_raises(s.index, "rope")).endswith("; did you mean rope_cache?")
    assert str(_raises(s.without, ["copies"])).endswith("; did you mean copied?")


def _raises(f, *args):
    with pytest.raises(ValueError) as e:
        f(*args)
    return e.value


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


def test_metrale_exports_the_set_types():
    assert metrale.BufferSet is BufferSet and metrale.BufferSpec is BufferSpec
    assert metrale.REFERENCE is REFERENCE
    assert repr(REFERENCE) == f"<BufferSet REFERENCE: {COUNT} buffers>"
