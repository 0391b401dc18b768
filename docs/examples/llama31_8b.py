"""A BF16 Llama-3.1-8B engine's own buffer set (docs/buffer-sets.md).

The engine runs BF16 GEMMs only, so it drops the quantized-path scratch of the
reference set (the q8_1, int8 and FP8 activation buffers and their scales, and
the slabs of the GGUF and row-wise FP8 paths), and adds two workspaces of its
own: a sampler workspace (FP32 probabilities, one row of the vocabulary per
sequence of a decode step) and a split-KV decode attention workspace (partial
outputs and log-sum-exps of up to 16 splits per sequence and query head).

    python docs/examples/llama31_8b.py              # the comparison
    python docs/examples/llama31_8b.py --svg FILE   # and the slab's picture

It prints both slabs at the same limits, builds the engine's arena on the host
backend, and shows the workspaces' pointers and sizes.  tests/test_examples.py
runs it and checks its numbers against the formulas written out.
"""

import argparse

from metrale import REFERENCE, BufferArena, BufferSizes, BufferSpec, HostBackend, ModelConfig
from metrale import plan_layout

# The limits the engine serves (those of `metrale plan` by default).
LIMITS = dict(max_batch_tokens=8192, max_seq_len=4096, kv_block_size=16, max_batch_size=32)

# The reference buffers a BF16 engine never touches: its quantized paths.
QUANTIZED = ("ffn_act_q8", "ffn_act_a", "ffn_act_scale", "ffn_act_scale_kmajor", "fp8_act",
             "fp8_act_scale", "fp8_act_scale_kmajor", "moe_fp8_scratch", "q2_dequant_scratch",
             "q2_act_q8", "ssm_rowwise_w_bf16")

SAMPLER = BufferSpec(
    "sampler_probs", "float32", ["max_batch_size", "vocab_size"],
    holds="Softmax probabilities of one decode step, one vocabulary row per sequence, "
          "sorted in place by the top-p sampler.")
SPLITKV_OUT = BufferSpec(
    "splitkv_partial", "float32", ["max_batch_size", "num_attention_heads", 16, "head_dim"],
    holds="Split-KV decode attention: each split's partial output.")
SPLITKV_LSE = BufferSpec(
    "splitkv_lse", "float32", ["max_batch_size", "num_attention_heads", 16],
    zero_all=True,          # the combine kernel reads every split; unused ones must be 0
    holds="Split-KV decode attention: each split's log-sum-exp.")

LLAMA = REFERENCE.without(QUANTIZED).with_([SAMPLER, SPLITKV_OUT, SPLITKV_LSE])


def slab(config, buffers):
    """(BufferSizes, SlabPlan) of `buffers` for `config` at LIMITS."""
    sizes = BufferSizes.from_config(config, *LIMITS.values(), env={}, buffers=buffers)
    return sizes, plan_layout(sizes)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--svg", help="write the picture of the engine's slab here")
    args = ap.parse_args(argv)
    config = ModelConfig.preset("llama-3.1-8b")
    ref_sizes, ref_plan = slab(config, REFERENCE)
    sizes, plan = slab(config, LLAMA)
    mib = 1 << 20
    dropped = sum(ref_sizes[n] for n in QUANTIZED)
    print(f"REFERENCE:  {len(REFERENCE)} buffers, {ref_plan.slab_bytes / mib:,.1f} MiB")
    print(f"Llama set:  {len(LLAMA)} buffers, {plan.slab_bytes / mib:,.1f} MiB "
          f"({dropped / mib:,.1f} MiB of quantized-path scratch dropped, "
          f"{(plan.slab_bytes - ref_plan.slab_bytes + dropped) / mib:,.1f} MiB of workspaces added)")
    with BufferArena.new(config, *LIMITS.values(), HostBackend(), env={}, buffers=LLAMA) as arena:
        for spec in (SAMPLER, SPLITKV_OUT, SPLITKV_LSE):
            print(f"  {spec.name:16s} {arena.nbytes(spec.name):>12,} bytes at "
                  f"{arena.ptr(spec.name):#x} (ptrs: {getattr(arena.ptrs, spec.name):#x})")
        arena.zero_all()        # one memset: splitkv_lse with the reference's 18
    if args.svg:
        from metrale.picture import render_svg
        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(render_svg(plan, tokens=1, model="llama-3.1-8b (its own buffer set)"))
        print(f"wrote {args.svg}")
    return sizes, plan, ref_sizes, ref_plan


if __name__ == "__main__":
    main()
