"""The bundled model shapes: `ModelConfig.preset` and `ModelConfig.presets`.

Name -> the fields of the shape (every field not given keeps its default).
"""

from ._hf_tables import _PATTERN

_NEMOTRON_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"

_QWEN3_NEXT_80B = dict(
    model_type="qwen3_next", hidden_size=2048, num_hidden_layers=48,
    full_attention_interval=4, intermediate_size=5120, vocab_size=151936,
    num_attention_heads=16, num_key_value_heads=2, head_dim=256, attn_gated=True,
    linear_num_key_heads=16, linear_key_head_dim=128, linear_num_value_heads=32,
    linear_value_head_dim=128, num_experts=512, num_experts_per_tok=10,
    moe_intermediate_size=512, shared_expert_intermediate_size=512)

PRESETS = {
    "qwen3-next-80b": _QWEN3_NEXT_80B,
    "qwen3.8-27b": dict(_QWEN3_NEXT_80B, hidden_size=5120, num_hidden_layers=64,
                        linear_num_value_heads=48),
    "glm-5.3-flash-tp2": dict(
        model_type="glm5_next", hidden_size=4096, num_hidden_layers=48,
        full_attention_interval=4, intermediate_size=12288, vocab_size=154880,
        num_attention_heads=32, num_key_value_heads=32, head_dim=256,
        linear_num_key_heads=32, linear_key_head_dim=128, linear_num_value_heads=32,
        linear_value_head_dim=128, num_experts=288, num_experts_per_tok=8,
        moe_intermediate_size=2048, shared_expert_intermediate_size=2048,
        kv_lora_rank=512, q_lora_rank=1536, hc_mult=4, index_n_heads=32,
        index_head_dim=128, index_topk=2048),
    "deepseek-v4": dict(
        model_type="deepseek_v4", hidden_size=4096, num_hidden_layers=43,
        vocab_size=129280, num_attention_heads=64, num_key_value_heads=1, head_dim=512,
        num_experts=256, num_experts_per_tok=6, moe_intermediate_size=2048,
        shared_expert_intermediate_size=2048, kv_lora_rank=512, q_lora_rank=1024,
        qk_rope_head_dim=64, o_lora_rank=1024, hc_mult=4, index_n_heads=64,
        index_head_dim=128, index_topk=512),
    "nemotron-h": dict(
        model_type="nemotron_h", hidden_size=2688, num_hidden_layers=52,
        layer_types=tuple(_PATTERN[c] for c in _NEMOTRON_PATTERN),
        intermediate_size=1856, vocab_size=131072, num_attention_heads=32,
        num_key_value_heads=2, head_dim=128, num_experts=128, num_experts_per_tok=6,
        moe_intermediate_size=1856, shared_expert_intermediate_size=3712,
        mamba_num_heads=64, mamba_head_dim=64, ssm_state_size=128, n_groups=8),
    "gemma-4-dense": dict(
        model_type="gemma4", hidden_size=5376, num_hidden_layers=4,
        intermediate_size=21504, vocab_size=262144, num_attention_heads=32,
        num_key_value_heads=16, head_dim=256),
    # The shapes engines load most, each equal to from_hf_config of its
    # published config.json (tests/data/hf, sources in tests/data/README.md).
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
        vocab_size=128256, num_attention_heads=32, num_key_value_heads=8, head_dim=128),
    "llama-3.1-70b": dict(
        model_type="llama", hidden_size=8192, num_hidden_layers=80, intermediate_size=28672,
        vocab_size=128256, num_attention_heads=64, num_key_value_heads=8, head_dim=128),
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
        vocab_size=152064, num_attention_heads=28, num_key_value_heads=4, head_dim=128),
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, intermediate_size=6144,
        vocab_size=151936, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
    "mixtral-8x7b": dict(
        model_type="mixtral", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
        vocab_size=32000, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=14336),
    "deepseek-v3": dict(
        model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61,
        intermediate_size=18432, vocab_size=129280, num_attention_heads=128,
        num_key_value_heads=128, head_dim=192, num_experts=256, num_experts_per_tok=8,
        moe_intermediate_size=2048, shared_expert_intermediate_size=2048, kv_lora_rank=512,
        q_lora_rank=1536, qk_rope_head_dim=64, quantization="fp8"),
    "gpt-oss-120b": dict(
        model_type="gpt_oss", hidden_size=2880, num_hidden_layers=36, intermediate_size=2880,
        vocab_size=201088, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        layer_types=("sliding_attention", "full_attention") * 18, num_experts=128,
        num_experts_per_tok=4, moe_intermediate_size=2880, quantization="mxfp4"),
}
