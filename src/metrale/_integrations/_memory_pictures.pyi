from typing import Iterable, Sequence

from metrale._arena._buffer_arena import BufferArena

__all__ = ['offload_svg', 'pool_svg', 'tp_svg']

def offload_svg(arena: BufferArena, *, offload: Iterable[str] = (),
                keep: Iterable[str] = ()) -> str: ...
def pool_svg(arena: BufferArena) -> str: ...
def tp_svg(arenas: BufferArena | Sequence[BufferArena]) -> str: ...
