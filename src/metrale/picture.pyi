from typing import Any, Mapping

__all__ = ['render_svg']

def render_svg(plan: Mapping[str, Any]) -> str: ...
