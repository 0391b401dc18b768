from typing import Any

PRESETS: dict[str, dict[str, Any]]
