"""The import graph of metrale's own modules, read from the source.

Every import of one metrale module by another counts: ``import``, ``from ...
import`` and Cython's ``cimport``, at module level or inside a function (a
deferred import still closes a circle: the two modules then need each other),
a module imported by name (``importlib.import_module``, the arena's forwarder
``_m``) and the arena's generated forwards to the ``_arena_NAME`` functions of
its concept modules.  A package that an import of one of its modules runs
first is not counted (its __init__ may import its own modules: downwards).
A module is a file of src/metrale (``.py``, ``.pyx``, ``.pxd``, the
``.pyx.in`` templates): ``foo.pyx`` and ``foo.pxd`` are the one module
``metrale.foo``.

    python tools/import_graph.py             # the circles, if any (exit 1)
    python tools/import_graph.py --dot FILE  # the graph in Graphviz form

tests/test_imports.py checks that there is no circle.
"""

import argparse
import ast
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src", "metrale")
_SUFFIXES = (".pyx.in", ".pyx", ".pxd", ".py")
# Cython lines that name modules: [from X] cimport/import Y (Cython is not
# Python: read line by line, joined over brackets and backslashes).
_CY = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\s+(.+)|c?import\s+(.+))$")
# A module imported by name at run time (importlib, or the arena's forwarder
# _m("_sleep")): an import all the same.
_FORWARDED = re.compile(r"^def _arena_\w+\(BufferArena a", re.M)
_BY_NAME = re.compile(r"""(?:import_module\(\s*|\b_m\(\s*)["'](?:metrale\.)?([\w.]+)["']""")


def _module(path, root):
    rel = os.path.relpath(path, root)
    for suf in _SUFFIXES:
        if rel.endswith(suf):
            rel = rel[:-len(suf)]
            break
    parts = ["metrale"] + rel.split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(name, level, here, is_package):
    """`name` imported with `level` leading dots from module `here`."""
    if not level:
        return name
    base = here.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[:-(level - 1)]
    return ".".join(base + ([name] if name else []))


def _python_imports(text, here, is_package):
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = _absolute(node.module or "", node.level, here, is_package)
            out.add(mod)
            # `from metrale import _reserve` imports the module metrale._reserve
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if called in ("import_module", "_m"):
                name = node.args[0].value
                out.add(name if name.startswith("metrale.") else "metrale." + name)
    return out


def _cython_imports(text, here, is_package):
    out = set()
    logical, buf, depth = [], "", 0
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        buf += " " + line.rstrip().rstrip("\\")
        depth += line.count("(") - line.count(")")
        if depth <= 0 and not line.rstrip().endswith("\\"):
            logical.append(buf.strip())
            buf, depth = "", 0
    for name in _BY_NAME.findall(text):
        out.add(name if name.startswith("metrale.") else "metrale." + name)
    for line in logical:
        m = _CY.match(line)
        if not m:
            continue
        if m.group(1):
            level = len(m.group(1)) - len(m.group(1).lstrip("."))
            mod = _absolute(m.group(1).lstrip("."), level, here, is_package)
            out.add(mod)
            names = m.group(2).replace("(", " ").replace(")", " ")
            out.update(f"{mod}.{n.split()[0]}" for n in names.split(",") if n.split())
        else:
            out.update(n.split()[0] for n in m.group(3).split(",") if n.split())
    return out


def graph(root=SRC):
    """Module -> the set of metrale modules it imports (itself left out)."""
    files = {}
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith(_SUFFIXES) and not n.endswith(".pyi"):
                files.setdefault(_module(os.path.join(d, n), root), []).append(os.path.join(d, n))
    edges = {}
    for mod, paths in files.items():
        found = set()
        for p in paths:
            with open(p, encoding="utf-8") as f:
                text = f.read()
            pkg = os.path.basename(p).startswith("__init__.")
            if p.endswith(".py"):
                found |= _python_imports(text, mod, pkg)
            else:
                found |= _cython_imports(text, mod, pkg)
        edges[mod] = {m for m in found if m in files and m != mod}
    # The arena's generated forwards (tools/gen_buffers.py) call each concept
    # module's _arena_NAME functions through the forwarder: imports too.
    for mod, paths in files.items():
        for p in paths:
            with open(p, encoding="utf-8") as f:
                if _FORWARDED.search(f.read()) and "metrale._arena" in edges:
                    edges["metrale._arena"].add(mod)
    return edges


def circles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 100))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def dot(edges):
    """The graph in Graphviz's language, each package a cluster."""
    lines = ["digraph metrale {", "  rankdir=BT; node [shape=box, fontsize=10];"]
    for mod in sorted(edges):
        lines.append(f'  "{mod}";')
    for mod in sorted(edges):
        for dep in sorted(edges[mod]):
            lines.append(f'  "{mod}" -> "{dep}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dot", metavar="FILE", help="write the graph in Graphviz form")
    args = p.parse_args(argv)
    edges = graph()
    if args.dot:
        with open(args.dot, "w") as f:
            f.write(dot(edges))
    found = circles(edges)
    for comp in found:
        print("circle: " + " <-> ".join(comp))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
