"""MINIMAL: a small engine's own buffer set, to start yours from.

The per-pass buffers of a plain dense decoder (Llama-style: grouped-query
attention, a gated MLP, BF16 activations) with a paged KV cache kept outside
the arena, as an engine written from scratch holds them, and the step inputs
that engine uploads every step (nano-vllm's: int64 token ids and positions,
the slot mapping, context lengths and block tables), with an int32 token
count so that one CUDA graph serves every batch size (docs/step-inputs.md).
Sixteen buffers; the quick start (docs/quickstart.md) declares, fits, builds,
steps and sleeps it.

Written here once.  The same set as a buffers file, ``minimal.toml`` beside
this module (`TOML_PATH`), is generated from it (tools/gen_docs.py) and
loads back equal: ``BufferSet.load(TOML_PATH) == MINIMAL``.  ``metrale
plan --buffers`` reads such a file.
"""

import os

from .buffers import BufferSet, BufferSpec

__all__ = ["MINIMAL", "TOML_PATH"]


def _spec(name, dtype, shape, holds, **kw):
    return BufferSpec(name, dtype, shape, holds=holds, **kw)


MINIMAL = BufferSet([
    # the step inputs: uploaded every step by one copy (StepInputs)
    _spec("input_ids", "int64", ["M"], "The step's token ids.", step="token_ids"),
    _spec("num_tokens", "int32", [1], "The step's token count, read on the device by the "
          "zeroing and the kernels.", step="count"),
    _spec("positions", "int64", ["M"], "Each token's position (RoPE).", step="positions"),
    _spec("slot_mapping", "int64", ["M"], "Each token's slot in the paged KV cache.",
          step="metadata"),
    _spec("context_lens", "int32", ["max_batch_size"], "Each sequence's length.",
          step="metadata"),
    _spec("block_tables", "int32", ["max_batch_size", "B"], "Each sequence's KV blocks.",
          step="metadata"),
    # the forward pass: token-major rows, cleared up to the step's tokens
    _spec("hidden", "bfloat16", ["M", "H"], "The residual stream between layers.",
          zero_all=True, rows="M"),
    _spec("residual", "bfloat16", ["M", "H"], "The running residual sum.", zero_all=True,
          rows="M"),
    _spec("normed", "bfloat16", ["M", "H"], "RMS-norm output, the projections' input."),
    _spec("qkv", "bfloat16", ["M", "(Hq + 2*Hkv)*D"], "The fused Q, K and V projection."),
    _spec("attn_out", "bfloat16", ["M", "Hq*D"], "Attention output, before o_proj."),
    _spec("gate_up", "bfloat16", ["M", "2*I"], "The fused gate and up projection."),
    _spec("mlp_act", "bfloat16", ["M", "I"], "SiLU(gate) * up, down_proj's input."),
    # sampling: one row per sequence
    _spec("logits", "float32", ["max_batch_size", "V"], "The last token's logits of each "
          "sequence, FP32.", zero_all=True),
    _spec("next_tokens", "int64", ["max_batch_size"], "The sampled token of each sequence."),
    _spec("gemm_workspace", None, None, "cuBLASLt's workspace (32 MiB: what cuBLAS takes "
          "on Hopper).", size=32 << 20),
])

# The buffers-file form of MINIMAL, shipped beside this module.
TOML_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "minimal.toml")
