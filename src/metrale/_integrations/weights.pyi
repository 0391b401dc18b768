from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Union

from metrale._arena._buffer_arena import BufferArena
from metrale._backends._backend import Backend
from metrale._base._common import DTypeLike, StreamLike
from metrale._base._record import Record
from metrale._sizing.buffers import BufferSet
from metrale._sizing.config import ModelConfig
from metrale._integrations._hf_params import (SUPPORTED_MODEL_TYPES as SUPPORTED_MODEL_TYPES,
                                               hf_params as hf_params)
from metrale._integrations._safetensors import (INDEX_SUFFIX as INDEX_SUFFIX,
                                                MAX_HEADER as MAX_HEADER,
                                                SAFETENSORS_DTYPES as SAFETENSORS_DTYPES,
                                                SafetensorsEntry as SafetensorsEntry,
                                                _Path, read_safetensors as read_safetensors)

__all__ = ["Param", "WeightSet", "LoadStats", "SafetensorsEntry", "SAFETENSORS_DTYPES",
           "MAX_HEADER", "INDEX_SUFFIX", "DEFAULT_ALIGN", "weight_set", "read_safetensors",
           "weight_arena", "load", "hf_params", "SUPPORTED_MODEL_TYPES"]

DEFAULT_ALIGN: Final[int]

_Described = Union[tuple[DTypeLike, Sequence[int]], Any]

class Param(Record):
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def offset(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def __init__(self, name: str, dtype: str, shape: tuple[int, ...], offset: int,
                 nbytes: int) -> None: ...

class LoadStats(Record):
    @property
    def params(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def copies(self) -> int: ...
    def __init__(self, params: int, nbytes: int, copies: int) -> None: ...

class WeightSet:
    params: tuple[Param, ...]
    buffer: str
    tag: str
    wake: str
    align: int
    nbytes: int
    buffers: BufferSet
    def __init__(self, described: Sequence[tuple[str, str, tuple[int, ...]]], *,
                 align: int = ..., buffer: str = ..., tag: str = ...,
                 wake: str = ...) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Param]: ...
    def __contains__(self, name: object) -> bool: ...
    def __getitem__(self, name: str) -> Param: ...
    @property
    def names(self) -> tuple[str, ...]: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

def weight_set(params: Mapping[str, _Described] | _Path | Sequence[_Path] | Any, *,
               align: int = ..., buffer: str = ..., tag: str = ...,
               wake: str = ...) -> WeightSet: ...
def weight_arena(ws: WeightSet, gpu: Backend, *, config: ModelConfig | None = ...,
                 exportable: bool = ...) -> BufferArena: ...
def load(arena: BufferArena, ws: WeightSet,
         source: Mapping[str, Any] | _Path | Sequence[_Path], *,
         stream: StreamLike = ...) -> LoadStats: ...
