import os
from typing import Any, Iterable, Iterator, Sequence

from metrale._record import Record

__all__ = ["BufferSpec", "BufferSet", "ROW_RULES", "ACCESSORS", "MAX_BUFFERS", "MAX_ZERO_ALL",
           "RESERVED_NAMES"]

from metrale._spec_rules import (ACCESSORS as ACCESSORS, MAX_BUFFERS as MAX_BUFFERS,
                                 MAX_ZERO_ALL as MAX_ZERO_ALL, RESERVED_NAMES as RESERVED_NAMES,
                                 ROW_RULES as ROW_RULES, STEP_IDS as STEP_IDS,
                                 STEP_META as STEP_META)

class BufferSpec(Record):
    name: str
    dtype: str | None
    itemsize: int | None
    shape: str
    shape_exact: bool
    shape_when: str | None
    size: str | None
    formula: str
    floor: int | None
    zero_all: bool
    prefill: bool
    rows: str
    checksum: bool
    total: bool
    align: int
    accessors: tuple[str, ...]
    init_zero: bool
    holds: str
    words: str
    dtype_note: str
    families: str
    empty: str
    def __init__(self, name: str, dtype: str | None = None,
                 shape: Sequence[int | str] | str | None = None, *,
                 size: str | int | None = None, itemsize: int | None = None,
                 floor: int | None = None, zero_all: bool = False, prefill: bool = False,
                 rows: str = "whole", checksum: bool = False, total: bool = True,
                 align: int = 256, accessors: Sequence[str] = (), init_zero: bool = False,
                 shape_exact: bool | None = None, shape_when: str | None = None,
                 holds: str = "", words: str = "", dtype_note: str = "", families: str = "",
                 empty: str = "") -> None: ...
    def replace(self, **changes: Any) -> BufferSpec: ...
    def to_dict(self) -> dict[str, Any]: ...

class BufferSet:
    def __init__(self, specs: Iterable[BufferSpec] = ()) -> None: ...
    @property
    def names(self) -> tuple[str, ...]: ...
    @property
    def specs(self) -> tuple[BufferSpec, ...]: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[BufferSpec]: ...
    def __contains__(self, name: object) -> bool: ...
    def __getitem__(self, name: str) -> BufferSpec: ...
    def index(self, name: str) -> int: ...
    @property
    def groups(self) -> dict[str, tuple[str, ...]]: ...
    def without(self, names: str | Iterable[str]) -> BufferSet: ...
    def with_(self, specs: BufferSpec | Iterable[BufferSpec]) -> BufferSet: ...
    def replace(self, name: str, /, **changes: Any) -> BufferSet: ...
    def fingerprint(self) -> str: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "buffer set") -> BufferSet: ...
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BufferSet: ...
    def to_dict(self, base: BufferSet | None = None) -> dict[str, Any]: ...

def buffer_set_arg(buffers: BufferSet | None) -> BufferSet: ...
