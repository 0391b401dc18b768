from metrale._sizing.buffers import BufferSet

__all__ = ["REFERENCE"]

REFERENCE: BufferSet

def buffer_set_arg(buffers: BufferSet | None) -> BufferSet: ...
