"""Stubs of metrale._integrations.checkpoint (process checkpoints of an engine)."""

from typing import Iterable, Mapping

from metrale._arena._buffer_arena import BufferArena
from metrale._base._record import Record

__all__ = ["RUNNING", "LOCKED", "CHECKPOINTED", "FAILED", "STATES", "DEFAULT_LOCK_TIMEOUT",
           "DEFAULT_TIMEOUT", "QUERY_TIMEOUT", "driver_info", "state", "restore_thread_id", "lock",
           "checkpoint", "restore", "unlock", "suspend", "resume", "prepare", "finish",
           "Prepared"]

from metrale._integrations._checkpoint_driver import (CHECKPOINTED as CHECKPOINTED,
                                                      DEFAULT_LOCK_TIMEOUT as DEFAULT_LOCK_TIMEOUT,
                                                      DEFAULT_TIMEOUT as DEFAULT_TIMEOUT,
                                                      FAILED as FAILED, LOCKED as LOCKED,
                                                      QUERY_TIMEOUT as QUERY_TIMEOUT,
                                                      RUNNING as RUNNING, STATES as STATES,
                                                      checkpoint as checkpoint,
                                                      driver_info as driver_info, lock as lock,
                                                      restore as restore,
                                                      restore_thread_id as restore_thread_id,
                                                      state as state, unlock as unlock)
from metrale._integrations._checkpoint_processes import resume as resume, suspend as suspend

class Prepared(Record):
    def __init__(self, arenas: tuple[BufferArena, ...], committed_bytes: int,
                 resident_bytes: int, kept_bytes: int, offloaded_bytes: int) -> None: ...
    @property
    def arenas(self) -> tuple[BufferArena, ...]: ...
    @property
    def committed_bytes(self) -> int: ...
    @property
    def resident_bytes(self) -> int: ...
    @property
    def kept_bytes(self) -> int: ...
    @property
    def offloaded_bytes(self) -> int: ...
    @property
    def released_bytes(self) -> int: ...
    @property
    def discarded_bytes(self) -> int: ...
    def log_line(self, suspended: Mapping[str, object] | None = None) -> str: ...

def prepare(arenas: Iterable[BufferArena] | None = None, *,
            sleep: bool | Mapping[str, Iterable[str]] = False) -> Prepared: ...
def finish(arenas: Iterable[BufferArena] | None = None, *,
           timeout: float = ...) -> list[BufferArena]: ...
