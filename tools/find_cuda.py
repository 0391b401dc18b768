"""Locate what the CUDA extension needs at build time, for meson.

Prints three lines: the directory holding cuda.h, the site-packages root that
holds cuda/bindings/cydriver.pxd, and the directory holding cudaProfiler.h.  Exits 1 with the reason on stderr when
either is missing or when their CUDA major versions disagree (a mismatch
otherwise shows up as confusing Cython errors).
"""

import importlib.util
import os
import re
import sys


def header_dirs():
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


def main():
    dirs = list(header_dirs())
    inc = next((d for d in dirs if os.path.isfile(os.path.join(d, "cuda.h"))), None)
    if inc is None:
        sys.exit("cuda.h not found (install the nvidia-cuda-runtime wheel or set CUDA_HOME)")
    # cydriver.pxd also includes cudaProfiler.h, which some wheels ship apart.
    prof = next((d for d in [inc] + dirs if os.path.isfile(os.path.join(d, "cudaProfiler.h"))), None)
    if prof is None:
        sys.exit(f"cudaProfiler.h not found beside {inc} (install nvidia-cuda-profiler-api or a toolkit)")
    try:
        spec = importlib.util.find_spec("cuda.bindings")
    except ModuleNotFoundError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        sys.exit("cuda-bindings is not installed (it provides cuda/bindings/cydriver.pxd)")
    pkg = list(spec.submodule_search_locations)[0]
    if not os.path.isfile(os.path.join(pkg, "cydriver.pxd")):
        sys.exit(f"{pkg} has no cydriver.pxd")
    text = open(os.path.join(inc, "cuda.h"), encoding="latin-1").read()
    m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", text)
    header = int(m.group(1)) if m else 0
    from importlib.metadata import version
    bindings = version("cuda-bindings")
    if header // 1000 != int(bindings.split(".")[0]):
        sys.exit(f"cuda.h in {inc} is CUDA {header // 1000}.{header % 1000 // 10} but "
                 f"cuda-bindings is {bindings}: their major versions must match")
    print(inc)
    print(os.path.dirname(os.path.dirname(pkg)))
    print(prof)


if __name__ == "__main__":
    main()
