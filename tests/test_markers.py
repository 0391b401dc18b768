"""The device markers (tests/conftest.py): registered, applied to every test
that needs a CUDA device, and kept honest: ``-m gpu`` selects exactly the
tests that take a device, and a test skipped for want of one without a marker
is an error."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import DEVICE_MARKERS, cuda_backend

HERE = Path(__file__).resolve().parent


def test_device_markers_are_registered(request):
    config = request.config
    lines = config.getini("markers")
    for name, meaning in DEVICE_MARKERS.items():
        assert f"{name}: {meaning}" in lines
    if config.inipath is not None and config.inipath.name == "pyproject.toml":
        # The source tree's settings: the same words, and a misspelt marker is an error.
        assert len([line for line in lines if line.split(":")[0] in DEVICE_MARKERS]) == 2
        assert config.option.strict_markers


def test_collected_device_tests_carry_their_marker(request):
    """Over the tests of this run: the gpu fixture and the cuda parameter of
    `backend` carry gpu, the host parameter does not, no test carries both
    markers."""
    items = request.session.items
    for item in items:
        gpu = item.get_closest_marker("gpu") is not None
        two = item.get_closest_marker("two_gpus") is not None
        param = getattr(getattr(item, "callspec", None), "params", {}).get("backend")
        assert not (gpu and two), item.nodeid
        if "gpu" in item.fixturenames or param == "cuda":
            assert gpu, item.nodeid
        if param == "host":
            assert not gpu, item.nodeid


_SYNTHETIC = '''
import pytest

@pytest.fixture
def arena(gpu):
    return gpu

def test_host():
    pass

def test_backend(backend):
    pass

def test_takes_gpu(gpu):
    assert gpu is not None

def test_through_a_fixture(arena):
    assert arena is not None

@pytest.mark.gpu
def test_marked():
    pass

@pytest.mark.two_gpus
def test_two():
    pass

def test_hand_gated():
    pytest.skip("no CUDA backend here: a gate of its own")

def test_wants_torch_cuda():
    pytest.skip("torch has no CUDA here")

def test_skips_for_another_reason():
    pytest.skip("no nvcc here")
'''


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A tests/ folder with this suite's conftest.py and helpers.py (and the
    oracle helpers.py imports) and the module above, and a runner of pytest
    over it."""
    root = tmp_path_factory.mktemp("markers")
    tests = root / "tests"
    tests.mkdir()
    for name in ("conftest.py", "helpers.py", "reference_oracle.py"):
        shutil.copy(HERE / name, tests / name)
    (tests / "test_synthetic.py").write_text(textwrap.dedent(_SYNTHETIC), encoding="utf-8")

    def run(*args, env=None):
        r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                            "--strict-markers", *args, "tests"], cwd=root,
                           capture_output=True, text=True, timeout=300,
                           env=None if env is None else {**os.environ, **env})
        return r.returncode, r.stdout + r.stderr
    return run


def _collected(run, expression):
    rc, out = run("--collect-only", "-q", "-m", expression)
    assert rc in (0, 5), out                        # 5: nothing selected
    return {line.split("::")[1] for line in out.splitlines() if "::" in line}


def test_markers_select_the_device_tests(synthetic):
    assert _collected(synthetic, "gpu") == {
        "test_backend[cuda]", "test_takes_gpu", "test_through_a_fixture", "test_marked"}
    assert _collected(synthetic, "two_gpus") == {"test_two"}


def test_host_tests_run_and_an_unmarked_device_skip_is_an_error(synthetic):
    rc, out = synthetic("-q", "-rA", "-m", "not gpu and not two_gpus")
    assert rc == 1, out
    outcomes = {}
    for line in out.splitlines():
        word, _, rest = line.partition(" tests/test_synthetic.py::")
        if rest:
            outcomes[rest.split(" ")[0]] = word
    assert outcomes == {"test_host": "PASSED", "test_backend[host]": "PASSED",
                        "test_hand_gated": "FAILED", "test_wants_torch_cuda": "FAILED"}, out
    # (-rA names a skipped test by its line; the one skip is test_skips_for_another_reason)
    assert "2 failed, 2 passed, 1 skipped, 5 deselected" in out and ": no nvcc here" in out, out
    for name in ("test_hand_gated", "test_wants_torch_cuda"):
        assert f"{name} was skipped for want of a CUDA device" in out, out


def test_a_gpu_run_can_require_its_device(synthetic):
    # METRALE_REQUIRE_GPU=1 (tools/gpu_*_check.sh): a missing device fails the test.
    rc, out = synthetic("-q", "-rA", "-k", "test_marked", env={"METRALE_REQUIRE_GPU": "1"})
    if cuda_backend() is None:
        assert rc == 1 and "ERROR tests/test_synthetic.py::test_marked" in out, out
        assert "METRALE_REQUIRE_GPU=1 but no CUDA backend here" in out, out
    else:
        assert rc == 0 and "PASSED tests/test_synthetic.py::test_marked" in out, out
