from typing import Any, Callable, Sequence

import numpy as np
import numpy.typing as npt

from metrale._base._record import Record
from metrale._sizing._spec import BufferSpec
from metrale._sizing.decode_meta import DecodeMetaLayout

__all__ = ["StepPlan", "plan_step", "check_array", "fill_arrays"]

BY_ROLE: tuple[str, ...]

class StepPlan(Record):
    regions: dict[str, tuple[str, int | None, tuple[int, ...]]]
    alias: dict[str, str]
    live: list[tuple[int, int]]
    lo: int
    hi: int
    count_at: int
    layout: DecodeMetaLayout | None
    max_blocks: int

def plan_step(steps: Sequence[tuple[BufferSpec, int, int]], max_batch_tokens: int,
              own_shape: Callable[[str], tuple[int, ...] | None], layout: DecodeMetaLayout,
              limits: tuple[int, ...] | None, max_blocks: int | None) -> StepPlan: ...
def check_array(name: str, value: Any, dtype: str, shape: tuple[int, ...],
                arg: str | None = None) -> npt.NDArray[np.generic]: ...
def fill_arrays(regions: dict[str, tuple[str, int | None, tuple[int, ...]]],
                alias: dict[str, str], given: list[tuple[str, Any]], tokens: Any
                ) -> tuple[list[tuple[str, npt.NDArray[np.generic]]], int]: ...
