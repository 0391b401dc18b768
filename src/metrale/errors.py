"""Exceptions raised by metrale.

Bad arguments raise the built-in TypeError (wrong type) and ValueError (value
out of range), each naming the argument.  The two classes here are for what
goes wrong beyond the arguments.
"""


class MetraleError(Exception):
    """A failure the library reports beyond bad arguments.

    Raised when the arena's slab is absent or exhausted, the FP8 MoE scratch
    does not fit the arena, a scratch manager has no room for another thread,
    an operation is given a backend other than the arena's own, the arena is
    already released, or a CUDA driver call fails (the message then names the
    call and the driver's error name).
    """


class OutOfMemoryError(MetraleError, MemoryError):
    """An allocation the backend refused.

    Both a `MetraleError` and a `MemoryError`, so either ``except`` clause
    catches it.  On CUDA the message names the driver call and
    ``CUDA_ERROR_OUT_OF_MEMORY``.
    """
