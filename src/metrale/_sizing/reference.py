"""REFERENCE: the reference engine's 46 buffers, and the default of every
``buffers=`` argument.

The records are written once, as data, in metrale/_sizing/_reference_table.py; this
module makes the `BufferSet` from them, registers it as the ``"reference"``
base of buffers files, and resolves ``buffers=None`` to it (`buffer_set_arg`)
for the APIs that take a set: the sizing, the catalogue, the arena and `fit`.
The set layer itself never imports or defaults to it.
"""

from ._reference_table import RECORDS
from ._spec import BufferSpec
from .buffers import BufferSet, register_base

__all__ = ["REFERENCE"]

# Unchecked, for a cheap import: tests/test_buffers.py checks that each record is
# what the checking constructor makes of it.
REFERENCE = BufferSet._trusted([BufferSpec._trusted(**r) for r in RECORDS])
register_base("reference", REFERENCE)


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
