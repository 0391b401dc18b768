from metrale.buffers import BufferSet

__all__ = ["REFERENCE"]

REFERENCE: BufferSet
