import os

__all__ = ["MAX_FILE_BYTES", "MAX_DEPTH", "MAX_TABLES", "read_data"]

MAX_FILE_BYTES: int
MAX_DEPTH: int
MAX_TABLES: int

def read_data(path: str | os.PathLike[str]) -> object: ...
