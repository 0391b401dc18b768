#!/usr/bin/env python3
"""The shipped CUDA kernels (src/metrale/kernels): build their PTX, and check
that it still takes the parameter blocks its C headers declare.

Each kernel source kernels/<name>.cu compiles to kernels/<name>.ptx, which the
package ships and loads at run time: meson rebuilds it with this script where
`nvcc` is found, and otherwise installs the checked-in copy.  A kernel takes
its parameter block by value, a struct of the header next to it, so a field
added to the header changes the block while a stale PTX keeps the old layout.
`check` compares each entry point's parameter sizes, read from the `.param`
declarations of the PTX, with `sizeof` of the parameter types its .cu
declares, computed by compiling a small C program against the headers with
the system C compiler (`$CC`, else `cc`).  The test suite
(tests/test_kernels.py) and the release (tools/release.py) both call it.

    python tools/kernels.py check [DIR ...]   # default: src/metrale/kernels
    python tools/kernels.py update            # rebuild the checked-in PTX (needs nvcc)
    python tools/kernels.py release DIR       # the nvcc release of DIR's PTX (meson)
    python tools/kernels.py build NVCC CU PTX DEPFILE [-I DIR ...]   # meson's command
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "src" / "metrale" / "kernels"
# How every PTX is made: virtual architecture 7.5, the oldest the driver
# JIT-compiles for every GPU metrale supports.
NVCC_ARGS = ("-ptx", "-arch=compute_75")

_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\((.*?)\)", re.S)
# .param [.align A] .<type><bits> [.ptr [.space] [.align A]] NAME[[count]]
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.[bsuf](\d+)\s+"
                    r"(?:\.ptr\s+(?:\.(?:const|global|local|shared)\s+)?(?:\.align\s+\d+\s+)?)?"
                    r"\w+(?:\[(\d+)\])?")
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?'
                     r"(\w+)\s*\(([^)]*)\)")


def ptx_entries(text):
    """{entry name: [bytes of each parameter]} of a PTX module's `.entry` points."""
    out = {}
    for name, params in _ENTRY.findall(text):
        sizes = []
        for decl in filter(None, (p.strip() for p in params.split(","))):
            m = _PARAM.fullmatch(decl)
            if m is None:
                raise ValueError(f"{name}: parameter {decl!r} is not understood")
            bits, count = int(m.group(1)), int(m.group(2) or 1)
            sizes.append(bits // 8 * count)
        out[name] = sizes
    return out


def cu_kernels(text):
    """{kernel name: [C type of each parameter]} of the `extern "C" __global__`
    kernels a .cu defines (a parameter's type: its declaration less its name)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    out = {}
    for name, params in _KERNEL.findall(text):
        types = []
        for decl in filter(None, (p.strip() for p in params.split(","))):
            m = re.fullmatch(r"(.*?[\s*&])\s*\w+", decl, re.S)
            if m is None or "&" in m.group(1):
                raise ValueError(f"{name}: parameter {decl!r} is not a named by-value parameter")
            types.append(" ".join(m.group(1).split()))
        out[name] = types
    return out


def _env():
    """The environment for compilers: without a sanitizer's LD_PRELOAD (the
    ASan stage's), which nvcc and cc do not survive."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def c_sizes(types, headers, include_dirs, cc=None):
    """sizeof of each C type in `types`, the `headers` included, as the system
    C compiler lays them out (x86-64 and the PTX ABI agree on these sizes)."""
    cc = shlex.split(cc or os.environ.get("CC") or "cc")
    with tempfile.TemporaryDirectory(prefix="metrale-kernels-") as d:
        src = Path(d, "sizes.c")
        src.write_text("#include <stdio.h>\n"
                       + "".join(f'#include "{h}"\n' for h in headers)
                       + "int main(void)\n{\n"
                       + "".join(f'    printf("%zu\\n", sizeof({t}));\n' for t in types)
                       + "    return 0;\n}\n")
        exe = Path(d, "sizes")
        r = subprocess.run([*cc, "-std=c11", *(f"-I{i}" for i in include_dirs), str(src),
                            "-o", str(exe)], capture_output=True, text=True, env=_env())
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cc)} could not compile the sizes of {types}:\n{r.stderr}")
        out = subprocess.run([str(exe)], capture_output=True, text=True, check=True,
                             env=_env()).stdout
    return [int(x) for x in out.split()]


def include_dirs(kdir):
    """Where a kernel's headers are found: beside it, and the two folders above
    (arena_core.h sits in src/ in the source tree, in metrale/ when installed)."""
    kdir = Path(kdir)
    return [kdir, kdir.parent, kdir.parent.parent]


def check(kdir, cc=None):
    """The problems of the kernels in folder `kdir` (empty: every .cu has its
    .ptx, with the same entry points, each taking parameters of the sizes the
    headers give today)."""
    kdir = Path(kdir)
    problems = []
    sources = sorted(kdir.glob("*.cu"))
    if not sources:
        return [f"{kdir}: no kernel sources (*.cu)"]
    for cu in sources:
        ptx = cu.with_suffix(".ptx")
        if not ptx.is_file():
            problems.append(f"{ptx.name}: missing (built from {cu.name})")
            continue
        text = cu.read_text()
        want = cu_kernels(text)
        got = ptx_entries(ptx.read_text())
        if not want:
            problems.append(f"{cu.name}: declares no extern \"C\" __global__ kernel")
        if set(want) != set(got):
            problems.append(f"{ptx.name}: entry points {sorted(got)}, but {cu.name} defines "
                            f"{sorted(want)}; rebuild it (python tools/kernels.py update)")
            continue
        headers = re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M)
        names = sorted(want)
        sizes = iter(c_sizes([t for n in names for t in want[n]], headers, include_dirs(kdir), cc))
        for name in names:
            header = [next(sizes) for _ in want[name]]
            if header != got[name]:
                problems.append(
                    f"{ptx.name}: {name} takes parameters of {got[name]} bytes, but "
                    f"{' and '.join(want[name])} of its headers is {header} bytes now: the PTX is "
                    "stale; rebuild it (python tools/kernels.py update)")
    return problems


def check_files(files, read, scratch):
    """`check` of kernels packed in an archive (a wheel, an sdist): `files`
    maps each path as installed under metrale/ ("kernels/zero_ranges.ptx",
    "arena_core.h") to its member name and `read` gives a member's bytes; they
    are written under `scratch`/metrale first.  A check that cannot run is a
    problem too."""
    for rel, member in files.items():
        if rel.endswith("/"):           # a folder entry of the archive
            continue
        dest = Path(scratch, "metrale", rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(read(member))
    try:
        return check(Path(scratch, "metrale", "kernels"))
    except (OSError, RuntimeError, ValueError, subprocess.CalledProcessError) as e:
        return [f"the kernel check could not run: {e}"]


def nvcc_release(kdir):
    """The nvcc release ("13.0") that built the PTX in `kdir` (all of it), from
    the PTX's header.  The build uses only an nvcc of that release: a newer one
    writes a newer PTX ISA, which older drivers cannot load."""
    releases = {re.search(r"release (\d+\.\d+), V", p.read_text()).group(1)
                for p in Path(kdir).glob("*.ptx")}
    if len(releases) != 1:
        raise ValueError(f"{kdir}: the PTX was built by nvcc releases {sorted(releases)}, not one")
    return releases.pop()


def build(nvcc, cu, ptx, depfile=None, includes=()):
    """nvcc `cu` to `ptx` (and make's dependencies to `depfile`)."""
    cmd = [nvcc, *NVCC_ARGS, *(f"-I{i}" for i in includes), str(cu), "-o", str(ptx)]
    if depfile:
        cmd += ["-MD", "-MF", str(depfile)]
    subprocess.run(cmd, check=True, env=_env())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="check each kernel's PTX against its headers")
    c.add_argument("dirs", nargs="*", default=[str(KERNELS)])
    sub.add_parser("update", help="rebuild the checked-in PTX with nvcc")
    r = sub.add_parser("release", help="the nvcc release that built the PTX in DIR (meson)")
    r.add_argument("dir")
    b = sub.add_parser("build", help="build one PTX (meson's custom_target)")
    b.add_argument("nvcc")
    b.add_argument("cu")
    b.add_argument("ptx")
    b.add_argument("depfile")
    b.add_argument("-I", dest="includes", action="append", default=[])
    a = ap.parse_args(argv)
    if a.cmd == "release":
        print(nvcc_release(a.dir))
        return 0
    if a.cmd == "build":
        build(a.nvcc, a.cu, a.ptx, a.depfile, a.includes)
        return 0
    if a.cmd == "update":
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            sys.exit("nvcc not found on PATH")
        for cu in sorted(KERNELS.glob("*.cu")):
            build(nvcc, cu, cu.with_suffix(".ptx"), includes=[ROOT / "src"])
            print(f"wrote {cu.with_suffix('.ptx').relative_to(ROOT)}")
        a.dirs = [str(KERNELS)]
    problems = [p for d in a.dirs for p in check(d)]
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"kernels OK: {', '.join(a.dirs)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
