from typing import SupportsIndex

U64_MAX: int

def check_index(value: SupportsIndex, name: str, minimum: int = ..., maximum: int = ...) -> int: ...
