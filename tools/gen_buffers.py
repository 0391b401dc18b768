"""Generate what the reference buffer set (src/metrale/_sizing/_reference_table.py)
decides at build time: the arena's compiled accessors and the per-buffer
entries of the stubs.

    python tools/gen_buffers.py REFERENCE_PY ARENA_PYX_IN OUT_PYX [--stub IN OUT ...]

OUT_PYX: the arena module, the template _arena/_buffer_arena.pyx.in with, in the
BufferArena class, one pointer and one byte accessor per reference buffer as
its spec's ``accessors`` say (each reads the arena's tuple by reference id).
Each ``--stub IN OUT`` writes the stub template IN with the
entries of its @GENERATED line (``accessors``: the arena's; ``peer
accessors``: PeerBuffers'; ``size properties``: BufferSizes').  The meson
build runs this; the tests check the generated stubs against the classes.

REFERENCE_PY (src/metrale/_sizing/reference.py) is imported from a stand-in
package made of the source tree's metrale folder, so only the pure-Python
modules it imports (relatively: the sizing layer's buffers, formulas and specs,
the base's _dtypes, _record, _math) load: nothing compiled is needed.  The
stand-in is not named metrale: an editable install's import hook would build
the package (run ninja inside this build step) on an import of metrale.
"""

import importlib
import os
import sys
import types


def load_reference(path):
    """The REFERENCE BufferSet of metrale/_sizing/reference.py at `path`."""
    sys.dont_write_bytecode = True      # nothing written into the source tree
    sizing = os.path.dirname(os.path.abspath(path))
    name = "_metrale_gen"
    pkg = types.ModuleType(name)
    pkg.__path__ = [os.path.dirname(sizing)]
    sys.modules[name] = pkg
    return importlib.import_module(f"{name}.{os.path.basename(sizing)}.reference").REFERENCE


def accessors(reference):
    """The accessor methods, indented for a class body."""
    out = []
    for i, spec in enumerate(reference):
        name = spec.name
        # Unchecked tuple loads (a borrowed item, compared with the ABSENT
        # marker, then returned with one new reference), the one place:
        # measured (bench/bench_host.py), and in range by construction:
        # _ref_ptrs and _ref_bytes are always tuples of one entry per reference
        # buffer (the class sets them only so), and every id is below that count.
        for kind, attr, what, ret in (
                ("pointer", "_ref_ptrs", f"Device pointer of the {name} buffer "
                 f"(docs/buffers.md#{name}).", "The address; 0 when the buffer is empty or "
                 "the arena is released."),
                ("bytes", "_ref_bytes", f"Size of the {name} buffer in bytes: the bound its "
                 "GEMMs check.", "As sized; unchanged by release.")):
            if kind not in spec.accessors:
                continue
            method = name if kind == "pointer" else f"{name}_bytes"
            out += [f"    def {method}(self):",
                    f'        """{what}',
                    "",
                    "        Returns",
                    "        -------",
                    "        int",
                    f"            {ret}",
                    "",
                    "        Raises",
                    "        ------",
                    "        MetraleError",
                    f"            The arena's buffer set has no {name}.",
                    '        """',
                    f"        cdef PyObject *r = _ITEM(<PyObject *>self.{attr}, {i})",
                    "        if r == _ABSENT:",
                    f"            _absent(self, {name!r})",
                    "        return <object>r", ""]
    return "\n".join(out)


def stub_parts(reference):
    """The stub entries of each @GENERATED key, indented for a class body."""
    pointer = [s.name for s in reference if "pointer" in s.accessors]
    nbytes = [s.name for s in reference if "bytes" in s.accessors]
    return {
        "accessors": "\n".join([f"    def {n}(self) -> int: ..." for n in pointer]
                               + [f"    def {n}_bytes(self) -> int: ..." for n in nbytes]),
        "peer accessors": "\n".join(f"    def {n}(self) -> int: ..." for n in pointer),
        "size properties": "\n".join(f"    @property\n    def {s.name}(self) -> int: ..."
                                     for s in reference),
    }


def fill_template(template, parts, what):
    """The template with each of its @GENERATED lines (and the comment lines
    after it) followed by the generated code of that key."""
    out, done = [], set()
    lines = template.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        key = next((k for k in parts if line.strip().startswith(f"# @GENERATED {k}:")), None)
        if key:
            while i + 1 < len(lines) and lines[i + 1].strip().startswith("#"):
                i += 1
                out.append(lines[i])
            out.append(parts[key])
            done.add(key)
        i += 1
    if not done:
        raise SystemExit(f"gen_buffers: {what} has no @GENERATED line")
    return "\n".join(out)


def main(argv):
    reference_py, template, out_pyx = argv[1:4]
    rest = argv[4:]
    stubs = []
    while rest:
        if rest[0] != "--stub":
            raise SystemExit(f"gen_buffers: unexpected argument {rest[0]!r}")
        stubs.append((rest[1], rest[2]))
        rest = rest[3:]
    reference = load_reference(reference_py)
    with open(template, encoding="utf-8") as f:
        text = fill_template(f.read(), {"accessors": accessors(reference)}, template)
    with open(out_pyx, "w", encoding="utf-8") as f:
        f.write(text)
    parts = stub_parts(reference)
    for src, dst in stubs:
        with open(src, encoding="utf-8") as f:
            text = fill_template(f.read(), parts, src)
        with open(dst, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main(sys.argv)
