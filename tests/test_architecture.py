"""The shape of the source, as docs/architecture.md draws it: which way
metrale's own imports run (tools/import_graph.py reads them from the source:
no module imports one that imports it back, inside functions included, and
none imports a layer above its own), and how large a file and the arena's
class may grow."""

import importlib.util
import pathlib
import re

import pytest

_TOOL = pathlib.Path(__file__).resolve().parents[1] / "tools" / "import_graph.py"
pytestmark = pytest.mark.skipif(not _TOOL.exists(), reason="the source tree's tools are not here")


def _tool():
    spec = importlib.util.spec_from_file_location("import_graph", _TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_circle():
    g = _tool()
    assert g.circles(g.graph()) == []


def test_every_module_has_a_layer_and_no_import_runs_up():
    g = _tool()
    edges = g.graph()
    up, unplaced = g.upward(edges)
    assert unplaced == [], "modules outside the layers' packages (tools/import_graph.py LAYERS)"
    assert up == []
    placed = [m for mods in g.members(edges) for m in mods]
    assert len(placed) == len(set(placed)) and set(placed) == set(edges)


def test_the_layers_are_the_packages_and_the_top_folder_is_the_front_door():
    g = _tool()
    edges = g.graph()
    layers = dict(zip((name for name, _, _ in g.LAYERS), g.members(edges)))
    # every module of the top folder but the package itself is a public path or
    # __main__; each public path is the one module of its layer (the same object)
    front = {m for m in layers.pop("front door") if m != "metrale"}
    assert "metrale.__main__" in front
    import metrale
    for m in front - {"metrale.__main__"}:
        try:
            mod = __import__(m, fromlist=["_"])
        except ImportError as e:
            # an optional extra's module (metrale.torch) without its extra
            # installed: it must say which extra to install, and nothing else
            assert "pip install 'metrale[" in str(e), (m, e)
            continue
        assert mod.__name__ != m and mod.__name__.startswith("metrale._"), m
        assert getattr(metrale, m.split(".")[1]) is mod
    assert all(mods for mods in layers.values())


def test_the_architecture_picture_is_the_graph():
    g = _tool()
    picture = _TOOL.parents[1] / "docs" / "architecture.svg"
    assert picture.read_text(encoding="utf-8") == g.svg(g.graph()), \
        "docs/architecture.svg is stale: python tools/import_graph.py --svg docs/architecture.svg"


def test_the_tool_sees_every_kind_of_import(tmp_path):
    g = _tool()
    pkg = tmp_path / "metrale"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    from ..a import x\n")
    (pkg / "a.py").write_text("import importlib\nm = importlib.import_module('metrale.b')\n")
    (pkg / "b.pyx").write_text("from metrale.d cimport (x,\n    y)\ndef g():\n    import metrale.e\n")
    (pkg / "d.pxd").write_text("cdef int x\n")
    (pkg / "e.py").write_text("import metrale.sub.c as c  # a comment: import metrale.a\n")
    edges = g.graph(str(pkg))
    assert edges["metrale.sub.c"] == {"metrale.a"}             # inside a function, relative
    assert edges["metrale.a"] == {"metrale.b"}                 # by name
    assert edges["metrale.b"] == {"metrale.d", "metrale.e"}    # cimport over lines; in a function
    assert edges["metrale.e"] == {"metrale.sub.c"}
    assert edges["metrale.sub"] == {"metrale.sub.c"}
    assert g.circles(edges) == [["metrale.a", "metrale.b", "metrale.e", "metrale.sub.c"]]


_SRC = _TOOL.parents[1] / "src"
# Every hand-written source file holds one concept, in at most 550 lines (the
# reference table too: one record per buffer).  The PTX is generated, and not
# a source suffix here.
_EXEMPT = set()
_SOURCE = (".py", ".pyx", ".pxd", ".pyx.in", ".pyi", ".pyi.in", ".c", ".h", ".cu")


def _lines(path):
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_source_file_over_550_lines():
    long = {str(p.relative_to(_SRC)): _lines(p) for p in _SRC.rglob("*")
            if p.is_file() and p.name.endswith(_SOURCE) and p.name not in _EXEMPT
            and _lines(p) > 550}
    assert long == {}


def test_the_arena_class_body_is_at_most_350_lines():
    text = (_SRC / "metrale" / "_arena" / "_buffer_arena.pyx.in").read_text(
        encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("cdef class BufferArena("))
    end = next(i for i, line in enumerate(text) if "# @GENERATED accessors" in line)
    assert end - start - 1 <= 350            # the generated accessors come after
    assert all(line.startswith((" ", "#")) or not line for line in text[start + 1:end])


def test_the_arena_imports_its_concepts_by_name_nowhere():
    for name in ("_buffer_arena.pyx.in", "_arena_state.pyx", "_construct.pyx"):
        text = (_SRC / "metrale" / "_arena" / name).read_text(encoding="utf-8")
        assert "importlib" not in text and "import_module" not in text, name


# -- the statements of docs/architecture.md a test can check --------------------------------

_ARENA = _SRC / "metrale" / "_arena"
_DOC = _TOOL.parents[1] / "docs" / "architecture.md"


def _pxd_classes():
    """Every cdef class a .pxd of the package declares: name -> its .pxd."""
    out = {}
    for p in (_SRC / "metrale").rglob("*.pxd"):
        for m in re.finditer(r"^cdef class (\w+)", p.read_text(encoding="utf-8"), re.M):
            out[m.group(1)] = p.name
    return out


def test_the_release_order_is_the_one_the_page_gives():
    """free_memory closes the concepts in the order the page says."""
    code = (_ARENA / "_arena_state.pyx").read_text(encoding="utf-8")
    body = code[code.index("cdef int free_memory(self)"):code.index("cdef void finalize(self)")]
    closed = re.findall(r"self\._(\w+)\.close\(\)", body)
    assert closed == ["peers", "pool", "sleep_state", "reservation"], closed
    page = _DOC.read_text(encoding="utf-8")
    said = page[page.index("`release()` closes the concepts in one"):]
    said = said[:said.index("the finalizer")]
    at = [said.index(word) for word in ("the peers first", "then the pool", "then the sleep",
                                        "then the reservation")]
    assert at == sorted(at), said


def test_every_concept_of_the_table_is_a_class_of_its_pxd():
    """Each class the page's table names in a .pxd is declared there, and
    every stateful cdef class of the arena layer has a .pxd (but the ones
    named here, each with its reason)."""
    declared = _pxd_classes()
    page = _DOC.read_text(encoding="utf-8")
    table = page[page.index("| concept | state | class (`.pxd`) | freed by |"):]
    table = table[:table.index("\n\n")]
    named = re.findall(r"`(\w+)` \(`([\w/]+\.pxd)`\)", table)
    assert len(named) >= 7, named
    for cls, pxd in named:
        assert declared.get(cls) == pxd.split("/")[-1], (cls, pxd)
    private = {
        "_Plan": "a parameter block private to _allreduce.pyx",
        "ArenaBuffers": "a read-only mapping over the arena, owning nothing",
        "BufferArena": "the final class: nothing else cimports it",
        "Guarded": "a callable behind a Guard, made by Guard.wrap: nothing else cimports it",
        "MemoryExport": "an open export_memory, made by it: nothing else cimports it",
        "Part": "one class's chunks of a Reservation: an Owner it makes for a sleep or a wake",
    }
    for p in _ARENA.glob("*.pyx*"):
        for m in re.finditer(r"^cdef class (\w+)", p.read_text(encoding="utf-8"), re.M):
            assert m.group(1) in declared or m.group(1) in private, (p.name, m.group(1))


def test_every_concept_field_of_the_arena_is_typed():
    """The concepts' fields of ArenaState are typed: each a class some .pxd
    declares (no `object` field holds a concept)."""
    pxd = (_ARENA / "_arena_state.pxd").read_text(encoding="utf-8")
    section = pxd[pxd.index("# -- the concepts' state"):pxd.index("cdef object __weakref__")]
    fields = re.findall(r"^    cdef (\w+) (_\w+)", section, re.M)
    concepts = {name: kind for kind, name in fields if kind not in ("uintptr_t",)}
    assert set(concepts) == {"_reservation", "_sleep_state", "_peers", "_pool"}, concepts
    declared = _pxd_classes()
    for name, kind in concepts.items():
        assert kind in declared, (name, kind)
