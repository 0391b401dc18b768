"""Exceptions raised by metrale.

Bad arguments raise the built-in TypeError (wrong type) and ValueError (value
out of range), each naming the argument.  The two exception classes here are
for what goes wrong beyond the arguments; `ConfigWarning` reports a model
config that was read but not understood whole.
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


class ConfigWarning(UserWarning):
    """A Hugging Face ``config.json`` that metrale did not understand whole.

    Issued by `ModelConfig.from_hf_config` for each config key that looks
    like a model dimension but is not read (the sizes may be too small for
    the model), and for a ``model_type`` that is not a known family (read
    with the standard keys).  ``from_hf_config(..., strict=True)`` raises
    ValueError instead; ``warnings.filterwarnings("error",
    category=ConfigWarning)`` turns every one into an exception.

    Parameters
    ----------
    message : str
        What was not understood, naming the key.
    key : str, optional
        The config key (``"model_type"`` for the family).

    Attributes
    ----------
    key : str or None
        As given.
    """

    def __init__(self, message, key=None):
        super().__init__(message)
        self.key = key

    def __reduce__(self):
        return (type(self), (str(self), self.key))
