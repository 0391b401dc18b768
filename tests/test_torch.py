"""metrale.torch on the host: buffers as torch tensors (CPU tensors over a
host arena), pinned as views are; the extra named when torch is missing.
The pool's torch side needs a GPU: tests/test_torch_cuda.py."""

import ctypes
import subprocess
import sys

import pytest

from helpers import COMPACT, _reserved
from metrale import HostBackend, MetraleError

torch = pytest.importorskip("torch", reason="metrale.torch needs torch (the extra metrale[torch])")
mt = pytest.importorskip("metrale.torch")

# metrale's element type names -> torch's, written out (not read from metrale).
TORCH_TYPES = {
    "bool": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32,
    "uint64": torch.uint64, "float16": torch.float16,
    "float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
}


def test_every_typed_buffer_is_a_tensor_at_its_pointer():
    arena = _reserved(HostBackend())
    seen = set()
    for name, info in arena.buffers.items():
        if info.dtype is None or info.nbytes == 0:
            continue
        t = mt.tensor(arena, name)
        assert t.dtype == TORCH_TYPES[info.dtype] and t.device.type == "cpu"
        if t.numel() == 0:          # a shape of no elements at these limits (o_latent):
            continue                # torch gives such a tensor the pointer 0
        assert t.data_ptr() == arena.ptr(name)
        assert t.numel() * t.element_size() <= info.nbytes
        seen.add(info.dtype)
        del t
    assert {"bfloat16", "float32", "float8_e4m3fn", "uint32"} <= seen
    # the spec's shape: hidden_states is [max_batch_tokens, hidden_size]
    assert tuple(mt.tensor(arena, "hidden_states").shape) == (64, COMPACT.hidden_size)
    arena.release()


@pytest.mark.parametrize("dtype", sorted(TORCH_TYPES))
def test_a_tensor_of_any_type_shares_the_buffer(dtype):
    arena = _reserved(HostBackend())
    t = mt.tensor(arena, "logits", dtype)
    assert t.dtype == TORCH_TYPES[dtype] and t.data_ptr() == arena.ptr("logits")
    raw = mt.tensor(arena, "logits", "uint8")
    raw[:16] = torch.arange(16, dtype=torch.uint8)
    assert ctypes.string_at(arena.ptr("logits"), 16) == bytes(range(16))
    assert t.view(torch.uint8)[:16].tolist() == list(range(16))     # no copy anywhere
    del t, raw
    arena.release()


def test_a_tensor_pins_its_buffer():
    arena = _reserved(HostBackend())
    h, r = mt.tensors(arena, "hidden_states", "residual")
    assert r.data_ptr() == arena.ptr("residual")
    assert {(p.kind, p.name) for p in arena.pins()} == {("view", "hidden_states"),
                                                         ("view", "residual")}
    with pytest.raises(BufferError):
        arena.sleep()
    with pytest.raises(BufferError, match="hidden_states"):
        arena.release()
    del h, r
    arena.release()
    with pytest.raises(MetraleError):
        mt.tensor(arena, "hidden_states")


def test_bad_input_is_refused_as_the_view_refuses_it():
    arena = _reserved(HostBackend())
    with pytest.raises(ValueError, match="name"):
        mt.tensor(arena, "no_such_buffer")
    with pytest.raises(ValueError):
        mt.tensor(arena, "hidden_states", "float32", (1 << 30,))
    with pytest.raises(MetraleError, match="CudaBackend"):
        mt.pool(arena, 1 << 20)
    arena.release()


def test_without_torch_the_import_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import metrale.torch\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120).stdout
    assert "pip install 'metrale[torch]'" in out
