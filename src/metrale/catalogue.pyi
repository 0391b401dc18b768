from typing import Any, Mapping, SupportsIndex

from metrale._record import Record
from metrale.config import ModelConfig
from metrale.sizes import BufferSizes, Target

__all__ = [
    'Entry', 'Symbol', 'Term', 'Dependencies', 'CATALOGUE', 'SYMBOLS', 'TERMS',
    'DTYPE_ITEMSIZE', 'DEFAULT_LIMITS', 'symbols', 'evaluate', 'shape_of', 'dependencies',
    'membership', 'levers_of', 'terms_of', 'explain',
]

DTYPE_ITEMSIZE: dict[str, int]
DEFAULT_LIMITS: tuple[int, int, int, int]

class Entry(Record):
    name: str
    holds: str
    dtype: str | None
    itemsize: int | None
    dtype_note: str
    shape: str
    shape_exact: bool
    shape_when: str | None
    formula: str
    words: str
    floor: int | None
    families: str
    empty: str

class Symbol(Record):
    name: str
    meaning: str
    fields: tuple[str, ...]
    limits: tuple[str, ...]
    target: tuple[str, ...]
    levers: tuple[str, ...]

class Term(Record):
    name: str
    expr: str
    meaning: str

class Dependencies(Record):
    fields: tuple[str, ...]
    limits: tuple[str, ...]
    target: tuple[str, ...]
    levers: tuple[str, ...]

CATALOGUE: dict[str, Entry]
SYMBOLS: tuple[Symbol, ...]
TERMS: tuple[Term, ...]

def symbols(config: ModelConfig, max_batch_tokens: SupportsIndex, max_seq_len: SupportsIndex,
            kv_block_size: SupportsIndex, max_batch_size: SupportsIndex,
            target: Target | None = None,
            env: Mapping[str, str] | None = None) -> dict[str, Any]: ...
def evaluate(name: str, values: Mapping[str, Any]) -> int: ...
def shape_of(name: str, values: Mapping[str, Any]) -> tuple[int, ...] | None: ...
def terms_of(name: str) -> tuple[str, ...]: ...
def dependencies(name: str) -> Dependencies: ...
def membership(name: str) -> dict[str, Any]: ...
def levers_of(name: str) -> tuple[str, ...]: ...
def explain(name: str, sizes: BufferSizes | None = None, config: ModelConfig | None = None, *,
            max_batch_tokens: SupportsIndex | None = None,
            max_seq_len: SupportsIndex | None = None,
            kv_block_size: SupportsIndex | None = None,
            max_batch_size: SupportsIndex | None = None,
            target: Target | None = None,
            env: Mapping[str, str] | None = None) -> str: ...
