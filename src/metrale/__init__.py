"""metrale: the GPU memory of one LLM forward pass, with nothing on the hot path.

`import metrale` loads nothing but this file: no numpy, no cuda.bindings, no
GPU contact.  Each public name loads its module on first use (PEP 562), and is
then an ordinary module attribute.
"""

# Public name -> the module that defines it: the one list of the package's API.
_LAZY = {
    "ModelConfig": "metrale.config",
    "BufferSizes": "metrale.sizes",
    "BufferSpec": "metrale.buffers",
    "BufferSet": "metrale.buffers",
    "REFERENCE": "metrale.reference",
    "BufferArena": "metrale._arena",
    "StepInputs": "metrale._step",
    "DecodeMetaLayout": "metrale.decode_meta",
    "MoeFp8Scratch": "metrale.moe",
    "Target": "metrale.target",
    "HostBackend": "metrale._host_backend",
    "CudaBackend": "metrale.cuda",
    "ScratchSpaceManager": "metrale._scratch",
    "ScratchSpace": "metrale._scratch",
    "ScratchStats": "metrale._scratch",
    "MetraleError": "metrale.errors",
    "OutOfMemoryError": "metrale.errors",
    "ConfigWarning": "metrale.errors",
    "GATEUP_FUSED_MAX_M": "metrale.sizes",
    "DECODE_META_MIN_ROWS": "metrale.decode_meta",
    "DECODE_META_MAX_ROWS": "metrale.decode_meta",
    "Q12_SIZING_STREAMS": "metrale.sizes",
    "VERIFY_ROW_CAP": "metrale.sizes",
    "DebugOptions": "metrale.debug",
    "stats": "metrale._summary",
    "fit": "metrale.fitting",
    "ArenaFit": "metrale.fitting",
}

__all__ = list(_LAZY)
# metrale/_version.py is written by the build from meson.build (the one place
# the version is set); loaded on first use like the rest.
_LAZY["__version__"] = "metrale._version"


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'metrale' has no attribute {name!r}")
    value = getattr(__import__(mod, fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
