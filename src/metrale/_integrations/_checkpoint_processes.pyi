"""Stubs of metrale._integrations._checkpoint_processes (suspend and resume)."""

from typing import Iterable, Mapping, SupportsIndex, TypedDict

__all__ = ["suspend", "resume"]

class _Suspended(TypedDict):
    lock: float
    checkpoint: float
    rss_before: int | None
    rss_checkpointed: int | None

class _Resumed(TypedDict):
    restore: float
    unlock: float
    rss_after: int | None

def suspend(pids: SupportsIndex | Iterable[SupportsIndex], *, lock_timeout: float = ...,
            timeout: float = ...) -> _Suspended: ...
def resume(pids: SupportsIndex | Iterable[SupportsIndex], *, timeout: float = ...,
           gpu_map: Mapping[str | bytes, str | bytes] | None = None) -> _Resumed: ...
