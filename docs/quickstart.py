"""metrale quick start: declare your buffers, fit them in a budget, build the
arena, step, sleep and wake, release.  Runs anywhere (host backend); on an
NVIDIA GPU pass --cuda.

CI runs this script and checks it with ``mypy --strict``.
"""

from __future__ import annotations

import sys

import numpy as np

import metrale
from metrale import MINIMAL, BufferArena, BufferSpec, HostBackend, ModelConfig, ScratchSpaceManager


def main(use_cuda: bool) -> None:
    # 1. The model's shape: a bundled preset, or your checkpoint's config.json
    #    (ModelConfig.from_hf_config("path/to/config.json")).
    config = ModelConfig.preset("llama-3.1-8b")

    # 2. Your buffers, declared as data: MINIMAL (a small engine's set, also
    #    shipped as a buffers file: metrale.minimal.TOML_PATH) plus one of yours.
    engine = MINIMAL.with_(BufferSpec("topk_ids", "int32", ["M", 8]))

    # 3. The largest max_batch_tokens whose arena fits the budget, exactly,
    #    without allocating (limits after the budget: max_seq_len,
    #    kv_block_size, max_batch_size).  On a GPU: what the weights leave.
    gpu = metrale.CudaBackend(0) if use_cuda else HostBackend()
    fit = metrale.fit(config, "96MiB", 4096, 16, 32, buffers=engine, reserve=True, gpu=gpu,
                      env={})
    print(fit)
    m = fit.max_batch_tokens

    # 4. One reservation, every buffer at an address that never moves.
    with BufferArena.new(config, m, 4096, 16, 32, gpu, buffers=engine, env={},
                         reserve=(m, 4096, 16, 32)) as arena:
        assert arena.committed_bytes() == fit.arena_bytes
        print(arena.summary())
        qkv: int = arena.ptr("qkv")                  # pass this to your kernel
        assert qkv == arena.ptrs.qkv and arena.nbytes("qkv") == 2 * m * (32 + 2 * 8) * 128

        # 5. Each step: fill the pinned staging, one upload (one copy, then
        #    the zeroing for the step's token count, read on the device).
        with arena.step_inputs() as st:
            for n in (5, 6, 7):
                st.wait()                            # the previous copy has run
                st.fill(np.arange(n), positions=np.arange(n), slot_mapping=np.arange(n) + 16,
                        context_lens=[n], block_tables=[[1]])
                st.upload()                          # default stream; or torch/CuPy streams
            st.wait()

        # 6. Sleep between bursts: no device memory held, the same addresses after.
        arena.sleep(keep=["block_tables"])
        assert arena.committed_bytes() == 0
        arena.wake()
        assert arena.ptrs.qkv == qkv

        # 7. A typed view for numpy / torch / CuPy: the spec's type and shape.
        view = arena.view("qkv")
        assert view.dtype == "bfloat16" and view.shape == (m, (32 + 2 * 8) * 128)
        # torch.from_dlpack(view) is a bfloat16 tensor; numpy has no bfloat16,
        # so numpy takes the BF16 bits as uint16 (same shape).
        if not use_cuda:
            bits = np.asarray(arena.view("qkv", "uint16"))
            bits[0, :4] = 0x3F80                     # 1.0 in bfloat16
            assert int(bits[0, :4].sum()) == 4 * 0x3F80
            del bits
        del view                                     # views alive at release: BufferError

    # 8. Per-thread host scratch: lock-free, zero-filled, 64-byte aligned.
    scratch = ScratchSpaceManager.for_model(hidden_dim=config.hidden_size, max_threads=4)
    tmp = scratch.get_scratch().get(512, "float32")
    assert tmp is not None and tmp.dtype == np.float32 and not tmp.any()
    scratch.reset_all()                              # at the start of each step
    print(scratch.stats())


if __name__ == "__main__":
    main("--cuda" in sys.argv[1:])
