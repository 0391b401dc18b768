from typing import Any

ROW_RULES: tuple[str, ...]
ACCESSORS: tuple[str, ...]
MAX_BUFFERS: int
MAX_ZERO_ALL: int
STEP_IDS: str
STEP_META: str
RESERVED_NAMES: frozenset[str]

def dims_of(text: str) -> tuple[str, ...]: ...
def check_spec(name: object, dtype: object, shape: object, size: object, itemsize: object,
               floor: object, zero_all: object, prefill: object, rows: object,
               checksum: object, total: object, align: object, accessors: object,
               init_zero: object, shape_exact: object, shape_when: object,
               text: dict[str, object]) -> dict[str, Any]: ...
