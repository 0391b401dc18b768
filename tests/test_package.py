"""The package as a user meets it: a light import, the public names, objects
made only by their factories."""

import subprocess
import sys

import pytest

import metrale
from metrale import BufferArena, BufferSizes
from metrale.sizes import BUFFER_NAMES

from helpers import PRESET


def test_objects_are_made_only_by_their_factories():
    from metrale._arena._view import ArenaView
    from metrale._backends._backend import Backend
    from metrale._backends._scratch import ScratchSpace, _Lease, _Region
    for cls in (BufferArena, ArenaView, ScratchSpace, _Lease, _Region):
        with pytest.raises(TypeError):
            cls()
        with pytest.raises(TypeError):
            cls.__new__(cls)
    sizes = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0)).replace(logits=256)
    with pytest.raises(TypeError, match="gpu: Backend does not implement"):
        BufferArena.from_sizes(PRESET, sizes, 1, 0, Backend())
    with pytest.raises(TypeError, match="gpu"):
        BufferArena.new(PRESET, 1, 16, 16, 1, Backend())


def test_import_is_light():
    code = ("import sys, metrale; "
            "bad = [m for m in sys.modules if m == 'numpy' or m.startswith(('numpy.', 'cuda'))]; "
            "print(bad)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_public_module_paths_load_on_first_use():
    # After `import metrale` alone, metrale.fitting (and every public module
    # path) is an attribute that loads its layer's module, the same object as
    # `import metrale.fitting` gives; an unknown name is still an AttributeError.
    code = ("import sys, metrale; m = metrale.fitting; "
            "assert m is sys.modules['metrale._integrations.fitting']; "
            "assert m is sys.modules['metrale.fitting']; "
            "assert metrale.levers.LEVERS and metrale.tp.shared_arenas() == []; "
            "assert not hasattr(metrale, 'fittings') and not hasattr(metrale, '_fitting'); "
            "import metrale.sizes; assert metrale.sizes is sys.modules['metrale._sizing.sizes']")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names():
    for name in ("ModelConfig", "BufferSizes", "BufferArena", "DecodeMetaLayout", "MoeFp8Scratch",
                 "Target", "HostBackend", "CudaBackend", "ScratchSpaceManager", "ScratchSpace",
                 "ScratchStats", "MetraleError", "OutOfMemoryError"):
        assert hasattr(metrale, name), name
    assert issubclass(metrale.OutOfMemoryError, metrale.MetraleError)
    assert issubclass(metrale.OutOfMemoryError, MemoryError)


def test_every_repr_says_what_it_is():
    from metrale import (HostBackend, ModelConfig, ScratchSpaceManager, Target)
    from metrale._sizing._layout import plan_layout
    from metrale.testing import FaultyBackend

    from helpers import PRESET, new
    gpu = FaultyBackend()
    arena = new(gpu, m=16)
    manager = ScratchSpaceManager(64, 1)
    view = arena.view("logits", "f4", (2,))
    objects = [gpu, HostBackend(), arena, view, arena.buffers, arena.buffers["logits"],
               arena.summary(), arena.sizes(), arena.decode_meta(), Target.reference(),
               ModelConfig(hidden_size=4), manager, manager.get_scratch(), manager.stats(),
               plan_layout(arena.sizes()), arena.moe_fp8_scratch(PRESET, 16)]
    for obj in objects:
        assert repr(obj).lstrip("<").startswith(type(obj).__name__), repr(obj)[:80]
    assert "logits" in repr(view) and "float32" in repr(view)
    del view, objects          # a live view would make release refuse
    arena.release()


def test_numpy_is_a_declared_dependency():
    # StepInputs and ScratchSpace.get import numpy at run time: a plain
    # `pip install metrale` must bring it (while `import metrale` stays free of it).
    from importlib.metadata import requires
    plain = [r for r in requires("metrale") or () if "extra ==" not in r]
    assert any(r.replace(" ", "").startswith("numpy") for r in plain), plain


def test_no_extension_declares_itself_free_threading_compatible():
    """Nothing has run metrale without the GIL (no free-threaded interpreter
    can be had here): no extension may tell a free-threaded interpreter to
    keep the GIL off (docs/RELEASE.md).  Read from the build's own files:
    the directive leaves no trace in a GIL build's binaries."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    if not (root / "meson.build").is_file():
        pytest.skip("needs the source tree (run from a copy of the tests)")
    sources = [root / "meson.build"] + sorted((root / "src" / "metrale").rglob("*.pyx*"))
    assert len(sources) > 20                # every package's Cython sources
    declared = [p.name for p in sources
                if re.search(r"^[^#\n]*freethreading_compatible|^# cython:.*freethreading",
                             p.read_text(), re.M)]
    assert declared == []
