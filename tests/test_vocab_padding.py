"""Tensor parallelism pads the vocabulary the way vLLM and SGLang do
(docs/tensor-parallel.md, "The vocabulary: padded, then divided"), and the
symbol `Vg` (= `V * tp`) sizes a buffer the ranks' logits are gathered into.

The oracle is the engines' rule, written out here, not read from metrale:

    padded   = ceil(vocab_size / 64) * 64        (vLLM pad_vocab_size, pad_to=64)
    per rank = padded / tp_size                  (vLLM divide(): a whole quotient)

at tp_size > 1; tp_size 1 is the whole model, unpadded.  Each expected size is
computed below from that rule and the documented formulas of `logits`
(2*Lr*V, BF16) and of the test's own FP32 gathered buffer (4*Lr*Vg), with Lr =
min(M, max(160, R + 1)) and R = max(32, max_batch_size) (docs/buffers.md)."""

import glob
import json
import os
import warnings

import pytest

from metrale import (REFERENCE, BufferArena, BufferSet, BufferSizes, BufferSpec, HostBackend,
                     ModelConfig, fit)
from metrale.catalogue import dependencies, explain, symbols


# openai-community/gpt2's published config.json, as the Hub serves it.
GPT2_CONFIG_JSON = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}
GPT2_VOCAB = 50257
PAD_TO = 64                                     # vLLM / SGLang DEFAULT_VOCAB_PADDING_SIZE
LIMITS = [(1, 1024, 16, 32), (8192, 1024, 16, 32), (500, 1024, 64, 160)]


def padded(vocab):
    """vLLM's pad_vocab_size(vocab, 64), written out."""
    return ((vocab + PAD_TO - 1) // PAD_TO) * PAD_TO


def per_rank(vocab, tp):
    """One rank's columns of the LM head: the padded vocabulary divided."""
    if tp == 1:
        return vocab
    p = padded(vocab)
    assert p % tp == 0
    return p // tp


def logits_rows(M, max_batch_size):
    return min(M, max(160, max(32, max_batch_size) + 1))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """GPT-2 read from its published config.json (a file, as an engine reads it)."""
    path = tmp_path_factory.mktemp("gpt2") / "config.json"
    path.write_text(json.dumps(GPT2_CONFIG_JSON))
    cfg = ModelConfig.from_hf_config(str(path), strict=True)
    assert (cfg.vocab_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.hidden_size) == (50257, 12, 12, 3072, 768)
    return cfg


def test_the_rule_written_out():
    # 50,257 = 785 * 64 + 17: padded to 786 * 64.
    assert padded(GPT2_VOCAB) == 50304 == 786 * 64
    assert per_rank(GPT2_VOCAB, 2) == 25152 and per_rank(GPT2_VOCAB, 4) == 12576
    assert GPT2_VOCAB % 2 and GPT2_VOCAB % 4           # the raw split leaves a remainder


@pytest.mark.parametrize("tp", [2, 4])
def test_gpt2_is_sized_not_refused(gpt2, tp):
    rank = gpt2.shard(tp)
    assert rank.vocab_size == per_rank(GPT2_VOCAB, tp)
    # every other field divided as before: heads and MLP width by tp
    by_hand = gpt2.replace(num_attention_heads=12 // tp, num_key_value_heads=12 // tp,
                           intermediate_size=3072 // tp, vocab_size=per_rank(GPT2_VOCAB, tp))
    assert rank == by_hand
    for limits in LIMITS:
        M, _, _, mbs = limits
        s = BufferSizes.from_config(gpt2, *limits, env={}, tp_size=tp)
        assert s.logits == 2 * logits_rows(M, mbs) * per_rank(GPT2_VOCAB, tp)
        assert s == BufferSizes.from_config(by_hand, *limits, env={})
        assert s.limits.tp_size == tp


def test_gpt2_whole_model_is_not_padded(gpt2):
    assert gpt2.shard(1) is gpt2
    s = BufferSizes.from_config(gpt2, 8192, 1024, 16, 32, env={})
    assert s.logits == 2 * 160 * GPT2_VOCAB


def test_gpt2_arena_per_rank(gpt2):
    with BufferArena.new(gpt2, 8192, 1024, 16, 32, HostBackend(), env={}, tp_size=2) as arena:
        assert arena.tp_size() == 2
        assert arena.nbytes("logits") == 2 * 160 * 25152


@pytest.mark.parametrize("vocab, heads, tp", [
    (32001, 5, 5),      # padded 32,064 = 5 * 6,412 + 4
    (50001, 3, 3),      # 50,001 = 3 * 16,667, but padded 50,048 is not a multiple of 3
    (50257, 6, 6),      # padded 50,304 = 6 * 8,384: sized
])
def test_tp_must_divide_the_padded_vocabulary(vocab, heads, tp):
    cfg = ModelConfig(num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab)
    if padded(vocab) % tp:
        with pytest.raises(ValueError, match=rf"vocab_size = {vocab} .*{padded(vocab)}"):
            cfg.shard(tp)
        with pytest.raises(ValueError, match="vocab_size"):
            BufferSizes.from_config(cfg, 64, 1024, 16, 32, env={}, tp_size=tp)
    else:
        assert cfg.shard(tp).vocab_size == padded(vocab) // tp


def _real_configs():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        files = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "data", "hf", "*.json")))
        return [ModelConfig.from_hf_config(f) for f in files] + [
            ModelConfig.preset(n) for n in ModelConfig.presets()]


def test_a_vocabulary_that_divides_is_divided_as_before():
    # Every published config and preset here has a multiple of 64: the padding is a
    # no-op and the share is the plain quotient, as it was before padding.
    checked = 0
    for cfg in _real_configs():
        for tp in (2, 4, 8, 16):
            if cfg.vocab_size % tp:
                continue
            try:
                rank = cfg.shard(tp)
            except ValueError as e:
                assert "vocab_size" not in str(e)       # refused for another field
                continue
            assert rank.vocab_size == cfg.vocab_size // tp
            checked += 1
    assert checked > 50


# -- Vg: the whole vocabulary, for a buffer the shares are gathered into --------------------

GATHERED = BufferSpec("gathered_logits", "float32", ["Lr", "Vg"])
ENGINE = REFERENCE.with_(GATHERED)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gathered_logits_hold_the_whole_padded_vocabulary(gpt2, tp):
    whole = GPT2_VOCAB if tp == 1 else padded(GPT2_VOCAB)
    for limits in LIMITS:
        M, _, _, mbs = limits
        s = BufferSizes.from_config(gpt2, *limits, env={}, tp_size=tp, buffers=ENGINE)
        assert s["gathered_logits"] == 4 * logits_rows(M, mbs) * whole
        assert s.logits == 2 * logits_rows(M, mbs) * per_rank(GPT2_VOCAB, tp)
    with BufferArena.new(gpt2, 8192, 1024, 16, 32, HostBackend(), env={}, tp_size=tp,
                         buffers=ENGINE) as arena:
        assert arena.nbytes("gathered_logits") == 4 * 160 * whole
        view = arena.view("gathered_logits")
        assert view.shape == (160, whole)
        del view                                # the arena releases with no view alive


def test_vg_is_the_vocabulary_where_it_divides():
    cfg = ModelConfig.preset("llama-3.1-70b")               # 128,256 = 2,004 * 64
    sizes = [BufferSizes.from_config(cfg, 8192, 4096, 16, 32, env={}, tp_size=tp,
                                     buffers=ENGINE)["gathered_logits"] for tp in (1, 2, 8)]
    assert sizes == [4 * 160 * 128256] * 3


def test_tp_and_vg_in_formulas_and_files(gpt2):
    staged = BufferSpec("per_rank_flags", "int32", size="256 * tp_size")
    by_formula = BufferSpec("gathered_f32", size="4*Lr*vocab_size*tp")
    engine = REFERENCE.with_([GATHERED, staged, by_formula])
    s = BufferSizes.from_config(gpt2, 8192, 1024, 16, 32, env={}, tp_size=4, buffers=engine)
    assert s["per_rank_flags"] == 256 * 4
    assert s["gathered_f32"] == s["gathered_logits"] == 4 * 160 * 50304
    data = {"base": "reference",
            "buffer": [{"name": "gathered_logits", "dtype": "float32", "shape": ["Lr", "Vg"]}]}
    assert BufferSet.from_dict(data) == ENGINE
    d = dependencies("gathered_logits", buffers=ENGINE)
    assert "vocab_size" in d.fields and "tp_size" in d.limits
    # the symbols of the whole model: tp is 1, Vg the vocabulary
    v = symbols(gpt2, 8192, 1024, 16, 32, env={})
    assert (v["tp"], v["V"], v["Vg"]) == (1, GPT2_VOCAB, GPT2_VOCAB)


def test_fit_sizes_the_gathered_buffer_per_rank(gpt2):
    budget = 1 << 30
    r = fit(gpt2, budget, 1024, 16, 32, tp_size=2, env={}, buffers=ENGINE)
    s = BufferSizes.from_config(gpt2, r.max_batch_tokens, 1024, 16, 32, env={}, tp_size=2,
                                buffers=ENGINE)
    assert r.arena_bytes <= budget < r.next_arena_bytes
    assert s["gathered_logits"] == 4 * logits_rows(r.max_batch_tokens, 32) * padded(GPT2_VOCAB)


def test_explain_evaluates_vg_for_the_rank(gpt2):
    s = BufferSizes.from_config(gpt2, 8192, 1024, 16, 32, env={}, tp_size=2, buffers=ENGINE)
    text = explain("gathered_logits", s, s.config, max_seq_len=1024, env={})
    assert "Vg = 25152*2 = 50,304" in text
    assert f"4*160*50304 = {4 * 160 * 50304:,} bytes" in text
    assert f"in sizes:     {s['gathered_logits']:,} bytes" in text
