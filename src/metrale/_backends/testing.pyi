from typing import Callable, SupportsIndex

from metrale._backends._host_backend import HostBackend

__all__ = ["FaultyBackend"]

OPERATIONS: tuple[str, ...]

class FaultyBackend(HostBackend):
    def inject_fault(self, op: str, nth: SupportsIndex = ...) -> None: ...
    def inject_call(self, op: str, fn: Callable[[], object], nth: SupportsIndex = ...) -> None: ...
    def clear_faults(self) -> None: ...
