from typing import Mapping, SupportsIndex

from metrale._base._record import Record

__all__ = ["Target", "SPLITK_POLICIES", "resolve_splitk"]

SPLITK_POLICIES: tuple[str, ...]

class Target(Record):
    @property
    def sm_count(self) -> int: ...
    @property
    def splitk(self) -> str: ...
    def __init__(self, sm_count: SupportsIndex, splitk: str) -> None: ...
    @classmethod
    def reference(cls) -> Target: ...

def resolve_splitk(target: Target, env: Mapping[str, str]) -> tuple[str, int]: ...
