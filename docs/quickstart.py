"""metrale quick start: plan, allocate, use and release the buffers of one
forward pass.  Runs anywhere (host backend); on an NVIDIA GPU pass --cuda.

CI runs this script and checks it with ``mypy --strict``.
"""

from __future__ import annotations

import sys

import numpy as np

import metrale
from metrale import BufferArena, BufferSizes, HostBackend, ModelConfig, ScratchSpaceManager


def main(use_cuda: bool) -> None:
    # 1. The model's shape: a bundled preset, or your checkpoint's config.json
    #    (ModelConfig.from_hf_config("path/to/config.json")).
    config = ModelConfig.preset("qwen3-next-80b")

    # 2. The sizes, before allocating anything: 46 buffers for the serving
    #    limits (max_batch_tokens, max_seq_len, kv_block_size, max_batch_size).
    #    env={} keeps the process environment's METRALE_* levers out of it.
    sizes = BufferSizes.from_config(config, 256, 4096, 16, 32, env={})
    print(f"{len(sizes)} buffers, {sizes.total_bytes() / 2**20:.1f} MiB; logits: {sizes['logits']:,} bytes")

    # 3. One allocation for all of them.  The arena keeps its backend; every
    #    pointer is a plain int, valid until release (the end of the block).
    gpu = metrale.CudaBackend(0) if use_cuda else HostBackend()
    with BufferArena.from_sizes(sizes, gpu) as arena:   # shape and limits from the sizes
        print(arena.summary())
        hidden: int = arena.hidden_states()          # pass this to your kernel
        bound: int = arena.qkv_output_bytes()        # the bound a GEMM checks
        assert hidden != 0 and bound >= 2 * 256 * 16 * 256

        # 4. The per-step zeroing: one memset, or only the live rows.
        arena.zero_all()                             # default stream
        arena.zero_all_rows(tokens=8)                # a decode step of 8 tokens
        arena.zero_prefill_essentials(stream=0)      # or torch/CuPy/cuda.core streams

        # 5. Every buffer by name, and a typed view for numpy / torch / CuPy.
        info = arena.buffers["logits"]
        print(f"logits at {info.ptr:#x}, {info.nbytes:,} bytes, offset {info.offset}, "
              f"{info.dtype}")
        view = arena.view("hidden_states")           # its own type and shape
        assert view.dtype == "bfloat16" and view.shape == (256, config.hidden_size)
        # torch.from_dlpack(view) is a bfloat16 tensor; numpy has no bfloat16,
        # so numpy takes the BF16 bits as uint16.
        if not use_cuda:
            bits = np.asarray(arena.view("hidden_states", "uint16", view.shape))
            bits[0, :4] = 0x3F80                     # 1.0 in bfloat16
            assert int(bits.sum()) == 4 * 0x3F80
            del bits
        del view                                     # views alive at release: BufferError

    # 6. Per-thread host scratch: lock-free, zero-filled, 64-byte aligned.
    scratch = ScratchSpaceManager.for_model(hidden_dim=config.hidden_size, max_threads=4)
    tmp = scratch.get_scratch().get(512, "float32")
    assert tmp is not None and tmp.dtype == np.float32 and not tmp.any()
    scratch.reset_all()                              # at the start of each step
    print(scratch.stats())


if __name__ == "__main__":
    main("--cuda" in sys.argv[1:])
