from typing import SupportsIndex

__all__ = ["SIZE_UNITS", "parse_size"]

SIZE_UNITS: dict[str, int]

def parse_size(value: SupportsIndex | str, name: str = ...) -> int: ...
