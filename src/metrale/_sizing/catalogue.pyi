from typing import Any, Mapping, SupportsIndex

from metrale._base._record import Record
from metrale._sizing.buffers import BufferSet, BufferSpec
from metrale._sizing.config import ModelConfig
from metrale._sizing.formulas import (SYMBOLS as SYMBOLS, TERMS as TERMS, Symbol as Symbol,
                                      Term as Term)
from metrale._sizing.sizes import BufferSizes
from metrale._sizing.target import Target

__all__ = [
    'Entry', 'Symbol', 'Term', 'Dependencies', 'CATALOGUE', 'SYMBOLS', 'TERMS',
    'DTYPE_ITEMSIZE', 'DEFAULT_LIMITS', 'symbols', 'evaluate', 'shape_of', 'dependencies',
    'membership', 'levers_of', 'terms_of', 'explain',
]

DTYPE_ITEMSIZE: dict[str, int]
DEFAULT_LIMITS: tuple[int, int, int, int]

Entry = BufferSpec

class Dependencies(Record):
    fields: tuple[str, ...]
    limits: tuple[str, ...]
    target: tuple[str, ...]
    levers: tuple[str, ...]

CATALOGUE: dict[str, BufferSpec]

def symbols(config: ModelConfig, max_batch_tokens: SupportsIndex, max_seq_len: SupportsIndex,
            kv_block_size: SupportsIndex, max_batch_size: SupportsIndex,
            target: Target | None = None,
            env: Mapping[str, str] | None = None, *,
            tp_size: SupportsIndex = ...) -> dict[str, Any]: ...
def evaluate(name: str, values: Mapping[str, Any], *, buffers: BufferSet | None = None) -> int: ...
def shape_of(name: str, values: Mapping[str, Any], *, buffers: BufferSet | None = None) -> tuple[int, ...] | None: ...
def terms_of(name: str, *, buffers: BufferSet | None = None) -> tuple[str, ...]: ...
def dependencies(name: str, *, buffers: BufferSet | None = None) -> Dependencies: ...
def membership(name: str, *, buffers: BufferSet | None = None) -> dict[str, Any]: ...
def levers_of(name: str, *, buffers: BufferSet | None = None) -> tuple[str, ...]: ...
def explain(name: str, sizes: BufferSizes | None = None, config: ModelConfig | None = None, *,
            max_batch_tokens: SupportsIndex | None = None,
            max_seq_len: SupportsIndex | None = None,
            kv_block_size: SupportsIndex | None = None,
            max_batch_size: SupportsIndex | None = None,
            target: Target | None = None,
            env: Mapping[str, str] | None = None,
            buffers: BufferSet | None = None) -> str: ...
