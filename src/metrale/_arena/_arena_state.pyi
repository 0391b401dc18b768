from typing import Iterator

from metrale._arena._buffer_arena import BufferArena

ABSENT: object

class ArenaState:
    @property
    def ptrs(self) -> ArenaPointers: ...

def shared_arenas() -> list[BufferArena]: ...

class ArenaPointers:
    def __iter__(self) -> Iterator[tuple[str, int]]: ...
    def __getattr__(self, name: str) -> int: ...
