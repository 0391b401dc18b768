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

    python tools/import_graph.py             # circles and upward imports, if any (exit 1)
    python tools/import_graph.py --dot FILE  # the graph in Graphviz form
    python tools/import_graph.py --svg FILE  # the layers drawn (docs/architecture.svg)

`LAYERS` places every module in one layer, bottom first; an import may reach
its own layer or one below, never one above.  tests/test_architecture.py checks
that there is no circle, that every module has a layer and that no import
runs up, and that docs/architecture.svg is this drawing.
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


# The layers, bottom first (the packages src/metrale is to be cut into), and
# what each holds.
LAYERS = (
    ("base", "errors, records, exact integers, argument checks, the C core's declarations, "
             "lifetime words", (
        "metrale", "metrale.errors", "metrale._record", "metrale._math", "metrale._dtypes",
        "metrale._common", "metrale._core", "metrale._debug_core", "metrale._peer_core",
        "metrale._dlpack", "metrale._held", "metrale._life", "metrale._fields",
        "metrale._driver")),
    ("sizing", "configs, the formula language, buffer sets, the reference table, sizes, the "
               "slab plan", (
        "metrale.levers", "metrale.target", "metrale.formulas", "metrale.formulas._table",
        "metrale.formulas._language", "metrale.formulas._growth", "metrale.formulas._explain",
        "metrale._reference_table",
        "metrale._spec", "metrale.buffers", "metrale.reference", "metrale._hf",
        "metrale._presets", "metrale.config", "metrale.decode_meta", "metrale.sizes", "metrale.moe",
        "metrale.catalogue", "metrale.debug", "metrale._layout")),
    ("backends", "memory and devices: the host and CUDA backends, kernels, mappings, "
                 "pinned staging, host scratch", (
        "metrale._backend", "metrale._host_backend", "metrale._vmm", "metrale._kernels",
        "metrale._cuda", "metrale._faulty_cuda", "metrale.testing", "metrale.cuda",
        "metrale._mapping", "metrale._staging", "metrale._scratch", "metrale._transfer")),
    ("sharing", "the peers' slabs and the descriptor exchange of tensor parallelism", (
        "metrale._peer_slabs", "metrale._tp_exchange")),
    ("arena", "the arena: its state, each concept's state and methods, its construction", (
        "metrale._reservation", "metrale._sleep_state", "metrale._arena_state", "metrale.tp",
        "metrale._reserve", "metrale._sleep", "metrale._peer", "metrale._allreduce",
        "metrale._debug", "metrale._step", "metrale._view", "metrale._summary",
        "metrale._construct", "metrale._arena")),
    ("integrations", "what is built on arenas: fit, the picture, process checkpoints", (
        "metrale.fitting", "metrale.picture", "metrale.checkpoint",
        "metrale._checkpoint_driver")),
    ("cli", "the command line", (
        "metrale.cli", "metrale._cli_common", "metrale._cli_fit", "metrale.__main__")),
)


def layer_of():
    """Module -> the index of its layer (0: the bottom)."""
    return {m: i for i, (_, _, mods) in enumerate(LAYERS) for m in mods}


def upward(edges):
    """(module, imported) pairs where the import reaches a higher layer, and
    the modules no layer places."""
    where = layer_of()
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
    """The layers as stacked bands, top (cli) to bottom (base): each module a
    box in its band, and beside each band the imports it makes into each
    layer below it."""
    from xml.sax.saxutils import escape
    where = layer_of()
    width, left, box_w, box_h, gap, pad = 1100, 150, 158, 22, 6, 10
    per_row = (width - left - 20) // (box_w + gap)
    below = []                  # per layer: [(layer below, imports into it)]
    for i, (_, _, mods) in enumerate(LAYERS):
        n = {}
        for m in mods:
            for d in edges.get(m, ()):
                if d in where and where[d] < i:
                    n[where[d]] = n.get(where[d], 0) + 1
        below.append(sorted(n.items(), reverse=True))
    bands, y = [], 56
    for i in reversed(range(len(LAYERS))):
        name, what, mods = LAYERS[i]
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
        name, what, mods = LAYERS[i]
        out.append(f'<rect x="10" y="{y0}" width="{width - 20}" height="{h}" rx="6" '
                   f'fill="{fills[i % len(fills)]}" stroke="#9aa0a6"/>')
        out.append(f'<text x="20" y="{y0 + 20}" font-size="14" font-weight="bold" '
                   f'fill="#202124">{escape(name)}</text>')
        out.append(f'<text x="{left}" y="{y0 + 18}" fill="#5f6368">{escape(what)}</text>')
        for k, m in enumerate(mods):
            r, c = divmod(k, per_row)
            x, yy = left + c * (box_w + gap), y0 + pad + 18 + r * (box_h + gap)
            out.append(f'<rect x="{x}" y="{yy}" width="{box_w}" height="{box_h}" rx="3" '
                       f'fill="#ffffff" stroke="#5f6368"/>')
            out.append(f'<text x="{x + 6}" y="{yy + 15}" fill="#202124">'
                       f'{escape(m.replace("metrale.", "") if m != "metrale" else "metrale")}</text>')
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
