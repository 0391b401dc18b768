"""Stubs of metrale._integrations.checkpoint (process checkpoints of an engine)."""

from typing import Iterable, Mapping, SupportsIndex

from metrale._arena._buffer_arena import BufferArena

__all__ = ["RUNNING", "LOCKED", "CHECKPOINTED", "FAILED", "STATES", "DEFAULT_LOCK_TIMEOUT",
           "DEFAULT_TIMEOUT", "QUERY_TIMEOUT", "driver_info", "state", "restore_thread_id", "lock",
           "checkpoint", "restore", "unlock", "suspend", "resume", "prepare", "finish"]

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

def suspend(pids: SupportsIndex | Iterable[SupportsIndex], *, lock_timeout: float = ...,
            timeout: float = ...) -> dict[str, float]: ...
def resume(pids: SupportsIndex | Iterable[SupportsIndex], *, timeout: float = ...,
           gpu_map: Mapping[str | bytes, str | bytes] | None = None) -> dict[str, float]: ...
def prepare(arenas: Iterable[BufferArena] | None = None, *,
            sleep: bool | Mapping[str, Iterable[str]] = False) -> list[BufferArena]: ...
def finish(arenas: Iterable[BufferArena] | None = None, *,
           timeout: float = ...) -> list[BufferArena]: ...
