"""Shared fixtures: every arena test runs on each available backend.

The CUDA backend is used when metrale's CUDA extension loads and a device is
present; otherwise its parameter is skipped with the reason."""

import pytest

import metrale

_cuda_reason = None
_cuda_backend = None


def _cuda():
    global _cuda_reason, _cuda_backend
    if _cuda_backend is None and _cuda_reason is None:
        try:
            _cuda_backend = metrale.CudaBackend(0)
        except metrale.MetraleError as e:
            _cuda_reason = f"no CUDA backend here: {e}"
    return _cuda_backend


@pytest.fixture(params=["host", "cuda"])
def backend(request):
    if request.param == "host":
        return metrale.HostBackend()
    gpu = _cuda()
    if gpu is None:
        pytest.skip(_cuda_reason)
    return gpu


def live_counts(gpu):
    """(live allocations, live bytes) as the backend reports them."""
    return gpu.live_alloc_count, gpu.live_bytes


class Mem:
    """Read and write arena buffers as bytes on either backend (host: numpy;
    CUDA: the backend's own copies), for sentinel tests."""

    def __init__(self, arena, gpu):
        self.arena, self.gpu = arena, gpu

    def fill(self, name, value):
        import numpy as np
        n = getattr(self.arena.sizes(), name)
        if n:
            self.write(name, np.full(n, value, dtype=np.uint8))

    def write(self, name, data):
        """Write the uint8 array `data` over the whole of buffer `name`."""
        import numpy as np
        if isinstance(self.gpu, metrale.HostBackend):
            np.asarray(self.arena.view(name, "uint8"))[:] = data
        else:
            self.gpu.upload(ptr_of(self.arena, name), data.tobytes())

    def read(self, name):
        import numpy as np
        n = getattr(self.arena.sizes(), name)
        if n == 0:
            return np.zeros(0, dtype=np.uint8)
        if isinstance(self.gpu, metrale.HostBackend):
            return np.asarray(self.arena.view(name, "uint8")).copy()
        return np.frombuffer(self.gpu.download(ptr_of(self.arena, name), n), dtype=np.uint8)


def ptr_of(arena, name):
    """The pointer of any of the 46 entries (the two without an accessor via a view)."""
    if name in ("moe_fp8_scratch", "ssm_rowwise_w_bf16"):
        return arena.view(name, "uint8").ptr if getattr(arena.sizes(), name) else 0
    return getattr(arena, name)()
