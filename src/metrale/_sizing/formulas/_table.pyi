from typing import Any, Callable

from metrale._base._record import Record

__all__ = ["Symbol", "Term", "SYMBOLS", "TERMS", "ALIASES", "HELPERS", "HELPER_FUNCTIONS",
           "CALLABLE", "SWITCHES", "NOT_INTEGER", "USABLE"]

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

SWITCHES: tuple[tuple[str, str], ...]
SYMBOLS: tuple[Symbol, ...]
TERMS: tuple[Term, ...]
HELPER_FUNCTIONS: dict[str, Callable[..., int]]
HELPERS: tuple[str, ...]
CALLABLE: dict[str, Callable[..., Any]]
ALIASES: dict[str, str]
NOT_INTEGER: frozenset[str]
USABLE: frozenset[str]
