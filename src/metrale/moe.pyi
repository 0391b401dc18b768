from typing import SupportsIndex

from metrale._record import Record
from metrale.config import ModelConfig

__all__ = [
    'MoeFp8Layout', 'MoeFp8Scratch', 'moe_fp8_layout',
]

class MoeFp8Layout(Record):
    scale: int
    worklist: int
    counter: int
    small_worklist: int
    small_bytes: int
    small_counter: int
    bytes: int

class MoeFp8Scratch(Record):
    activation: int
    scales: int
    worklist: int
    total_tiles: int
    worklist_bytes: int
    small_worklist: int
    small_total_tiles: int
    small_worklist_bytes: int

def moe_fp8_layout(config: ModelConfig, rows: SupportsIndex) -> MoeFp8Layout: ...
