"""The grouped FP8 MoE slab (ARENA.md §4.9): its layout for one (config, rows),
and the device addresses an arena gives for it (``MoeFp8Scratch``)."""

from ._common import check_index
from ._math import U64_MAX, cdiv, ceil_to
from ._record import Record
from .config import ModelConfig

__all__ = ["MoeFp8Layout", "MoeFp8Scratch", "moe_fp8_layout"]


class MoeFp8Layout(Record):
    """Byte offsets inside the slab, and its size ``bytes``, for one (config, rows)."""

    __slots__ = ("scale", "worklist", "counter", "small_worklist", "small_bytes",
                 "small_counter", "bytes")


class MoeFp8Scratch(Record):
    """Device addresses of the FP8 MoE regions for one (config, rows), from
    ``BufferArena.moe_fp8_scratch``."""

    __slots__ = ("activation", "scales", "worklist", "total_tiles", "worklist_bytes",
                 "small_worklist", "small_total_tiles", "small_worklist_bytes")
    _hex = ("activation", "scales", "worklist", "total_tiles", "small_worklist",
            "small_total_tiles")


def moe_fp8_layout(config, rows):
    """The MoE FP8 slab layout for `rows` tokens of `config`; all zero for a dense model."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    rows = check_index(rows, "rows")
    c = config
    E, H, Im = c.num_experts, c.hidden_size, c.moe_intermediate_size
    if E == 0:
        return MoeFp8Layout(0, 0, 0, 0, 0, 0, 0)
    expanded = rows * c.num_experts_per_tok
    shared_k = max(H, c.shared_expert_intermediate_size)
    act = max(rows * shared_k, expanded * Im)
    scl = 4 * max(rows * cdiv(shared_k, 128), expanded * cdiv(Im, 128))
    width_tiles = cdiv(max(H, Im), 64)
    items = (cdiv(expanded, 128) + E + 1) * width_tiles
    scale = ceil_to(act, 256)
    worklist = scale + ceil_to(scl, 256)
    counter = worklist + ceil_to(8 * items, 256)
    # Only E = 256 is qualified for the adaptive small-worklist dispatch.
    small_bytes = E * width_tiles * 8 if E == 256 else 0
    if small_bytes > U64_MAX:
        raise ValueError("adaptive FP8 small worklist size overflow "
                         f"(E={E}, max(hidden, moe_intermediate)={max(H, Im)})")
    if small_bytes:
        small_worklist = ceil_to(counter + 4, 256)
        small_counter = small_worklist + ceil_to(small_bytes, 256)
        nbytes = small_counter + 4
    else:
        small_worklist = small_counter = 0
        nbytes = counter + 4
    return MoeFp8Layout(scale, worklist, counter, small_worklist, small_bytes,
                        small_counter, nbytes)
