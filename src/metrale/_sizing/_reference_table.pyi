from typing import Any

__all__ = ["RECORDS"]

RECORDS: tuple[dict[str, Any], ...]
