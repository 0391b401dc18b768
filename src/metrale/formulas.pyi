from typing import Any, Mapping

from metrale._record import Record
from metrale.config import ModelConfig
from metrale.sizes import Target

__all__ = ["Symbol", "Term", "SYMBOLS", "TERMS", "ALIASES", "HELPERS", "check", "names_of",
           "values", "namespace"]

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

SYMBOLS: tuple[Symbol, ...]
TERMS: tuple[Term, ...]
ALIASES: dict[str, str]
HELPERS: tuple[str, ...]

def check(expr: str, where: str) -> frozenset[str]: ...
def names_of(expr: str) -> set[str]: ...
def values(config: ModelConfig, M: int, max_seq_len: int, kv_block_size: int,
           max_batch_size: int, target: Target, env: Mapping[str, str]) -> dict[str, Any]: ...
def namespace(symbol_values: Mapping[str, Any]) -> dict[str, Any]: ...
def evaluate(expr: str, symbol_values: Mapping[str, Any]) -> Any: ...
def is_name(text: object) -> bool: ...
def evaluation_namespace(config: ModelConfig, M: int, max_seq_len: int, kv_block_size: int,
                         max_batch_size: int, target: Target,
                         env: Mapping[str, str]) -> dict[str, Any]: ...
