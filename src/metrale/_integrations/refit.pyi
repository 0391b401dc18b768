import os
from collections.abc import Mapping
from typing import Any, Final, Union

from metrale._arena._buffer_arena import BufferArena
from metrale._backends._backend import Backend
from metrale._base._common import StreamLike
from metrale._integrations.weights import LoadStats, WeightSet

__all__ = ["WeightExport", "WeightImport", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT: Final[float]

_Path = Union[str, os.PathLike[str]]

class WeightExport:
    arena: BufferArena
    ws: WeightSet
    path: str
    def __init__(self, arena: BufferArena, ws: WeightSet, path: _Path) -> None: ...
    def sync(self, *, timeout: float = ...) -> int: ...
    def close(self) -> None: ...
    def __enter__(self) -> WeightExport: ...
    def __exit__(self, *exc: object) -> None: ...
    def __del__(self) -> None: ...

class WeightImport:
    gpu: Backend
    path: str
    ws: WeightSet | None
    epoch: int | None
    def __init__(self, path: _Path, gpu: Backend, *, timeout: float = ...) -> None: ...
    def sync(self, state: Mapping[str, Any], *, stream: StreamLike = None,
             timeout: float = ...) -> LoadStats: ...
    def close(self) -> None: ...
    def __enter__(self) -> WeightImport: ...
    def __exit__(self, *exc: object) -> None: ...
