"""Shared fixtures: every arena test runs on each available backend.

The CUDA backend is used when metrale's CUDA extension loads and a device is
present; otherwise its parameter is skipped with the reason."""

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


