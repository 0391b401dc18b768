from typing import SupportsIndex

__all__ = [
    'check_index', 'U64_MAX',
]

U64_MAX: int

def check_index(value: SupportsIndex, name: str, minimum: int = ..., maximum: int = ...) -> int: ...
