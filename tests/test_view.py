"""ArenaView on the host: zero-copy numpy and DLPack views, shapes checked
when a view is made.  (Lifetimes: test_lifetime.py; GPU consumers: test_cuda.py.)"""

import pytest

from metrale import HostBackend

from helpers import new


def test_host_views_zero_copy():
    import numpy as np
    gpu = HostBackend()
    with new(gpu, m=16) as arena:
        v = arena.view("hidden_states", "float32", (16, 1024))
        a = np.asarray(v)
        b = np.from_dlpack(arena.view("hidden_states", np.float32))
        assert a.ctypes.data == arena.hidden_states() == b.ctypes.data
        assert a.shape == (16, 1024) and b.shape == (arena.sizes().hidden_states // 4,)
        a[0, 0] = 3.5
        assert b[0] == 3.5
        bf = arena.view("hidden_states", "bfloat16")
        assert bf.__dlpack_device__() == (1, 0) and bf.shape == (16 * 2048,)
        with pytest.raises(ValueError, match="needs"):
            arena.view("hidden_states", "float32", (17, 1024))
        with pytest.raises(ValueError, match="dtype"):
            arena.view("hidden_states", "float128")
        with pytest.raises(ValueError, match="unknown buffer"):
            arena.view("nope", "uint8")
        with pytest.raises(AttributeError):
            v.__cuda_array_interface__
        del a, b, v, bf          # views alive at release would make it refuse


def test_view_shapes_are_checked_when_made():
    import itertools

    import numpy as np
    gpu = HostBackend()
    with new(gpu, m=16) as arena:
        n = arena.sizes().hidden_states
        for shape, exc, word in [
            ((0, 2**63), ValueError, "shape"),                       # past numpy's int64 dims
            ((2**62, 0, 3), ValueError, "more elements than an array can index"),
            ((1,) * 33, ValueError, "more than 32 dimensions"),
            (itertools.repeat(1), ValueError, "more than 32 dimensions"),
            ((2, -1), ValueError, "shape must be >= 0"),
            ((2, True), TypeError, "shape"),
            ((2.0,), TypeError, "shape"),
            ("12", TypeError, "shape"),
            (1.5, TypeError, "shape"),
            ((n + 1,), ValueError, "needs"),
        ]:
            with pytest.raises(exc, match=word):
                arena.view("hidden_states", "uint8", shape)
        assert arena.view("hidden_states", "uint8", (0, 2**63 - 1)).shape == (0, 2**63 - 1)
        assert np.asarray(arena.view("hidden_states", "uint8", (0, 2**63 - 1))).shape == (0, 2**63 - 1)
        assert arena.view("hidden_states", "uint8", (1,) * 32).shape == (1,) * 32
        assert np.asarray(arena.view("hidden_states", "float32", ())).shape == ()
        assert arena.view("hidden_states", "uint8", np.int64(8)).shape == (8,)
        assert arena.view("hidden_states", "uint8", (x for x in (2, 4))).shape == (2, 4)
        with pytest.raises(TypeError, match="name"):
            arena.view(b"hidden_states", "uint8")
