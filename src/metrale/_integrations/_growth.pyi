from typing import Mapping, SupportsIndex

from metrale._sizing.buffers import BufferSet
from metrale._sizing.config import ModelConfig
from metrale._sizing.target import Target

__all__ = ["growth", "growth_span"]

def growth(config: ModelConfig, max_batch_tokens: SupportsIndex, max_seq_len: SupportsIndex,
           kv_block_size: SupportsIndex, max_batch_size: SupportsIndex, *,
           tp_size: SupportsIndex = ..., env: Mapping[str, str] | None = ...,
           target: Target | None = ...,
           buffers: BufferSet | None = ...) -> list[tuple[str, int, int]]: ...
def growth_span(max_batch_tokens: SupportsIndex) -> tuple[int, int]: ...
