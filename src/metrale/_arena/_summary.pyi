from typing import Any, Iterator, Mapping, TypedDict, TypeVar, final

from metrale._arena._buffer_arena import BufferArena
from metrale._arena._pool import PoolStats
from metrale._base._record import Record

_T = TypeVar("_T")

class BufferInfo(Record):
    def __init__(self, name: str, ptr: int, nbytes: int, offset: int | None,
                 dtype: str | None = None) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def offset(self) -> int | None: ...
    @property
    def dtype(self) -> str | None: ...

class Pin(Record):
    def __init__(self, kind: str, name: str | None, count: int) -> None: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str | None: ...
    @property
    def count(self) -> int: ...

@final
class ArenaBuffers(Mapping[str, BufferInfo]):
    def __getitem__(self, name: str, /) -> BufferInfo: ...
    def get(self, name: str, default: _T | None = None) -> BufferInfo | _T | None: ...  # type: ignore[override]
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...

class ArenaSummary(Record):
    def __init__(self, backend: str, max_batch_tokens: int, slab_bytes: int, total_bytes: int,
                 live_buffers: int, null_buffers: tuple[str, ...], zero_all: tuple[int, int],
                 zero_prefill: tuple[int, int], groups: dict[str, tuple[str, ...]],
                 levers: dict[str, str], released: bool, reserved: bool = False,
                 committed_bytes: int = 0, sleeping: bool = False,
                 guard_bytes: int = 0, unreleased_handles: int = 0,
                 max_seq_len: int | None = None, kv_block_size: int | None = None,
                 max_batch_size: int | None = None, tp_size: int = 1,
                 pool: PoolStats | None = None) -> None: ...
    @property
    def backend(self) -> str: ...
    @property
    def max_batch_tokens(self) -> int: ...
    @property
    def slab_bytes(self) -> int: ...
    @property
    def total_bytes(self) -> int: ...
    @property
    def live_buffers(self) -> int: ...
    @property
    def null_buffers(self) -> tuple[str, ...]: ...
    @property
    def zero_all(self) -> tuple[int, int]: ...
    @property
    def zero_prefill(self) -> tuple[int, int]: ...
    @property
    def groups(self) -> dict[str, tuple[str, ...]]: ...
    @property
    def levers(self) -> dict[str, str]: ...
    @property
    def released(self) -> bool: ...
    @property
    def reserved(self) -> bool: ...
    @property
    def committed_bytes(self) -> int: ...
    @property
    def sleeping(self) -> bool: ...
    @property
    def guard_bytes(self) -> int: ...
    @property
    def unreleased_handles(self) -> int: ...
    @property
    def max_seq_len(self) -> int | None: ...
    @property
    def kv_block_size(self) -> int | None: ...
    @property
    def max_batch_size(self) -> int | None: ...
    @property
    def tp_size(self) -> int: ...
    @property
    def pool(self) -> PoolStats | None: ...

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

def stats() -> dict[str, int]: ...
