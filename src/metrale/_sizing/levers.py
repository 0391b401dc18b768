"""The environment levers: the only variables `BufferSizes.from_config` reads.

Each lever sizes buffers that only some engine paths use (keep-packed GGUF Q2
weights, row-wise FP8 GDN weights) or changes a launch policy the workspace
must match (split-K decode attention).  They are read from the ``env`` mapping
passed to `BufferSizes.from_config` (``os.environ`` when it is None) at call
time.  This module is the one list of them: the sizing code, ``metrale plan
--help``, the plan's report and the documentation all read it.
"""

from .._base._record import Record

__all__ = ["Lever", "LEVERS", "LEVER_NAMES", "lever_on", "quantization_levers"]


class Lever(Record):
    """One environment lever.

    Attributes
    ----------
    name : str
        The environment variable.
    buffers : tuple of str
        The buffers whose size it changes.
    effect : str
        What it does, in one sentence.
    rule : str
        How its value is read.
    """

    __slots__ = ("name", "buffers", "effect", "rule")


_EXACT_ONE = 'on iff the value is exactly "1" (no trimming, no case folding)'

LEVERS = (
    Lever("METRALE_GGUF_NATIVE_Q2", ("q2_dequant_scratch",),
          "sizes q2_dequant_scratch, the BF16 buffer each keep-packed GGUF Q2_0 projection "
          "is dequantized into", _EXACT_ONE),
    Lever("METRALE_GGUF_NATIVE_Q2_MMQ", ("q2_act_q8",),
          "sizes q2_act_q8, the q8_1 activations of the keep-packed Q2_0 MMQ prefill",
          _EXACT_ONE),
    Lever("METRALE_FP8_ROWWISE", ("ssm_rowwise_w_bf16",),
          "sizes ssm_rowwise_w_bf16, the slab for BF16 copies of each GDN layer's row-wise "
          "FP8 in_proj_qkvz and out_proj weights (carved by take_ssm_rowwise_w_bf16)",
          _EXACT_ONE + "; when the variable is absent, a row-wise FP8 quantization_config "
          "(ModelConfig.quantization == 'fp8-rowwise') turns it on"),
    Lever("METRALE_ATTN_DECODE_SPLITK", ("splitk_workspace",),
          "overrides the split-K policy of the target, and so the size of splitk_workspace",
          "'legacy' or 'auto'; '0', 'off', 'false', 'no' pin 1 split; a count n >= 1 pins "
          "min(n, 16); anything else keeps the target's policy (trimmed, case folded)"),
)

LEVER_NAMES = tuple(lv.name for lv in LEVERS)

# ModelConfig.quantization -> the lever it stands for when the variable is absent.
_QUANTIZATION_LEVERS = {"fp8-rowwise": "METRALE_FP8_ROWWISE"}


def quantization_levers(config):
    """The lever names `config.quantization` turns on.

    Parameters
    ----------
    config : ModelConfig
        A model shape; its ``quantization`` comes from quantization_config.

    Returns
    -------
    tuple of str
        The levers (empty when the quantization needs none).
    """
    lever = _QUANTIZATION_LEVERS.get(config.quantization)
    return (lever,) if lever else ()


def lever_on(name, env, config=None):
    """Whether the on/off lever `name` is on for `env` (and `config`).

    A variable present in `env` decides alone: on iff its value is exactly
    ``"1"``.  Absent, the lever follows `config`'s quantization (see
    `quantization_levers`).

    Parameters
    ----------
    name : str
        One of the on/off levers of `LEVERS`.
    env : Mapping[str, str]
        The environment read (``os.environ`` or a dict).
    config : ModelConfig, optional
        The model, for its quantization.

    Returns
    -------
    bool
    """
    value = env.get(name)
    if value is not None:
        return value == "1"
    return config is not None and name in quantization_levers(config)
