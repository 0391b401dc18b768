from collections.abc import Mapping

from metrale._backends._backend import Backend
from metrale._integrations.weights import WeightSet

__all__ = ["check_state"]

def check_state(ws: WeightSet, state: Mapping[str, object], base: int, where: str, gpu: Backend,
                dtypes: dict[object, str]) -> list[tuple[int, int, int, int]]: ...
