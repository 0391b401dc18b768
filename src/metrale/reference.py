"""REFERENCE: the reference engine's 46 buffers, and the default of every
``buffers=`` argument.

The records are written once, as data, in metrale/_reference_table.py; the
set layer makes the `BufferSet` from them (`metrale.buffers.reference_set`).
This module publishes it and resolves ``buffers=None`` to it
(`buffer_set_arg`) for the APIs that take a set: the sizing, the catalogue,
the arena and `fit`.  The set layer itself never defaults to it.
"""

from .buffers import BufferSet, reference_set

__all__ = ["REFERENCE"]

REFERENCE = reference_set()


def buffer_set_arg(buffers):
    """The set a ``buffers=`` argument names: None means `REFERENCE`.

    Parameters
    ----------
    buffers : BufferSet or None
        The argument.

    Returns
    -------
    BufferSet

    Raises
    ------
    TypeError
        `buffers` is neither a BufferSet nor None.
    """
    if buffers is None:
        return REFERENCE
    if not isinstance(buffers, BufferSet):
        raise TypeError(f"buffers must be a BufferSet or None, got {type(buffers).__name__}")
    return buffers
