"""The grouped FP8 MoE slab: its layout for one (config, rows), and the device
addresses an arena gives for it (``MoeFp8Scratch``).

One arena-owned slab, the ``moe_fp8_scratch`` buffer, is reused in turn by
every grouped FP8 MoE layer: the FP8 activations, their scales, the work list
of 128 x 64 tiles and its tile counter, and, for models with exactly 256
experts, a second (small) work list and counter for the adaptive dispatch.
Every region starts at a multiple of 256 bytes.  The regions are the
``moe_*`` terms of the formula language (`metrale.formulas.TERMS`), the
expressions that size the buffer: written once, read here.
"""

from .._base._common import check_index
from .._base._math import U64_MAX
from .._base._record import Record
from .config import ModelConfig
from .formulas import term_values

__all__ = ["MoeFp8Layout", "MoeFp8Scratch", "moe_fp8_layout"]


class MoeFp8Layout(Record):
    """Byte offsets of the FP8 MoE regions inside the slab, and its size.

    Made by `moe_fp8_layout`; all fields are 0 for a dense model.  The
    activations start at offset 0.

    Attributes
    ----------
    scale : int
        Offset of the activation scales (float32).
    worklist : int
        Offset of the tile work list (8 bytes per item).
    counter : int
        Offset of the tile counter (one 4-byte int).
    small_worklist : int
        Offset of the adaptive small work list, or 0 when there is none.
    small_bytes : int
        Bytes of the adaptive small work list; 0 unless the model has
        exactly 256 experts.
    small_counter : int
        Offset of the small work list's counter (one 4-byte int), or 0.
    bytes : int
        Size of the whole slab for these rows: 4 bytes past the last counter.
    """

    __slots__ = ("scale", "worklist", "counter", "small_worklist", "small_bytes",
                 "small_counter", "bytes")


class MoeFp8Scratch(Record):
    """Device addresses of the FP8 MoE regions for one (config, rows).

    Returned by ``BufferArena.moe_fp8_scratch(config, rows)``: the regions of
    `MoeFp8Layout` placed at the arena's ``moe_fp8_scratch`` buffer.  The
    addresses are plain ints (0 is NULL) and stay valid until the arena is
    released, across CUDA graph replays included.  Shown in hexadecimal.

    Attributes
    ----------
    activation : int
        Address of the FP8 activations (the start of the buffer).
    scales : int
        Address of the float32 activation scales.
    worklist : int
        Address of the tile work list.
    total_tiles : int
        Address of the 4-byte tile counter the work list builder writes.
    worklist_bytes : int
        Bytes available to the work list.
    small_worklist : int
        Address of the adaptive small work list, or 0 when the model has no
        such list (it exists only for exactly 256 experts).
    small_total_tiles : int
        Address of the small work list's 4-byte counter, or 0.
    small_worklist_bytes : int
        Bytes of the small work list (0 when absent).
    """

    __slots__ = ("activation", "scales", "worklist", "total_tiles", "worklist_bytes",
                 "small_worklist", "small_total_tiles", "small_worklist_bytes")
    _hex = ("activation", "scales", "worklist", "total_tiles", "small_worklist",
            "small_total_tiles")


def moe_fp8_layout(config, rows):
    """The FP8 MoE slab layout for `rows` tokens of `config`.

    Pure integer arithmetic.  The layout for fewer rows is never larger, so a
    buffer sized for ``max_batch_tokens`` holds every smaller call.

    Parameters
    ----------
    config : ModelConfig
        The model shape: its experts, experts per token, hidden size and
        routed / shared expert widths set the region sizes.
    rows : int
        Tokens entering the MoE layer (>= 0).

    Returns
    -------
    MoeFp8Layout
        The region offsets and total ``bytes``; all zero for a dense model
        (``num_experts == 0``).

    Raises
    ------
    TypeError
        `config` is not a `ModelConfig`, or `rows` is not an int.
    ValueError
        `rows` is negative or does not fit 64 bits, or the adaptive small
        work list's size does not fit 64 bits.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    rows = check_index(rows, "rows")
    c = config
    E, H, Im = c.num_experts, c.hidden_size, c.moe_intermediate_size
    if E == 0:
        return MoeFp8Layout(0, 0, 0, 0, 0, 0, 0)
    t = term_values(c, rows, _TERMS)
    # The adaptive small work list exists for exactly 256 experts.
    if t["moe_small_bytes"] > U64_MAX:
        raise ValueError("adaptive FP8 small worklist size overflow "
                         f"(E={E}, max(hidden, moe_intermediate)={max(H, Im)})")
    if t["moe_small_bytes"]:
        small_worklist, small_counter = t["moe_small_worklist"], t["moe_small_counter"]
    else:
        small_worklist = small_counter = 0
    return MoeFp8Layout(t["moe_scale"], t["moe_worklist"], t["moe_counter"], small_worklist,
                        t["moe_small_bytes"], small_counter, t["moe_fp8_bytes"])


# The slab's regions, as the sizing formulas define them (metrale.formulas TERMS).
_TERMS = ("moe_scale", "moe_worklist", "moe_counter", "moe_small_worklist", "moe_small_bytes",
          "moe_small_counter", "moe_fp8_bytes")
