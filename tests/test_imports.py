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


def test_the_sizing_layer_imports_nothing_above_it():
    g = _tool()
    edges = g.graph()
    sizing = {"metrale." + m for m in (
        "_math", "_record", "_dtypes", "levers", "target", "formulas", "formulas._table",
        "formulas._language", "formulas._growth", "_reference_table", "_spec", "buffers",
        "reference", "config", "_fields", "_hf", "_presets", "sizes", "moe", "catalogue")}
    below = sizing | {"metrale._common", "metrale.errors", "metrale"}
    for mod in sorted(sizing):
        assert mod in edges, mod
        assert edges[mod] <= below, (mod, sorted(edges[mod] - below))


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
