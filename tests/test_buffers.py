"""The reference buffer set is written once (metrale/_sizing/_reference_table.py): its specs
pass the public constructor's checks, its names, groups and counts are those
of shared/spec/ARENA.md (the oracle, tests/reference_oracle.py), and the C
core's table, BufferSizes, the arena's compiled accessors, PeerBuffers and the
generated stubs all follow it.

The tests here that compare the table with the oracle are the ones a new
reference buffer fails until the oracle lists it (docs/buffer-sets.md)."""

import ast
import pathlib

import metrale
from metrale import BufferArena, BufferSizes
from metrale._sizing._layout import FLAG_BITS, buffer_table
from metrale.buffers import BufferSpec
from metrale.reference import REFERENCE

import reference_oracle as oracle

STUBS = pathlib.Path(metrale.__file__).parent
BUFFER_NAMES, GROUPS = REFERENCE.names, REFERENCE.groups


def _stub_class(module, name):
    tree = ast.parse((STUBS / module).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def test_reference_specs_pass_the_constructor():
    # _reference_table.py holds its records unchecked (a cheap import): each must be
    # exactly what the checking constructor makes of its arguments.
    for spec in REFERENCE:
        again = BufferSpec(spec.name, **{k: v for k, v in spec._arguments().items()
                                         if k != "name"})
        assert again == spec, spec.name


def test_the_oracle_is_consistent():
    # the hand-written tables agree with each other before anything is checked
    # against them
    names = oracle.NAMES
    assert len(names) == oracle.COUNT == len(set(names))
    assert (names[0], names[-1]) == (oracle.FIRST, oracle.LAST)
    for group, members in oracle.GROUPS.items():
        assert len(set(members)) == len(members) and set(members) <= set(names), group
        assert list(members) == sorted(members, key=names.index), group
    assert set(oracle.PREFILL) <= set(oracle.ROWS) <= set(oracle.ZERO_ALL)
    assert {g: len(m) for g, m in oracle.GROUPS.items()} == oracle.GROUP_COUNTS
    assert oracle.COUNT - len(oracle.NOT_IN_TOTAL) == oracle.GROUP_COUNTS["total"]


def test_groups_are_the_spec_counts_and_members():
    # The one test of the table against the oracle: its names in canonical
    # order, then ARENA.md §2.1: 18 Z, 15 W, 7 P, 16 C, 44 T; 44 pointer and
    # 24 byte accessors (§8.5)
    assert BUFFER_NAMES == oracle.NAMES and len(REFERENCE) == oracle.COUNT
    assert {g: len(m) for g, m in GROUPS.items()} == oracle.GROUP_COUNTS
    # each group in canonical order; step is what StepInputs uploads into
    assert GROUPS == oracle.GROUPS
    assert set(BUFFER_NAMES) - set(GROUPS["total"]) == set(oracle.NOT_IN_TOTAL)
    assert set(BUFFER_NAMES) - set(GROUPS["pointer"]) == set(oracle.NO_POINTER)
    assert {n: REFERENCE[n].rows for n in oracle.ROWS} == oracle.ROW_RULES
    assert all(s.align == 256 for s in REFERENCE)


def test_c_table_follows_the_specs():
    table = buffer_table()
    assert tuple(n for n, _, _ in table) == BUFFER_NAMES
    bit = FLAG_BITS
    for name, flags, align in table:
        s = REFERENCE[name]
        assert bool(flags & bit["zero_all"]) == s.zero_all
        assert bool(flags & bit["prefill"]) == s.prefill
        assert bool(flags & bit["checksum"]) == s.checksum
        assert bool(flags & bit["rows"]) == (s.rows != "whole")
        assert bool(flags & bit["rows_by_m"]) == (s.rows in ("M", "M|Mp"))
        assert bool(flags & bit["rows_by_m16"]) == (s.rows in ("Mp", "M|Mp"))
        assert bool(flags & bit["step_ids"]) == (name == "token_ids")
        assert bool(flags & bit["step_meta"]) == (name == "scratch")
        assert align == 256


def test_buffer_sizes_and_accessors_follow_the_table():
    zero = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0))
    assert tuple(zero.as_dict()) == BUFFER_NAMES
    for name in BUFFER_NAMES:
        assert isinstance(getattr(BufferSizes, name), property)
    expected = set(GROUPS["pointer"]) | {f"{n}_bytes" for n in GROUPS["bytes"]}
    for method in expected:
        assert callable(getattr(BufferArena, method)), method
    # and no accessor the specs do not ask for
    assert not any(callable(getattr(BufferArena, n, None)) for n in
                   set(BUFFER_NAMES) - set(GROUPS["pointer"]) - {"moe_fp8_scratch"})
    assert not any(hasattr(BufferArena, f"{n}_bytes") for n in
                   set(BUFFER_NAMES) - set(GROUPS["bytes"]))


def test_stubs_follow_the_table():
    arena = _stub_class("_arena/_buffer_arena.pyi", "BufferArena")
    stubbed = {f.name for f in arena.body if isinstance(f, ast.FunctionDef)}
    accessors = set(GROUPS["pointer"]) | {f"{n}_bytes" for n in GROUPS["bytes"]}
    assert accessors <= stubbed
    # no other stub method looks like an accessor (moe_fp8_scratch(config, rows)
    # is the hand-written method for that buffer, ARENA.md §4.9)
    assert {n for n in stubbed - accessors
            if n in BUFFER_NAMES or n.removesuffix("_bytes") in BUFFER_NAMES} == {"moe_fp8_scratch"}
    sizes = _stub_class("_sizing/sizes.pyi", "BufferSizes")
    fields = tuple(f.name for f in sizes.body if isinstance(f, ast.FunctionDef)
                   and any(getattr(d, "id", None) == "property" for d in f.decorator_list))
    # one property per buffer, in canonical order, then `buffers`, `limits`, `config`, `target`
    assert fields == BUFFER_NAMES + ("buffers", "limits", "config", "target")
    peer = _stub_class("_arena/tp.pyi", "PeerBuffers")
    assert {f.name for f in peer.body if isinstance(f, ast.FunctionDef)} == \
        set(GROUPS["pointer"]) | {"__init__", "ptr"}
