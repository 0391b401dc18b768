from typing import Any, Iterator, Mapping, TypedDict, TypeVar, final

from metrale._arena._buffer_arena import BufferArena
from metrale._arena._summary_records import (ArenaSummary as ArenaSummary,
                                              BufferInfo as BufferInfo, ClassInfo as ClassInfo,
                                              Pin as Pin)

_T = TypeVar("_T")

@final
class ArenaBuffers(Mapping[str, BufferInfo]):
    def __getitem__(self, name: str, /) -> BufferInfo: ...
    def get(self, name: str, default: _T | None = None) -> BufferInfo | _T | None: ...  # type: ignore[override]
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...

# memory_stats()'s stable keys (typing only: at run time a plain dict).
class MemoryStats(TypedDict):
    slab_bytes: int
    reserved_bytes: int
    committed_bytes: int
    peak_committed_bytes: int
    buffer_bytes: dict[str, int]
    physical_handles: int
    unreleased_handles: int
    kept_bytes: int
    host_keep_bytes: int
    offloaded_bytes: int
    host_offload_bytes: int
    host_handles: int
    exported_handles: int
    imported_handles: int
    imported_bytes: int
    live_views: int
    reserved: bool
    sleeping: bool
    released: bool
    max_batch_tokens: int
    tp_size: int
    pool_reserved_bytes: int
    pool_committed_bytes: int
    pool_in_use_bytes: int
    pool_peak_in_use_bytes: int
    pool_segments: int
    pool_offloaded_bytes: int
    pool_host_bytes: int
    classes_asleep: list[str]
    class_epochs: dict[str, int]

def stats() -> dict[str, int]: ...
