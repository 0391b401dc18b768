"""ArenaView on the host: zero-copy numpy and DLPack views, shapes checked
when a view is made.  (Lifetimes: test_view_lifetime.py; GPU consumers: test_cuda.py.)"""

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
        bf = arena.view("hidden_states", "bfloat16")     # its own type: its own shape
        assert bf.__dlpack_device__() == (1, 0) and bf.shape == (16, 2048)
        with pytest.raises(ValueError, match="needs"):
            arena.view("hidden_states", "float32", (17, 1024))
        with pytest.raises(ValueError, match="dtype"):
            arena.view("hidden_states", "float128")
        with pytest.raises(ValueError, match="unknown buffer"):
            arena.view("nope", "uint8")
        with pytest.raises(AttributeError):
            v.__cuda_array_interface__
        del a, b, v, bf          # views alive at release would make it refuse


def test_a_view_keeps_the_specs_shape_for_elements_of_its_size():
    # hidden_states is bf16 [max_batch_tokens, hidden_size] (docs/buffers.md):
    # any 2-byte type keeps that shape (numpy has no bf16: uint16 for its
    # bits); another size is 1-D, all of it; a shape given is the shape.
    import numpy as np
    gpu = HostBackend()
    with new(gpu, m=16) as arena:
        h = arena.sizes().config.hidden_size
        n = arena.sizes().hidden_states
        assert n == 16 * h * 2
        for dtype in (None, "bfloat16", "uint16", np.int16, "float16"):
            assert arena.view("hidden_states", dtype).shape == (16, h), dtype
        assert arena.view("hidden_states", "uint8").shape == (n,)
        assert arena.view("hidden_states", "float32").shape == (n // 4,)
        assert arena.view("hidden_states", "uint16", (8, 2 * h)).shape == (8, 2 * h)
        bits = np.asarray(arena.view("hidden_states", "uint16"))
        bits[3, 5] = 0x3F80                                     # bf16 1.0
        assert np.asarray(arena.view("hidden_states", "uint8"))[(3 * h + 5) * 2 + 1] == 0x3F
        del bits


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


# -- element types: numpy's spellings, with numpy's meaning ----------------------------

# Every spelling numpy accepts for the supported types: numpy itself is the
# expectation (np.dtype(s).name), so 'float' is float64 and 'i8' int64.
NUMPY_SPELLINGS = ["bool", "?", "b1", "int8", "i1", "|i1", "b", "byte", "uint8", "u1", "B",
                   "int16", "<i2", "i2", "h", "short", "uint16", "H", "<u2", "int32", "<i4",
                   "i4", "=i4", "i", "intc", "uint32", "I", "int64", "i8", "<i8", "l", "q",
                   "int", "long", "uint64", "u8", "L", "Q", "uint", "float16", "f2", "<f2", "e",
                   "half", "float32", "f4", "<f4", "=f4", "f", "single", "float64", "f8", "d",
                   "double", "float", "complex64", "c8", "F", "complex128", "c16", "D", "complex"]


@pytest.mark.parametrize("spelling", NUMPY_SPELLINGS)
def test_dtype_spellings_mean_what_numpy_means(spelling):
    import numpy as np
    from metrale._base._common import resolve_dtype
    expect = np.dtype(spelling)
    assert resolve_dtype(spelling) == expect.name
    assert resolve_dtype(expect) == expect.name            # the dtype object too
    gpu = HostBackend()
    with new(gpu, m=16) as arena:
        v = arena.view("hidden_states", spelling, (4,))
        a = np.asarray(v)
        assert a.dtype == expect and a.shape == (4,) and v.nbytes == 4 * expect.itemsize
        del v, a


def test_dtype_objects_and_refusals():
    import numpy as np
    from metrale._base._common import DTYPE_NAMES, resolve_dtype
    for t, name in [(float, "float64"), (int, "int64"), (bool, "bool"), (complex, "complex128"),
                    (np.float32, "float32"), (np.uint8, "uint8"), (np.bool_, "bool")]:
        assert resolve_dtype(t) == name == np.dtype(t).name
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        assert resolve_dtype(name) == name and name in DTYPE_NAMES

    class FakeTorch:            # what str() of a torch dtype looks like
        def __init__(self, s):
            self.s = s

        def __str__(self):
            return self.s
    assert resolve_dtype(FakeTorch("torch.bfloat16")) == "bfloat16"
    assert resolve_dtype(FakeTorch("torch.float8_e4m3fn")) == "float8_e4m3fn"
    for bad in (">f4", "f16", "float128", "S4", "U2", "O", "object", "bf16", "torch.float32",
                "", np.dtype(">f4"), np.dtype([("a", "<f4")]), np.dtype("O"),
                FakeTorch("torch.float"), str):
        with pytest.raises(ValueError, match="dtype"):
            resolve_dtype(bad)
    for bad in (3.5, None, [1], object()):
        with pytest.raises(TypeError, match="dtype"):
            resolve_dtype(bad)


def _capsule_struct(capsule, name):
    """Decode a DLPack capsule with ctypes, independently of metrale's structs
    (the layouts of dlpack.h, v0.8 and v1.x)."""
    import ctypes

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                    ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                    ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                    ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.c_void_p),
                    ("byte_offset", ctypes.c_uint64)]

    class Versioned(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                    ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                    ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    p = get(capsule, name.encode())
    if name == "dltensor_versioned":
        v = Versioned.from_address(p)
        return v, v.dl_tensor
    return None, DLTensor.from_address(p)


@pytest.mark.parametrize("dtype, code, bits", [("float8_e4m3fn", 10, 8), ("float8_e5m2", 12, 8),
                                               ("bfloat16", 4, 16), ("float32", 2, 32),
                                               ("bool", 6, 8), ("complex64", 5, 64)])
def test_dlpack_versioned_and_legacy_capsules(dtype, code, bits):
    gpu = HostBackend()
    with new(gpu, m=16) as arena:
        v = arena.view("fp8_act", dtype, (2, 8))
        assert v.dtype == dtype and v.nbytes == 16 * bits // 8
        cap = v.__dlpack__(max_version=(1, 0))
        assert "dltensor_versioned" in repr(cap)
        head, t = _capsule_struct(cap, "dltensor_versioned")
        assert (head.major, head.minor, head.flags) == (1, 1, 0)
        assert (t.data, t.device_type, t.device_id, t.ndim) == (arena.fp8_act(), 1, 0, 2)
        assert (t.code, t.bits, t.lanes) == (code, bits, 1)
        assert (t.shape[0], t.shape[1], t.strides, t.byte_offset) == (2, 8, None, 0)
        for legacy in (None, (0, 8)):
            cap0 = v.__dlpack__(max_version=legacy)
            assert '"dltensor"' in repr(cap0)
            _, t0 = _capsule_struct(cap0, "dltensor")
            assert (t0.data, t0.code, t0.bits, t0.ndim) == (arena.fp8_act(), code, bits, 2)
        with pytest.raises(BufferError, match="copied"):
            v.__dlpack__(copy=True)
        with pytest.raises(BufferError, match="device"):
            v.__dlpack__(dl_device=(2, 0))
        with pytest.raises(TypeError, match="max_version"):
            v.__dlpack__(max_version=1)
        assert v.__dlpack__(copy=False, dl_device=(1, 0)) is not None
        del v, cap, cap0, head, t, t0
        import gc
        gc.collect()            # unconsumed capsules drop their view


def test_numpy_consumes_the_versioned_capsule():
    """numpy 2.1+ asks for DLPack 1.x: the versioned capsule must work end to end."""
    import numpy as np

    class Spy:
        def __init__(self, v):
            self.v, self.asked = v, []

        def __dlpack__(self, **kw):
            self.asked.append(kw.get("max_version"))
            return self.v.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.v.__dlpack_device__()
    gpu = HostBackend()
    with new(gpu, m=16) as arena:
        spy = Spy(arena.view("hidden_states", "<f4", (8,)))
        a = np.from_dlpack(spy)
        a[:] = 1.5
        assert np.asarray(arena.view("hidden_states", "f4", (8,))).sum() == 12.0
        assert spy.asked and (np.lib.NumpyVersion(np.__version__) < "2.1.0"
                              or spy.asked[-1][0] >= 1)
        del a, spy
