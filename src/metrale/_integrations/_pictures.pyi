from typing import Callable, SupportsIndex

from metrale._arena._buffer_arena import BufferArena
from metrale._integrations.fitting import ArenaFit

__all__ = ['fit_svg', 'states_svg']

def _head(w: Callable[[str], object], height: int, title: str) -> None: ...
def fit_svg(fit: ArenaFit, *, weights: SupportsIndex = 0, model: str | None = None) -> str: ...
def states_svg(arena: BufferArena | None = None) -> str: ...
