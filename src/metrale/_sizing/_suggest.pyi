from typing import Iterable

__all__ = ["near_names"]

def near_names(name: str, names: Iterable[str], n: int = 3) -> list[str]: ...
