from typing import Any, Mapping

from metrale._sizing._spec import BufferSpec
from metrale._sizing.buffers import BufferSet

__all__ = ["Growth", "first_shrinking"]

class Growth:
    def __init__(self, symbols: Mapping[str, Any]) -> None: ...
    def of(self, expr: str) -> tuple[Any, ...] | None: ...

def first_shrinking(buffers: BufferSet, symbols: Mapping[str, Any]) -> BufferSpec | None: ...
