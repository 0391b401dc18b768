"""metrale: the GPU memory of one LLM forward pass, with nothing on the hot path.

`import metrale` loads nothing but this file: no numpy, no cuda.bindings, no
GPU contact.  Each public name loads its module on first use (PEP 562), and is
then an ordinary module attribute.
"""

# Public name -> the module that defines it: the one list of the package's API.
_LAZY = {
    "ModelConfig": "metrale._sizing.config",
    "BufferSizes": "metrale._sizing.sizes",
    "BufferSpec": "metrale._sizing.buffers",
    "BufferSet": "metrale._sizing.buffers",
    "REFERENCE": "metrale._sizing.reference",
    "MINIMAL": "metrale._sizing.minimal",
    "BufferArena": "metrale._arena._buffer_arena",
    "StepInputs": "metrale._arena._step",
    "DecodeMetaLayout": "metrale._sizing.decode_meta",
    "MoeFp8Scratch": "metrale._sizing.moe",
    "Target": "metrale._sizing.target",
    "HostBackend": "metrale._backends._host_backend",
    "CudaBackend": "metrale._backends.cuda",
    "ScratchSpaceManager": "metrale._backends._scratch",
    "ScratchSpace": "metrale._backends._scratch",
    "ScratchStats": "metrale._backends._scratch",
    "MetraleError": "metrale._base.errors",
    "OutOfMemoryError": "metrale._base.errors",
    "ConfigWarning": "metrale._base.errors",
    "GATEUP_FUSED_MAX_M": "metrale._sizing.sizes",
    "DECODE_META_MIN_ROWS": "metrale._sizing.decode_meta",
    "DECODE_META_MAX_ROWS": "metrale._sizing.decode_meta",
    "Q12_SIZING_STREAMS": "metrale._sizing.sizes",
    "VERIFY_ROW_CAP": "metrale._sizing.sizes",
    "DebugOptions": "metrale._sizing.debug",
    "stats": "metrale._arena._summary",
    "plan_layout": "metrale._sizing._layout",
    "SlabPlan": "metrale._sizing._layout",
    "fit": "metrale._integrations.fitting",
    "ArenaFit": "metrale._integrations.fitting",
}

__all__ = list(_LAZY)
# metrale/_version.py is written by the build from meson.build (the one place
# the version is set); loaded on first use like the rest.
_LAZY["__version__"] = "metrale._version"


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        # A public module path (metrale.sizes, metrale.fitting, ...), loaded on
        # first use as well: `import metrale` then `metrale.fitting.X` works.
        if not name.startswith("_"):
            try:
                return __import__(f"metrale.{name}", fromlist=["_"])
            except ModuleNotFoundError as e:
                if e.name != f"metrale.{name}":
                    raise
        raise AttributeError(f"module 'metrale' has no attribute {name!r}")
    value = getattr(__import__(mod, fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
