"""MINIMAL, the shipped small engine set (metrale.minimal, docs/quickstart.md):
its sizes for a real model against figures worked out by hand, its file form
shipped beside it and equal to it, and its step inputs usable as they are."""

import pytest

import metrale
from metrale import MINIMAL, BufferArena, BufferSet, BufferSizes, HostBackend, ModelConfig

from helpers import NOENV, run

np = pytest.importorskip("numpy")

# Llama-3.1-8B (its config.json): hidden 4096, 32 heads of 128, 8 KV heads,
# intermediate 14336, vocabulary 128256; limits M=256, max_seq_len 4096,
# kv_block_size 16, max_batch_size 32 -> B = 4096 // 16 + 1 = 257 blocks.
M, BS, B = 256, 32, 257
H, HQ, HKV, D, I, V = 4096, 32, 8, 128, 14336, 128256
HAND = {"input_ids": 8 * M, "num_tokens": 4, "positions": 8 * M, "slot_mapping": 8 * M,
        "context_lens": 4 * BS, "block_tables": 4 * BS * B,
        "hidden": 2 * M * H, "residual": 2 * M * H, "normed": 2 * M * H,
        "qkv": 2 * M * (HQ + 2 * HKV) * D, "attn_out": 2 * M * HQ * D,
        "gate_up": 2 * M * 2 * I, "mlp_act": 2 * M * I,
        "logits": 4 * BS * V, "next_tokens": 8 * BS, "gemm_workspace": 32 << 20}


def test_minimal_sizes_are_the_hand_figures():
    cfg = ModelConfig.preset("llama-3.1-8b")
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (H, I, V)
    sizes = BufferSizes.from_config(cfg, M, 4096, 16, BS, env=NOENV, buffers=MINIMAL)
    assert sizes.as_dict() == HAND and len(MINIMAL) == 16
    assert metrale.minimal.MINIMAL is MINIMAL


def test_the_shipped_file_is_the_set():
    assert BufferSet.load(metrale.minimal.TOML_PATH) == MINIMAL
    assert MINIMAL.groups["step"] == ("input_ids", "num_tokens", "positions", "slot_mapping",
                                      "context_lens", "block_tables")


def test_plan_reads_the_shipped_file(capsys):
    status, out, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--buffers",
                         metrale.minimal.TOML_PATH, "--max-batch-tokens", str(M),
                         "--max-batch-size", str(BS))
    assert status == 0
    assert "buffers: 16 (from" in out and f"{HAND['gate_up']:,}" in out


def test_minimal_steps_as_shipped():
    cfg = ModelConfig.preset("llama-3.1-8b")
    with BufferArena.new(cfg, 16, 4096, 16, 4, HostBackend(), env=NOENV, buffers=MINIMAL) as a:
        with a.step_inputs() as st:
            st.fill([5, 6], positions=[0, 1], slot_mapping=[32, 33], context_lens=[2],
                    block_tables=[[2]])
            st.upload()
        assert np.asarray(a.view("input_ids"))[:3].tolist() == [5, 6, 0]
        assert np.asarray(a.view("block_tables"))[0, :2].tolist() == [2, 0]
        assert np.asarray(a.view("num_tokens")).tolist() == [2]
