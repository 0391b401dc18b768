from typing import Any, Sequence

from metrale._base._record import Record

__all__ = ["BufferSpec", "POOL_NAME", "ROW_RULES", "ACCESSORS", "MAX_BUFFERS", "MAX_ZERO_ALL", "STEP_IDS",
           "STEP_META", "STEP_ROLES", "STEP_FILL_NAMES", "RESERVED_NAMES", "check_spec",
           "check_step_roles", "dims_of"]

ROW_RULES: tuple[str, ...]
ROW_WORDS: dict[str, str]
ACCESSORS: tuple[str, ...]
MAX_BUFFERS: int
MAX_ZERO_ALL: int
from metrale._sizing._step_roles import (STEP_FILL_NAMES as STEP_FILL_NAMES,
                                         STEP_IDS as STEP_IDS, STEP_META as STEP_META,
                                         STEP_ROLES as STEP_ROLES,
                                         check_step_roles as check_step_roles)
POOL_NAME: str
RESERVED_NAMES: frozenset[str]

def dims_of(text: str) -> tuple[str, ...]: ...
def check_spec(name: object, dtype: object, shape: object, size: object, itemsize: object,
               floor: object, zero_all: object, prefill: object, rows: object,
               checksum: object, total: object, align: object, accessors: object,
               init_zero: object, shape_exact: object, shape_when: object,
               text: dict[str, object], step: object = None,
               wake: object = "zero", tag: object = "default") -> dict[str, Any]: ...

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
    step: str
    holds: str
    words: str
    dtype_note: str
    families: str
    empty: str
    wake: str
    tag: str
    def __init__(self, name: str, dtype: str | None = None,
                 shape: Sequence[int | str] | str | None = None, *,
                 size: str | int | None = None, itemsize: int | None = None,
                 floor: int | None = None, zero_all: bool = False, prefill: bool = False,
                 rows: str = "whole", checksum: bool = False, total: bool = True,
                 align: int = 256, accessors: Sequence[str] = (), init_zero: bool = False,
                 shape_exact: bool | None = None, shape_when: str | None = None,
                 step: str | None = None, holds: str = "", words: str = "", dtype_note: str = "", families: str = "",
                 empty: str = "", wake: str = "zero", tag: str = "default") -> None: ...
    def replace(self, **changes: Any) -> BufferSpec: ...
    def to_dict(self) -> dict[str, Any]: ...
