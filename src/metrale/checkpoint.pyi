"""Stubs of metrale.checkpoint (process checkpoints of an engine)."""

from typing import Final, Iterable, Literal, Mapping, SupportsIndex, TypedDict

from metrale._arena import BufferArena

__all__ = ["RUNNING", "LOCKED", "CHECKPOINTED", "FAILED", "STATES", "DEFAULT_LOCK_TIMEOUT",
           "DEFAULT_TIMEOUT", "QUERY_TIMEOUT", "driver_info", "state", "restore_thread_id", "lock",
           "checkpoint", "restore", "unlock", "suspend", "resume", "prepare", "finish"]

_State = Literal["running", "locked", "checkpointed", "failed"]

RUNNING: Final = "running"
LOCKED: Final = "locked"
CHECKPOINTED: Final = "checkpointed"
FAILED: Final = "failed"
STATES: tuple[str, str, str, str]
DEFAULT_LOCK_TIMEOUT: float
DEFAULT_TIMEOUT: float
QUERY_TIMEOUT: float

class _DriverInfo(TypedDict):
    driver: str | None
    cuda: int
    gpu_map: bool

def driver_info() -> _DriverInfo: ...
def state(pid: SupportsIndex, *, timeout: float = ...) -> _State: ...
def restore_thread_id(pid: SupportsIndex, *, timeout: float = ...) -> int: ...
def lock(pid: SupportsIndex, *, timeout: float = ...) -> None: ...
def checkpoint(pid: SupportsIndex, *, timeout: float = ...) -> None: ...
def restore(pid: SupportsIndex, *, timeout: float = ...,
            gpu_map: Mapping[str | bytes, str | bytes] | None = None) -> None: ...
def unlock(pid: SupportsIndex, *, timeout: float = ...) -> None: ...
def suspend(pids: SupportsIndex | Iterable[SupportsIndex], *, lock_timeout: float = ...,
            timeout: float = ...) -> dict[str, float]: ...
def resume(pids: SupportsIndex | Iterable[SupportsIndex], *, timeout: float = ...,
           gpu_map: Mapping[str | bytes, str | bytes] | None = None) -> dict[str, float]: ...
def prepare(arenas: Iterable[BufferArena] | None = None) -> list[BufferArena]: ...
def finish(arenas: Iterable[BufferArena] | None = None, *,
           timeout: float = ...) -> list[BufferArena]: ...
