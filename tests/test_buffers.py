"""The buffer table is written once (src/buffers.h): the compiled C table, the
Python module generated from it, BufferSizes, the arena's accessors and the
checked-in stubs must all agree with it."""

import ast
import pathlib

import metrale
from metrale import BufferArena, BufferSizes
from metrale._layout import buffer_table
from metrale._buffers import BUFFER_FLAGS, BUFFER_NAMES, FLAG_BITS, GROUPS

from helpers import CHECKSUM, PREFILL, ROWS, ZERO_ALL

STUBS = pathlib.Path(metrale.__file__).parent


def _stub_class(module, name):
    tree = ast.parse((STUBS / module).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def test_compiled_table_is_the_generated_one():
    assert buffer_table() == tuple(zip(BUFFER_NAMES, BUFFER_FLAGS))
    assert len(BUFFER_NAMES) == 46


def test_groups_are_the_spec_counts_and_members():
    # ARENA.md §2.1: 18 Z, 15 W, 7 P, 16 C, 44 T; 44 pointer and 24 byte accessors (§8.5)
    assert {g: len(m) for g, m in GROUPS.items()} == {
        "zero_all": 18, "rows": 15, "prefill": 7, "checksum": 16, "total": 44,
        "pointer": 44, "bytes": 24, "step": 2}
    assert set(GROUPS["zero_all"]) == set(ZERO_ALL) and set(GROUPS["prefill"]) == set(PREFILL)
    assert GROUPS["rows"] == ROWS and GROUPS["checksum"] == CHECKSUM
    assert GROUPS["step"] == ("scratch", "token_ids")     # what StepInputs uploads into
    assert set(BUFFER_NAMES) - set(GROUPS["total"]) == {"o_latent", "norm_unit_w"}
    assert set(BUFFER_NAMES) - set(GROUPS["pointer"]) == {"moe_fp8_scratch", "ssm_rowwise_w_bf16"}
    for name, flags in zip(BUFFER_NAMES, BUFFER_FLAGS):
        for group, bit in FLAG_BITS.items():
            assert (name in GROUPS[group]) == bool(flags & bit)


def test_buffer_sizes_and_accessors_follow_the_table():
    zero = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0))
    assert tuple(zero.as_dict()) == BUFFER_NAMES
    for name in BUFFER_NAMES:
        assert isinstance(getattr(BufferSizes, name), property)
    expected = set(GROUPS["pointer"]) | {f"{n}_bytes" for n in GROUPS["bytes"]}
    for method in expected:
        assert callable(getattr(BufferArena, method)), method


def test_stubs_follow_the_table():
    arena = _stub_class("_arena.pyi", "BufferArena")
    stubbed = {f.name for f in arena.body if isinstance(f, ast.FunctionDef)}
    accessors = set(GROUPS["pointer"]) | {f"{n}_bytes" for n in GROUPS["bytes"]}
    assert accessors <= stubbed
    # no other stub method looks like an accessor (moe_fp8_scratch(config, rows)
    # is the hand-written method for that buffer, ARENA.md §4.9)
    assert {n for n in stubbed - accessors
            if n in BUFFER_NAMES or n.removesuffix("_bytes") in BUFFER_NAMES} == {"moe_fp8_scratch"}
    sizes = _stub_class("sizes.pyi", "BufferSizes")
    fields = tuple(f.name for f in sizes.body if isinstance(f, ast.FunctionDef)
                   and any(getattr(d, "id", None) == "property" for d in f.decorator_list))
    # one property per buffer, in canonical order, and `limits`, which is no buffer
    assert fields == BUFFER_NAMES + ("limits",)
