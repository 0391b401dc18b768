"""The fields of ModelConfig: their names, documented order and defaults.

Below both `metrale.config` (the value) and `metrale._sizing._hf` (the Hugging Face
``config.json`` mapping, which reads a key for each field).
"""

# The documented field order: the dense shape and attention, then the GDN,
# MoE, Mamba-2, MLA, grouped-O, hyper-connection, QSA indexer and LoRA fields.
_INT_FIELDS = (
    "hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim",
    "full_attention_interval",
    "linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
    "linear_value_head_dim", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "shared_expert_intermediate_size", "zero_expert_num",
    "moe_latent_size", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
    "n_groups", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "o_groups",
    "o_lora_rank", "hc_mult", "hc_lowrank", "index_n_heads", "index_head_dim",
    "index_topk", "index_compress_ratio", "adapter_max_rank",
)
_BOOL_FIELDS = ("attn_gated", "mrope_interleaved")
FIELDS = _INT_FIELDS[:7] + ("attn_gated",) + _INT_FIELDS[7:8] + ("layer_types",) + \
    _INT_FIELDS[8:] + ("mrope_interleaved", "model_type", "quantization")

_DEFAULTS = dict.fromkeys(_INT_FIELDS, 0)
_DEFAULTS.update(num_experts_per_tok=1, attn_gated=False, mrope_interleaved=False,
                 model_type="", layer_types=(), quantization="")
