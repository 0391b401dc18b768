"""Shared fixtures: every arena test runs on each available backend.

The CUDA backend is used when metrale's CUDA extension loads and a device is
present; otherwise its parameter is skipped with the reason."""

import os

import pytest

import metrale

from helpers import cuda_backend, cuda_reason


@pytest.fixture(params=["host", "cuda"])
def backend(request):
    if request.param == "host":
        return metrale.HostBackend()
    gpu = cuda_backend()
    if gpu is None:
        pytest.skip(cuda_reason())
    return gpu


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
