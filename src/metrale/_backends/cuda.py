"""CudaBackend, loaded on first use so that `import metrale` stays GPU-free.

The driver calls live in the `_cuda` extension (Cython over
cuda.bindings.cydriver).  Where that extension cannot load (no cuda-bindings,
no driver), CudaBackend() raises MetraleError saying why.
"""

from .._base.errors import MetraleError

try:
    from ._cuda import CudaBackend
except ImportError as _e:  # the package still works on the host backend
    if getattr(_e, "name", None) == "metrale._backends._cuda":
        _hint = ("this metrale was built without its CUDA backend; rebuild it where "
                 "cuda-bindings and cuda.h are available (they are build requirements)")
    else:
        _hint = "install metrale[cuda] on a machine with an NVIDIA driver"
    _reason = f"{type(_e).__name__}: {_e}"

    class CudaBackend:
        """An NVIDIA GPU through the CUDA driver; unavailable in this process.

        The CUDA extension could not be loaded (no cuda-bindings, no driver,
        or a metrale built without it), so constructing it only reports why.
        Everything else in metrale works on `HostBackend`.

        Parameters
        ----------
        device : int, optional
            The device ordinal the real backend would use (default 0).

        Raises
        ------
        MetraleError
            Always, with the reason the extension could not be loaded and
            what to install or rebuild.
        """

        def __init__(self, device=0):
            raise MetraleError(
                "CudaBackend is unavailable: the CUDA extension could not be loaded "
                f"({_reason}); {_hint}")

__all__ = ["CudaBackend"]
