"""Which way metrale's own imports run (tools/import_graph.py reads them from
the source): no module imports one that imports it back, inside functions
included."""

import importlib.util
import pathlib

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
    assert unplaced == [], "modules with no layer in tools/import_graph.py LAYERS"
    assert up == []
    placed = [m for _, _, mods in g.LAYERS for m in mods]
    assert len(placed) == len(set(placed)) and set(placed) == set(edges)


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
    (pkg / "b.pyx").write_text("from metrale.d cimport (x,\n    y)\ndef g():\n    _m('e')\n")
    (pkg / "d.pxd").write_text("cdef int x\n")
    (pkg / "e.py").write_text("import metrale.sub.c as c  # a comment: import metrale.a\n")
    edges = g.graph(str(pkg))
    assert edges["metrale.sub.c"] == {"metrale.a"}             # inside a function, relative
    assert edges["metrale.a"] == {"metrale.b"}                 # by name
    assert edges["metrale.b"] == {"metrale.d", "metrale.e"}    # cimport over lines; the forwarder
    assert edges["metrale.e"] == {"metrale.sub.c"}
    assert edges["metrale.sub"] == {"metrale.sub.c"}
    assert g.circles(edges) == [["metrale.a", "metrale.b", "metrale.e", "metrale.sub.c"]]
