from typing import Final

MAX_TIMEOUT: Final[float]
