"""Exceptions raised by metrale."""


class MetraleError(Exception):
    """A contract failure the library reports (slab absent or exhausted, FP8 MoE
    scratch does not fit, scratch thread limit, foreign backend, released arena,
    CUDA driver errors)."""


class OutOfMemoryError(MetraleError, MemoryError):
    """An allocation the backend refused."""
