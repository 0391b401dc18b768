"""metrale.torch on the host: buffers as torch tensors (CPU tensors over a
host arena), pinned as views are; the extra named when torch is missing;
install_workspaces' refusals, and its Triton allocator against a stand-in
Triton module (the registration and the allocator's checks are metrale's).
The pool's torch side and cuBLAS need a GPU: tests/test_torch_cuda.py."""

import contextvars
import ctypes
import subprocess
import sys
import types

import pytest

from helpers import COMPACT, _reserved
from metrale import HostBackend, MetraleError

torch = pytest.importorskip("torch", reason="metrale.torch needs torch (the extra metrale[torch])")
mt = pytest.importorskip("metrale.torch")
from metrale._integrations import _torch_workspaces as ws_mod  # noqa: E402  (after torch)

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
    assert t.flatten().view(torch.uint8)[:16].tolist() == list(range(16))   # no copy anywhere
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


def _no_pins_left(arena):
    assert arena.pins() == ()
    arena.release()             # refuses while any view is alive


def test_install_workspaces_refuses_bad_arguments_and_pins_nothing():
    arena = _reserved(HostBackend())
    with pytest.raises(ValueError, match="give a buffer"):
        mt.install_workspaces(arena)
    with pytest.raises(ValueError, match="name"):           # the arena's own refusal
        mt.install_workspaces(arena, cublas="no_such_buffer")
    with pytest.raises(ValueError, match="name"):
        mt.install_workspaces(arena, cublas="logits", triton="no_such_buffer")
    with pytest.raises(TypeError, match="name must be a str"):
        mt.install_workspaces(arena, triton=3)
    with pytest.raises(ValueError, match="cublas: buffer 'ssd_scratch' is empty"):
        mt.install_workspaces(arena, cublas="ssd_scratch")
    with pytest.raises(ValueError, match="triton: buffer 'logits' is the cuBLAS workspace"):
        mt.install_workspaces(arena, cublas="logits", triton="logits")
    with pytest.raises(MetraleError, match="install_workspaces: the arena's backend is "
                       "HostBackend; a library workspace needs a CudaBackend") as refused:
        mt.install_workspaces(arena, cublas="logits", triton="scratch")
    assert arena.pins() == ()       # while the refusal's traceback is alive too
    del refused
    assert ws_mod._INSTALLED == {"cublas": None, "triton": None}
    _no_pins_left(arena)
    with pytest.raises(MetraleError):
        mt.install_workspaces(arena, triton="scratch")      # released


class _NullAllocator:
    def __call__(self, size, alignment, stream):
        raise RuntimeError("no allocator set")


@pytest.fixture(params=["contextvar", "global"])
def fake_triton(request, monkeypatch):
    """A stand-in Triton: set_allocator and runtime._allocation._allocator, a
    ContextVar (Triton >= 3.4) or a module global (earlier); the host arena
    let past the CUDA check."""
    allocation = types.ModuleType("triton.runtime._allocation")
    triton = types.ModuleType("triton")
    if request.param == "contextvar":
        allocation._allocator = contextvars.ContextVar("_allocator", default=_NullAllocator())
        triton.current = allocation._allocator.get
        triton.set_allocator = allocation._allocator.set
    else:
        allocation._allocator = _NullAllocator()
        triton.current = lambda: allocation._allocator
        triton.set_allocator = lambda fn: setattr(allocation, "_allocator", fn)
    runtime = types.ModuleType("triton.runtime")
    runtime._allocation = allocation
    triton.runtime = runtime
    for name, mod in (("triton", triton), ("triton.runtime", runtime),
                      ("triton.runtime._allocation", allocation)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(ws_mod, "_device_of", lambda arena, *why: torch.device("cpu"))
    yield triton
    for ws in {w for w in ws_mod._INSTALLED.values() if w is not None}:
        ws.remove()


def test_triton_scratch_is_the_buffer_while_installed(fake_triton):
    arena = _reserved(HostBackend())
    before = object()
    fake_triton.set_allocator(before)
    ws = mt.install_workspaces(arena, triton="logits")
    assert (ws.triton, ws.cublas, ws.arena) == ("logits", None, arena)
    fn = fake_triton.current()
    assert fn is not before and ws.triton_active() and ws.triton_peak() == 0
    n = arena.nbytes("logits")
    got = fn(n, 128, None)
    assert got.data_ptr() == arena.ptr("logits") and ws.triton_peak() == n
    assert fn(4096, 256, 0).data_ptr() == arena.ptr("logits") and ws.triton_peak() == n
    with pytest.raises(MetraleError, match=f"asked {n + 1:,} bytes of scratch; buffer 'logits'"):
        fn(n + 1, 16, None)                 # never memory beyond the buffer
    assert ws.triton_peak() == n
    with pytest.raises(MetraleError, match="triton: installed already"):
        mt.install_workspaces(arena, triton="residual")
    assert {(p.kind, p.name) for p in arena.pins()} == {("view", "logits")}
    with pytest.raises(BufferError, match="logits"):
        arena.release()                     # (and pending until the pin goes)
    ws.remove()
    assert fake_triton.current() is before and not ws.triton_active()
    assert ws.triton is None and ws.triton_peak() == 0
    with pytest.raises(MetraleError, match="removed"):
        fn(16, 16, None)                    # a stale reference hands out nothing
    ws.remove()                             # twice: nothing
    _no_pins_left(arena)


def test_triton_scratch_refuses_an_alignment_the_buffer_lacks(fake_triton):
    arena = _reserved(HostBackend())
    ptr = arena.ptr("scratch")
    align = ptr & -ptr                      # the largest power of two dividing it
    with mt.install_workspaces(arena, triton="scratch") as ws:
        fn = fake_triton.current()
        assert fn(64, align, None).data_ptr() == ptr
        with pytest.raises(MetraleError, match=f"aligned to {2 * align}"):
            fn(64, 2 * align, None)
        assert ws.triton_active()
    assert not ws.triton_active() and isinstance(fake_triton.current(), _NullAllocator)
    _no_pins_left(arena)


def test_an_allocator_set_over_ours_is_left_in_place(fake_triton):
    arena = _reserved(HostBackend())
    ws = mt.install_workspaces(arena, triton="logits")
    ours = fake_triton.current()
    theirs = object()
    fake_triton.set_allocator(theirs)       # as torch.compile's kernels do
    assert not ws.triton_active()
    ws.remove()
    assert fake_triton.current() is theirs
    with pytest.raises(MetraleError, match="removed"):
        ours(16, 16, None)
    _no_pins_left(arena)


def test_without_triton_the_error_names_it(monkeypatch):
    arena = _reserved(HostBackend())
    monkeypatch.setattr(ws_mod, "_device_of", lambda arena, *why: torch.device("cpu"))
    monkeypatch.setitem(sys.modules, "triton", None)
    with pytest.raises(ImportError, match="triton= needs Triton"):
        mt.install_workspaces(arena, triton="logits")
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    with pytest.raises(MetraleError, match="has no set_allocator"):
        mt.install_workspaces(arena, triton="logits")
    assert ws_mod._INSTALLED == {"cublas": None, "triton": None}
    _no_pins_left(arena)


def test_importing_metrale_torch_imports_no_triton():
    code = "import sys, metrale.torch; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120).stdout
    assert out.strip() == "False"
