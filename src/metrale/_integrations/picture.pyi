from typing import SupportsIndex

from metrale._arena._buffer_arena import BufferArena
from metrale._integrations._memory_pictures import (offload_svg as offload_svg,
                                                    pool_svg as pool_svg, tp_svg as tp_svg)
from metrale._integrations._pictures import fit_svg as fit_svg, states_svg as states_svg
from metrale._sizing._layout import SlabPlan
from metrale._sizing.sizes import BufferSizes
from metrale._sizing.target import Target

__all__ = ['fit_svg', 'offload_svg', 'pool_svg', 'render_svg', 'states_svg', 'tp_svg']

def render_svg(plan: SlabPlan, sizes: BufferSizes | None = None, *, tokens: SupportsIndex,
               model: str, target: Target | None = None,
               model_type: str | None = None) -> str: ...
