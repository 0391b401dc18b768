"""Stubs of metrale._integrations._checkpoint_driver (the driver's checkpoint calls on one pid)."""

from typing import Final, Literal, Mapping, SupportsIndex, TypedDict

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
