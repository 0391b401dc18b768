from typing import SupportsIndex

from metrale._arena._buffer_arena import BufferArena
from metrale._sizing._layout import SlabPlan
from metrale._sizing.sizes import BufferSizes
from metrale._sizing.target import Target

__all__ = ['pool_svg', 'render_svg']

def render_svg(plan: SlabPlan, sizes: BufferSizes | None = None, *, tokens: SupportsIndex,
               model: str, target: Target | None = None,
               model_type: str | None = None) -> str: ...
def pool_svg(arena: BufferArena) -> str: ...
