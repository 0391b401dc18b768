"""Shared fixtures, settings and the device markers.

Every arena test runs on each available backend (the `backend` fixture).  A
test that needs one CUDA device carries the marker ``gpu``, one that needs two
``two_gpus``; where the devices are missing it is skipped here, with the
reason, and nowhere else.  So ``pytest -m gpu`` runs exactly the device tests
and ``pytest -m "not gpu and not two_gpus"`` exactly the host ones.  A test
gets ``gpu`` by taking the `gpu` fixture or the cuda parameter of `backend`;
a test that needs devices without a CudaBackend of its own (doc blocks, ranks
in spawned processes) carries its marker itself.  A test skipped for want of a
device without carrying a device marker is reported as an error (the check
that keeps the markers honest; tests/test_markers.py tests it)."""

import os
import re

import pytest

import metrale

from helpers import DEVICE_MARKERS, cuda_backend, cuda_device_count, cuda_reason


def pytest_configure(config):
    # pyproject.toml registers the markers; a copy of tests/ run outside the
    # source tree (the wheel, sanitizer and release stages) registers them here.
    registered = {line.split(":")[0].strip() for line in config.getini("markers")}
    for name, meaning in DEVICE_MARKERS.items():
        if name not in registered:
            config.addinivalue_line("markers", f"{name}: {meaning}")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    # Before -m selects: a test that takes the gpu fixture is a device test.
    for item in items:
        if "gpu" in getattr(item, "fixturenames", ()) and item.get_closest_marker("gpu") is None:
            item.add_marker(pytest.mark.gpu)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # The one place a test is skipped for want of a device; with
    # METRALE_REQUIRE_GPU=1 (the tools/gpu_*_check.sh scripts) it fails instead,
    # so that a GPU run cannot pass by skipping everything.
    missing = None
    if item.get_closest_marker("two_gpus"):
        # Counted through the driver: the ranks run in processes of their own
        # and need no CudaBackend in this one.
        if cuda_device_count() < 2:
            missing = f"needs two CUDA devices (found {cuda_device_count()})"
    elif item.get_closest_marker("gpu") and cuda_backend() is None:
        missing = cuda_reason()
    if missing is not None:
        if os.environ.get("METRALE_REQUIRE_GPU") == "1":
            pytest.fail(f"METRALE_REQUIRE_GPU=1 but {missing}", pytrace=False)
        pytest.skip(missing)


# What a skip reason says when a test wanted a device: "no CUDA backend here",
# "needs two CUDA devices", "torch has no CUDA here", "CUDA only", ...
_WANTS_DEVICE = re.compile(r"\bno (CUDA|GPU)\b|\b(CUDA|GPU) devices?\b|\bneeds? (a|two) (CUDA|GPU)"
                           r"|\b(CUDA|GPU) only\b", re.IGNORECASE)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if not report.skipped or any(item.get_closest_marker(m) for m in DEVICE_MARKERS):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if _WANTS_DEVICE.search(reason):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} was skipped for want of a CUDA device ({reason}) but "
                           "carries no device marker: take the gpu fixture, or mark it "
                           "gpu / two_gpus (tests/conftest.py)")


@pytest.fixture(params=["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    """Each backend in turn: a fresh HostBackend, then the shared CudaBackend(0)."""
    return metrale.HostBackend() if request.param == "host" else cuda_backend()


@pytest.fixture
def gpu():
    """The shared CudaBackend(0); a test taking it is marked gpu."""
    g = cuda_backend()
    if g is None:       # asked for by name at run time, past the marker's skip
        pytest.fail(f"the gpu fixture without the gpu marker: {cuda_reason()}")
    return g


try:
    from hypothesis import HealthCheck, settings
except ImportError:                 # the property tests then skip themselves
    pass
else:
    # "ci": deterministic (derandomized, no example database) and bounded, so a
    # CI run is repeatable; "long": many more examples, for local runs.
    settings.register_profile("ci", max_examples=60, derandomize=True, database=None,
                              deadline=None, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("long", max_examples=3000, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("METRALE_HYPOTHESIS_PROFILE", "ci"))
