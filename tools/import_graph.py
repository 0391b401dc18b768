"""The import graph of metrale's own modules, read from the source.

Every import of one metrale module by another counts: ``import``, ``from ...
import`` and Cython's ``cimport``, at module level or inside a function (a
deferred import still closes a circle: the two modules then need each other)
and a module imported by name (``importlib.import_module``).  A package that
an import of one of its modules runs first is not counted (its __init__ may
import its own modules: downwards).  A module is a file of src/metrale
(``.py``, ``.pyx``, ``.pxd``, the ``.pyx.in`` templates): ``foo.pyx`` and
``foo.pxd`` are the one module ``metrale._pkg.foo``.

    python tools/import_graph.py             # circles and upward imports, if any (exit 1)
    python tools/import_graph.py --dot FILE  # the graph in Graphviz form
    python tools/import_graph.py --svg FILE  # the layers drawn (docs/architecture.svg)

`LAYERS` names the layers, bottom first, each one package of src/metrale; the
modules of the top folder are the front door above them all.  An import may
reach its own layer or one below, never one above.  tests/test_architecture.py
checks that there is no circle, that every module has a layer and that no
import runs up, and that docs/architecture.svg is this drawing.
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
# A module imported by name at run time (importlib): an import all the same.
_BY_NAME = re.compile(r"""import_module\(\s*["'](metrale\.[\w.]+)["']""")


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
            # `from metrale import _reserve` imports the module metrale._arena._reserve
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if called == "import_module":
                out.add(node.args[0].value)
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
    out.update(_BY_NAME.findall(text))
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
    return edges


# The layers, bottom first: (name, its package, what it holds).  The last is
# the front door, the modules of the top folder: the package's __init__ (its
# names, loaded lazily), __main__ and the public module paths (metrale.sizes is
# the module metrale._sizing.sizes); it may import every layer, none imports it.
LAYERS = (
    ("base", "metrale._base", "errors, records, exact integers, argument checks, the C core's "
                              "declarations, lifetime words"),
    ("sizing", "metrale._sizing", "configs, the formula language, buffer sets, the reference "
                                  "table, sizes, the slab plan"),
    ("backends", "metrale._backends", "memory and devices: the host and CUDA backends, kernels, "
                                      "mappings, pinned staging, host scratch"),
    ("sharing", "metrale._sharing", "the peers' slabs and the descriptor exchange of tensor "
                                    "parallelism"),
    ("arena", "metrale._arena", "the arena: its state, each concept's state and methods, its "
                                "construction, tensor parallelism"),
    ("integrations", "metrale._integrations", "what is built on arenas: fit, the picture, "
                                              "process checkpoints"),
    ("cli", "metrale._cli", "the command line"),
    ("front door", "metrale", "metrale's names, its public module paths (each the module of "
                              "its layer), __main__"),
)


def layer_of(modules):
    """Module -> the index of its layer (0: the bottom), for those `modules`
    that have one: a layer's package and everything in it, or a module of
    the top folder (the front door)."""
    out = {}
    for m in modules:
        for i, (_, pkg, _) in enumerate(LAYERS[:-1]):
            if m == pkg or m.startswith(pkg + "."):
                out[m] = i
                break
        else:
            if m == "metrale" or (m.startswith("metrale.") and m.count(".") == 1):
                out[m] = len(LAYERS) - 1
    return out


def members(edges):
    """The modules of each layer, bottom first, each list sorted."""
    where = layer_of(edges)
    return [sorted(m for m in edges if where.get(m) == i) for i in range(len(LAYERS))]


def upward(edges):
    """(module, imported) pairs where the import reaches a higher layer, and
    the modules no layer places."""
    where = layer_of(edges)
    unplaced = sorted(m for m in edges if m not in where)
    up = sorted((m, d) for m, ds in edges.items() for d in ds
                if m in where and d in where and where[d] > where[m])
    return up, unplaced


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


def svg(edges):
    """The layers as stacked bands, top (the front door) to bottom (base): each
    module a box in its band (named within its package), and beside each band
    the imports it makes into each layer below it."""
    from xml.sax.saxutils import escape
    where = layer_of(edges)
    layers = members(edges)
    width, left, box_w, box_h, gap, pad = 1100, 150, 158, 22, 6, 10
    per_row = (width - left - 20) // (box_w + gap)
    below = []                  # per layer: [(layer below, imports into it)]
    for i, mods in enumerate(layers):
        n = {}
        for m in mods:
            for d in edges.get(m, ()):
                if d in where and where[d] < i:
                    n[where[d]] = n.get(where[d], 0) + 1
        below.append(sorted(n.items(), reverse=True))
    bands, y = [], 56
    for i in reversed(range(len(LAYERS))):
        mods = layers[i]
        rows = -(-len(mods) // per_row)
        h = max(2 * pad + 18 + rows * (box_h + gap), 44 + 12 * len(below[i]))
        bands.append((i, y, h))
        y += h + 26
    height = y + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" '
           f'font-size="11" role="img" aria-labelledby="t">',
           '<title id="t">metrale\'s modules by layer; imports run down</title>',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
           '<text x="20" y="30" font-size="16" fill="#202124">metrale: its modules by layer. '
           'Imports run down (or within a layer), never up; tools/import_graph.py checks it.</text>']
    fills = ("#e8f0fe", "#e6f4ea", "#fef7e0", "#fce8e6", "#f3e8fd", "#e0f7fa", "#f1f3f4")
    for i, y0, h in bands:
        name, pkg, what = LAYERS[i]
        mods = layers[i]
        out.append(f'<rect x="10" y="{y0}" width="{width - 20}" height="{h}" rx="6" '
                   f'fill="{fills[i % len(fills)]}" stroke="#9aa0a6"/>')
        out.append(f'<text x="20" y="{y0 + 20}" font-size="14" font-weight="bold" '
                   f'fill="#202124">{escape(name)}</text>')
        out.append(f'<text x="20" y="{y0 + h - 8}" font-size="10" '
                   f'fill="#5f6368">{escape(pkg)}</text>')
        out.append(f'<text x="{left}" y="{y0 + 18}" fill="#5f6368">{escape(what)}</text>')
        for k, m in enumerate(mods):
            r, c = divmod(k, per_row)
            x, yy = left + c * (box_w + gap), y0 + pad + 18 + r * (box_h + gap)
            out.append(f'<rect x="{x}" y="{yy}" width="{box_w}" height="{box_h}" rx="3" '
                       f'fill="#ffffff" stroke="#5f6368"/>')
            out.append(f'<text x="{x + 6}" y="{yy + 15}" fill="#202124">'
                       f'{escape(m[len(pkg) + 1:] or m if m != pkg else m)}</text>')
        for k, (j, n) in enumerate(below[i]):
            out.append(f'<text x="20" y="{y0 + 38 + 12 * k}" fill="#5f6368" font-size="10">'
                       f'{n} import{"s" if n > 1 else ""} of {escape(LAYERS[j][0])}</text>')
        if i:
            out.append(f'<path d="M 80 {y0 + h + 4} L 80 {y0 + h + 22}" stroke="#202124" '
                       f'stroke-width="2" marker-end="url(#a)"/>')
    out.insert(3, '<defs><marker id="a" markerWidth="8" markerHeight="8" refX="4" refY="4" '
                  'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#202124"/></marker></defs>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dot", metavar="FILE", help="write the graph in Graphviz form")
    p.add_argument("--svg", metavar="FILE", help="write the layers drawn as SVG")
    args = p.parse_args(argv)
    edges = graph()
    if args.dot:
        with open(args.dot, "w") as f:
            f.write(dot(edges))
    if args.svg:
        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(svg(edges))
    found = circles(edges)
    for comp in found:
        print("circle: " + " <-> ".join(comp))
    up, unplaced = upward(edges)
    for m, d in up:
        print(f"upward: {m} imports {d}")
    for m in unplaced:
        print(f"no layer: {m}")
    return 1 if found or up or unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
