from typing import SupportsIndex

from metrale._layout import SlabPlan
from metrale.sizes import BufferSizes
from metrale.target import Target

__all__ = ['render_svg']

def render_svg(layout: SlabPlan, sizes: BufferSizes, *, target: Target, tokens: SupportsIndex,
               model: str, model_type: str) -> str: ...
