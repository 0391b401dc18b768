"""metrale: the GPU memory of one LLM forward pass, with nothing on the hot path.

`import metrale` loads neither numpy nor cuda.bindings and touches no GPU: the
extension modules (arena, backends, scratch) load on first use of their names.
"""

from metrale.errors import MetraleError, OutOfMemoryError
from metrale.config import ModelConfig
from metrale.sizes import (BufferSizes, DecodeMetaLayout, Target, GATEUP_FUSED_MAX_M,
                           DECODE_META_MIN_ROWS, DECODE_META_MAX_ROWS, Q12_SIZING_STREAMS,
                           VERIFY_ROW_CAP)

__version__ = "0.1.0"

__all__ = [
    "ModelConfig", "BufferSizes", "BufferArena", "DecodeMetaLayout", "MoeFp8Scratch",
    "Target", "HostBackend", "CudaBackend", "ScratchSpaceManager", "ScratchSpace",
    "ScratchStats", "MetraleError", "OutOfMemoryError", "GATEUP_FUSED_MAX_M",
    "DECODE_META_MIN_ROWS", "DECODE_META_MAX_ROWS", "Q12_SIZING_STREAMS", "VERIFY_ROW_CAP",
]

_LAZY = {
    "BufferArena": "metrale._arena",
    "MoeFp8Scratch": "metrale.moe",
    "HostBackend": "metrale._backend",
    "ScratchSpaceManager": "metrale._scratch",
    "ScratchSpace": "metrale._scratch",
    "ScratchStats": "metrale._scratch",
    "CudaBackend": "metrale.cuda",
}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'metrale' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
