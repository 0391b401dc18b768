"""The version is written once, in meson.build's project(): the package
(`metrale.__version__`), its installed metadata and `metrale --version` all
report that one."""

import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys

import pytest

import metrale


def _meson_build_version():
    # The source tree's meson.build: beside tests/, or where METRALE_SOURCE_DIR
    # points when the tests run from a copy (the installed-wheel runs).
    for root in (os.environ.get("METRALE_SOURCE_DIR"), pathlib.Path(__file__).resolve().parents[1]):
        path = pathlib.Path(root or "") / "meson.build"
        if root and path.is_file():
            m = re.search(r"project\(.*?(?<![\w])version\s*:\s*'([^']+)'",
                          path.read_text(encoding="utf-8"), re.S)
            assert m, f"no version in {path}'s project()"
            return m.group(1)
    pytest.skip("no source tree here (set METRALE_SOURCE_DIR to check against meson.build)")


def test_version_is_pep440():
    assert isinstance(metrale.__version__, str)
    assert re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", metrale.__version__)


def test_version_is_the_installed_metadata():
    assert metrale.__version__ == importlib.metadata.version("metrale")


def test_version_is_meson_builds():
    assert metrale.__version__ == _meson_build_version()


def test_cli_version():
    r = subprocess.run([sys.executable, "-m", "metrale", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["metrale", metrale.__version__]


def test_import_reads_no_metadata():
    # __version__ comes from the generated metrale/_version.py: importing
    # metrale loads no importlib.metadata and nothing outside the package.
    code = ("import sys; before = set(sys.modules); import metrale; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    new = r.stdout.split()
    assert "importlib.metadata" not in new
    assert all(m == "metrale" or m.startswith("metrale.") for m in new), new
