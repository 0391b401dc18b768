"""Per-rank sizing for tensor parallelism: ModelConfig.shard and
BufferSizes.from_config(..., tp_size=).  The oracle is a config divided by
hand: the sizes of one rank must equal the sizes of that config at tp_size 1,
through the same formulas.

The glm-5.3-flash-tp2 preset is called a tensor-parallel-2 shape, but it is
not the half of any config under these rules: its vocabulary (154,880, GLM-5's
whole vocabulary) and its expert widths are not halved while its heads are.
So the pairs below are written out here instead."""

import pickle

import pytest

from metrale import BufferSizes, ModelConfig
from metrale.sizes import SizingLimits

P = ModelConfig.preset
LIMITS = [(1, 4096, 16, 32), (8192, 4096, 16, 32), (500, 65536, 64, 160)]

# (config, tp_size, the fields one rank holds, divided by hand)
PAIRS = [
    (P("llama-3.1-70b"), 2, dict(num_attention_heads=32, num_key_value_heads=4,
                                 intermediate_size=14336, vocab_size=64128)),
    # 8 KV heads over 8 ranks: one each
    (P("llama-3.1-70b"), 8, dict(num_attention_heads=8, num_key_value_heads=1,
                                 intermediate_size=3584, vocab_size=16032)),
    # 8 KV heads over 16 ranks: each rank holds one of them, replicated
    (P("llama-3.1-70b"), 16, dict(num_attention_heads=4, num_key_value_heads=1,
                                  intermediate_size=1792, vocab_size=8016)),
    (P("mixtral-8x7b"), 2, dict(num_attention_heads=16, num_key_value_heads=4,
                                intermediate_size=7168, moe_intermediate_size=7168,
                                vocab_size=16000)),
    (P("deepseek-v3"), 8, dict(num_attention_heads=16, num_key_value_heads=16,
                               intermediate_size=2304, moe_intermediate_size=256,
                               shared_expert_intermediate_size=256, vocab_size=16160)),
    (P("qwen3-next-80b"), 2, dict(num_attention_heads=8, num_key_value_heads=1,
                                  intermediate_size=2560, moe_intermediate_size=256,
                                  shared_expert_intermediate_size=256, vocab_size=75968,
                                  linear_num_key_heads=8, linear_num_value_heads=16)),
    # 2 KV heads over 4 ranks: replicated
    (P("qwen3-next-80b"), 4, dict(num_attention_heads=4, num_key_value_heads=1,
                                  intermediate_size=1280, moe_intermediate_size=128,
                                  shared_expert_intermediate_size=128, vocab_size=37984,
                                  linear_num_key_heads=4, linear_num_value_heads=8)),
    (P("nemotron-h"), 2, dict(num_attention_heads=16, num_key_value_heads=1,
                              intermediate_size=928, moe_intermediate_size=928,
                              shared_expert_intermediate_size=1856, vocab_size=65536,
                              mamba_num_heads=32, n_groups=4)),
    (P("gpt-oss-120b"), 4, dict(num_attention_heads=16, num_key_value_heads=2,
                                intermediate_size=720, moe_intermediate_size=720,
                                vocab_size=50272)),
    # MLA, hyper-connections and the indexer stay whole
    (P("deepseek-v4"), 2, dict(num_attention_heads=32, num_key_value_heads=1,
                               moe_intermediate_size=1024, shared_expert_intermediate_size=1024,
                               vocab_size=64640)),
]


@pytest.mark.parametrize("cfg, tp, fields", PAIRS)
def test_rank_sizes_equal_the_divided_config(cfg, tp, fields):
    by_hand = cfg.replace(**fields)
    assert cfg.shard(tp) == by_hand
    for limits in LIMITS:
        rank = BufferSizes.from_config(cfg, *limits, env={}, tp_size=tp)
        assert rank == BufferSizes.from_config(by_hand, *limits, env={})
        assert rank.limits == SizingLimits(*limits, tp)


def test_tp_1_is_the_model():
    cfg = P("deepseek-v3")
    assert cfg.shard(1) is cfg
    assert BufferSizes.from_config(cfg, 64, 4096, 16, 32, env={}, tp_size=1) == \
        BufferSizes.from_config(cfg, 64, 4096, 16, 32, env={})


def test_a_rank_holds_less():
    cfg = P("llama-3.1-70b")
    whole = BufferSizes.from_config(cfg, 4096, 4096, 16, 32, env={})
    half = BufferSizes.from_config(cfg, 4096, 4096, 16, 32, env={}, tp_size=2)
    assert half.qkv_output * 2 == whole.qkv_output
    assert half.logits * 2 == whole.logits
    assert half.hidden_states == whole.hidden_states          # the residual stream is whole


@pytest.mark.parametrize("cfg, tp, field", [
    (P("llama-3.1-8b"), 3, "num_attention_heads"),
    (P("qwen2.5-7b"), 8, "num_attention_heads"),           # 28 heads
    (ModelConfig(num_attention_heads=48, num_key_value_heads=8), 12, "num_key_value_heads"),
    # the vocabulary is padded to a multiple of 64 first (32,001 -> 32,064), which 5 does
    # not divide (tests/test_vocab_padding.py has the rule)
    (ModelConfig(num_attention_heads=5, num_key_value_heads=5, vocab_size=32001), 5,
     "vocab_size"),
    (ModelConfig(num_attention_heads=4, num_key_value_heads=4, intermediate_size=100), 8,
     "num_attention_heads"),
    (ModelConfig(num_attention_heads=8, num_key_value_heads=8, intermediate_size=100), 8,
     "intermediate_size"),
    (ModelConfig(mamba_num_heads=64, n_groups=3), 2, "n_groups"),
])
def test_a_size_that_does_not_divide_is_refused(cfg, tp, field):
    with pytest.raises(ValueError, match=field):
        cfg.shard(tp)
    with pytest.raises(ValueError, match=field):
        BufferSizes.from_config(cfg, 64, 4096, 16, 32, env={}, tp_size=tp)


@pytest.mark.parametrize("tp, exc", [(0, ValueError), (-1, ValueError), (True, TypeError),
                                     ("2", TypeError), (2.0, TypeError)])
def test_tp_size_argument(tp, exc):
    with pytest.raises(exc, match="tp_size"):
        P("llama-3.1-8b").shard(tp)
    with pytest.raises(exc, match="tp_size"):
        BufferSizes.from_config(P("llama-3.1-8b"), 64, 4096, 16, 32, env={}, tp_size=tp)


# -- the limits a BufferSizes was computed for -------------------------------------------

def test_limits_are_recorded_kept_and_pickled():
    s = BufferSizes.from_config(P("llama-3.1-8b"), 512, 8192, 32, 64, env={}, tp_size=4)
    lim = s.limits
    assert lim == SizingLimits(512, 8192, 32, 64, 4)
    assert (lim.max_batch_tokens, lim.max_seq_len, lim.kv_block_size, lim.max_batch_size,
            lim.tp_size) == (512, 8192, 32, 64, 4)
    assert s.replace(logits=256).limits == lim
    back = pickle.loads(pickle.dumps(s))
    assert back == s and back.limits == lim and back.levers() == s.levers()
    assert BufferSizes(**dict(s)).limits is None
    assert BufferSizes(**dict(s)) == s                     # equal sizes, whatever the limits
    with pytest.raises(AttributeError):
        lim.tp_size = 1
