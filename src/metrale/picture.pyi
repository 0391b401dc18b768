from typing import SupportsIndex

from metrale._layout import SlabPlan
from metrale.sizes import BufferSizes
from metrale.target import Target

__all__ = ['render_svg']

def render_svg(plan: SlabPlan, sizes: BufferSizes | None = None, *, tokens: SupportsIndex,
               model: str, target: Target | None = None,
               model_type: str | None = None) -> str: ...
