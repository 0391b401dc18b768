import os
from typing import Any, Iterable

__all__ = [
    'ModelConfig',
]

class ModelConfig:
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attn_gated: bool
    full_attention_interval: int
    layer_types: tuple[str, ...]
    linear_num_key_heads: int
    linear_key_head_dim: int
    linear_num_value_heads: int
    linear_value_head_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    zero_expert_num: int
    moe_latent_size: int
    mamba_num_heads: int
    mamba_head_dim: int
    ssm_state_size: int
    n_groups: int
    kv_lora_rank: int
    q_lora_rank: int
    qk_rope_head_dim: int
    o_groups: int
    o_lora_rank: int
    hc_mult: int
    hc_lowrank: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    index_compress_ratio: int
    adapter_max_rank: int
    mrope_interleaved: bool
    model_type: str
    def __init__(self, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...
    def replace(self, **changes: Any) -> ModelConfig: ...
    def ssm_qkvz_size(self) -> int: ...
    def ssm_ba_size(self) -> int: ...
    def mamba2_d_inner(self) -> int: ...
    def mamba2_d_xbc(self) -> int: ...
    def mamba2_in_proj_size(self) -> int: ...
    def moe_input_size(self) -> int: ...
    def num_ssm_layers(self) -> int: ...
    @staticmethod
    def presets() -> tuple[str, ...]: ...
    @staticmethod
    def preset(name: str) -> ModelConfig: ...
    @staticmethod
    def from_hf_config(path_or_dict: str | os.PathLike[str] | dict[str, Any]) -> ModelConfig: ...

FIELDS: tuple[str, ...]
