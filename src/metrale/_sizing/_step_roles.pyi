from typing import Any, Sequence

__all__ = ["STEP_ROLES", "STEP_IDS", "STEP_META", "STEP_FILL_NAMES", "check_step",
           "check_step_roles", "default_step"]

STEP_ROLES: dict[str, tuple[str, tuple[str, ...] | None]]
STEP_IDS: str
STEP_META: str
STEP_FILL_NAMES: frozenset[str]

def default_step(name: str) -> str: ...
def check_step(where: str, name: str, step: object, dtype: str, zero_all: bool, rows: str,
               align: int) -> str: ...
def check_step_roles(specs: Sequence[Any]) -> None: ...
