"""Locate what the CUDA extension needs at build time, for meson.

Prints four lines: the directory holding cuda.h, the site-packages root that
holds cuda/bindings/cydriver.pxd, the directory holding cudaProfiler.h (which
cydriver.pxd includes), and a note for the build log ('' when none).  Exits 1
with the reason on stderr when a piece is missing or when the CUDA major
versions of cuda.h and cuda-bindings disagree (a mismatch otherwise shows up as
confusing Cython or C++ errors).

Where several cuda.h are found (the nvidia-cuda-runtime wheel, $CUDA_HOME,
/usr/local/cuda), the one whose major.minor equals cuda-bindings' is taken,
else the newest of the same major, with a note.
"""

import importlib.util
import os
import re
import sys


def header_dirs():
    """Candidate include directories, the build environment's wheels first."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except ModuleNotFoundError:
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in sorted(os.listdir(root)) if os.path.isdir(root) else ():
            yield os.path.join(root, sub, "include")
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            yield os.path.join(os.environ[env], "include")
    yield "/usr/local/cuda/include"


def header_version(inc):
    text = open(os.path.join(inc, "cuda.h"), encoding="latin-1").read()
    m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", text)
    v = int(m.group(1)) if m else 0
    return v // 1000, v % 1000 // 10


def main():
    try:
        spec = importlib.util.find_spec("cuda.bindings")
    except ModuleNotFoundError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        sys.exit("cuda-bindings is not installed (it provides cuda/bindings/cydriver.pxd)")
    pkg = list(spec.submodule_search_locations)[0]
    pxd = os.path.join(pkg, "cydriver.pxd")
    if not os.path.isfile(pxd):
        sys.exit(f"{pkg} has no cydriver.pxd")
    from importlib.metadata import version
    bindings = version("cuda-bindings")
    want = tuple(int(x) for x in bindings.split(".")[:2])

    dirs = list(dict.fromkeys(header_dirs()))
    found = [(header_version(d), d) for d in dirs if os.path.isfile(os.path.join(d, "cuda.h"))]
    if not found:
        sys.exit("cuda.h not found (install the nvidia-cuda-runtime wheel or set CUDA_HOME)")
    exact = [d for v, d in found if v == want]
    same_major = sorted(((v, d) for v, d in found if v[0] == want[0]), reverse=True)
    note = ""
    if exact:
        inc = exact[0]
    elif same_major:
        (hv, inc) = same_major[0]
        note = (f"cuda.h {hv[0]}.{hv[1]} in {inc} with cuda-bindings {bindings}: "
                f"the minor versions differ; only driver calls present in both are used")
    else:
        got = ", ".join(f"{v[0]}.{v[1]} in {d}" for v, d in found)
        sys.exit(f"cuda-bindings {bindings} needs a CUDA {want[0]}.x cuda.h; found only {got}")

    prof = inc
    if "cudaProfiler.h" in open(pxd, encoding="utf-8").read():
        prof = next((d for d in [inc] + dirs if os.path.isfile(os.path.join(d, "cudaProfiler.h"))), None)
        if prof is None:
            sys.exit(f"cydriver.pxd includes cudaProfiler.h, found nowhere near {inc} "
                     "(install the nvidia-cuda-profiler-api wheel or a toolkit)")
    print(inc)
    print(os.path.dirname(os.path.dirname(pkg)))
    print(prof)
    print(note)


if __name__ == "__main__":
    main()
